"""Cold start: a fresh process that imports a store and serves its first call.

Where processes are short-lived (serverless functions, job workers, CLIs, test
suites) the first call is the only call. Each row below is a program run in a fresh
Python process, ``--runs`` times (10 by default); in each round the programs run in a
shuffled order, so machine noise hits them alike. The wall time is the whole process
(spawn to exit, the interpreter's own start included), the CPU time the child's (user +
system, from ``wait4``); the child also reports its import and its first call apart.

* imports: ``import tenxstore`` and what a program that opens a store imports,
  against the floor ``import sqlalchemy.ext.asyncio, asyncpg`` (tenxstore's own
  dependencies) and LangGraph's savers;
* a first read + write on an existing database (a schema at head: the deployment
  migrated it), on PostgreSQL and SQLite, each on a thread of its own:

  - ``floor``: the raw driver (asyncpg / aiosqlite) connects, reads the thread's
    newest row and inserts one, and closes;
  - ``langgraph``: LangGraph's ``AsyncPostgresSaver`` / ``AsyncSqliteSaver``
    (``from_conn_string``): ``aget_tuple`` then ``aput`` of an empty checkpoint;
  - ``tenx-langgraph``: ``TenxCheckpointSaver`` on a ``CheckpointRepository``, the
    same ``aget_tuple`` + ``aput``;
  - ``tenx``: ``CheckpointRepository`` alone: ``aget_state`` + ``aput_checkpoint``;

* ``tenxstore --help``, the operator CLI, against ``python -c pass``.

    python benchmarks/cold_start.py                      # the table into docs/benchmarks.md
    python benchmarks/cold_start.py --runs 3 --out -     # a quick look, printed

Needs PostgreSQL (TENXSTORE_BENCH_PG_URL, the local service by default) and
``pip install -e ".[bench,cli]"``.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import asyncpg
from workload import PG_URL, ROOT, drop_schema, replace_section

# Schemas of this run's own (two runs at once never share one)
SCHEMA = f"cold_start_{uuid.uuid4().hex[:8]}"
LG_SCHEMA = f"{SCHEMA}_lg"
CLI = str(Path(sys.executable).with_name("tenxstore"))

# Every child starts its clock first, imports, then serves the call: T1 - T0 is its
# import, T2 - T1 its first call.
HEAD = "import time as _t\nT0 = _t.perf_counter()\n"
TAIL = (
    "\nT2 = _t.perf_counter()\nimport json as _j\n"
    "print(_j.dumps({'import': T1 - T0, 'first': T2 - T1}))\n"
)

IMPORTS = {
    "floor": "import sqlalchemy.ext.asyncio, asyncpg",
    "import tenxstore": "import tenxstore",
    "tenx": "from tenxstore import CheckpointRepository",
    "tenx-langgraph": "from tenxstore import CheckpointRepository\n"
    "from tenxstore.langgraph import TenxCheckpointSaver",
    "langgraph-pg": "from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver",
    "langgraph-both": "import langgraph.checkpoint.postgres.aio, langgraph.checkpoint.sqlite.aio",
}

FLOOR_PG = """
import asyncio, asyncpg
T1 = _t.perf_counter()
async def main():
    con = await asyncpg.connect(URL)
    await con.fetchrow(
        f"SELECT data FROM {SCHEMA}.floor_states WHERE thread_id = $1 "
        "ORDER BY version DESC LIMIT 1", TID)
    await con.execute(
        f"INSERT INTO {SCHEMA}.floor_states (thread_id, version, data) VALUES ($1, 1, $2)",
        TID, b'{"turn": 1}')
    await con.close()
asyncio.run(main())
"""

FLOOR_SQLITE = """
import asyncio, aiosqlite
T1 = _t.perf_counter()
async def main():
    async with aiosqlite.connect(PATH) as db:
        async with db.execute(
            "SELECT data FROM floor_states WHERE thread_id = ? ORDER BY version DESC LIMIT 1",
            (TID,)) as rows:
            await rows.fetchone()
        await db.execute(
            "INSERT INTO floor_states (thread_id, version, data) VALUES (?, 1, ?)",
            (TID, b'{"turn": 1}'))
        await db.commit()
asyncio.run(main())
"""

LANGGRAPH = """
import asyncio
from langgraph.checkpoint.{module}.aio import {saver}
from langgraph.checkpoint.base import empty_checkpoint
T1 = _t.perf_counter()
async def main():
    async with {saver}.from_conn_string(URL) as saver:
        config = {{"configurable": {{"thread_id": TID, "checkpoint_ns": ""}}}}
        await saver.aget_tuple(config)
        await saver.aput(config, empty_checkpoint(), {{"source": "input", "step": -1}}, {{}})
asyncio.run(main())
"""

TENX_LANGGRAPH = """
import asyncio
from tenxstore import CheckpointRepository
from tenxstore.langgraph import TenxCheckpointSaver
from langgraph.checkpoint.base import empty_checkpoint
T1 = _t.perf_counter()
async def main():
    async with CheckpointRepository(URL, schema=SCHEMA) as cp:
        saver = TenxCheckpointSaver(cp)
        config = {"configurable": {"thread_id": TID, "checkpoint_ns": "", "user_id": "u"}}
        await saver.aget_tuple(config)
        await saver.aput(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
asyncio.run(main())
"""

TENX = """
import asyncio
from tenxstore import CheckpointRepository
T1 = _t.perf_counter()
async def main():
    async with CheckpointRepository(URL, schema=SCHEMA) as cp:
        config = {"thread_id": TID, "user_id": "u"}
        await cp.aget_state(config)
        await cp.aput_checkpoint(config, {"turn": 1}, [{"role": "user", "content": "hi"}])
asyncio.run(main())
"""


@dataclass
class Program:
    """One program of the benchmark, run in a fresh process each time."""

    group: str
    name: str
    source: str  # the body, after HEAD; TID is set per run
    values: dict[str, str | None] = field(default_factory=dict)
    argv: list[str] | None = None  # a command instead of a Python program
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    imports: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)

    def command(self) -> list[str]:
        """The command of one run (a thread id of its own)."""
        if self.argv is not None:
            return self.argv
        values = {**self.values, "TID": f"cold-{uuid.uuid4().hex}"}
        preamble = "".join(f"{key} = {value!r}\n" for key, value in values.items())
        return [sys.executable, "-c", HEAD + preamble + self.source + TAIL]

    def run(self) -> None:
        """One fresh process: its wall time, its CPU time and what it reported."""
        started = time.perf_counter()
        child = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert child.stdout is not None and child.stderr is not None
        out, err = child.stdout.read(), child.stderr.read()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        self.walls.append(time.perf_counter() - started)
        self.cpus.append(usage.ru_utime + usage.ru_stime)
        if child.returncode != 0:
            raise SystemExit(f"{self.group}/{self.name} failed:\n{err.decode()}")
        if self.group != "import" and self.argv is None:
            reported = json.loads(out.decode().strip().splitlines()[-1])
            self.imports.append(reported["import"])
            self.firsts.append(reported["first"])


def programs(folder: Path) -> list[Program]:
    """Every program, with the URLs of the databases set up for it."""
    pg_lg = f"{PG_URL}?options=-csearch_path%3D{LG_SCHEMA}"
    path = str(folder / "tenx.db")
    made = [
        Program("import", name, source + "\nT1 = _t.perf_counter()\n")
        for name, source in IMPORTS.items()
    ]
    # What a PostgreSQL program has loaded once its repository exists (asyncpg and the
    # dialect come with the URL): the same work as the floor's import, no I/O yet.
    made.insert(
        3,
        Program(
            "import",
            "tenx, opened",
            "from tenxstore import CheckpointRepository\n"
            "CheckpointRepository(URL, schema=SCHEMA)\nT1 = _t.perf_counter()\n",
            {"URL": PG_URL, "SCHEMA": SCHEMA},
        ),
    )
    made += [
        Program("PostgreSQL", "floor", FLOOR_PG, {"URL": PG_URL, "SCHEMA": SCHEMA}),
        Program(
            "PostgreSQL",
            "langgraph",
            LANGGRAPH.format(module="postgres", saver="AsyncPostgresSaver"),
            {"URL": pg_lg},
        ),
        Program("PostgreSQL", "tenx-langgraph", TENX_LANGGRAPH, {"URL": PG_URL, "SCHEMA": SCHEMA}),
        Program("PostgreSQL", "tenx", TENX, {"URL": PG_URL, "SCHEMA": SCHEMA}),
        Program("SQLite", "floor", FLOOR_SQLITE, {"PATH": str(folder / "floor.db")}),
        Program(
            "SQLite",
            "langgraph",
            LANGGRAPH.format(module="sqlite", saver="AsyncSqliteSaver"),
            {"URL": str(folder / "langgraph.db")},
        ),
        Program(
            "SQLite", "tenx-langgraph", TENX_LANGGRAPH, {"URL": f"sqlite:///{path}", "SCHEMA": None}
        ),
        Program("SQLite", "tenx", TENX, {"URL": f"sqlite:///{path}", "SCHEMA": None}),
        Program("CLI", "python -c pass", "", argv=[sys.executable, "-c", "pass"]),
        Program("CLI", "tenxstore --help", "", argv=[CLI, "--help"]),
    ]
    return made


async def set_up(folder: Path) -> None:
    """The databases at head, as a deployment leaves them: tenxstore's migrated,
    LangGraph's set up, the floor's table made."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from tenxstore import CheckpointRepository

    for schema in (SCHEMA, LG_SCHEMA):
        await drop_schema(PG_URL, schema)
    con = await asyncpg.connect(PG_URL)
    try:
        await con.execute(f"CREATE SCHEMA {SCHEMA}; CREATE SCHEMA {LG_SCHEMA}")
        await con.execute(
            f"CREATE TABLE {SCHEMA}.floor_states (thread_id text, version bigint, data bytea,"
            " PRIMARY KEY (thread_id, version))"
        )
    finally:
        await con.close()
    for url, schema in ((PG_URL, SCHEMA), (f"sqlite:///{folder / 'tenx.db'}", None)):
        async with CheckpointRepository(url, schema=schema) as cp:
            await cp.asetup()
    async with AsyncPostgresSaver.from_conn_string(
        f"{PG_URL}?options=-csearch_path%3D{LG_SCHEMA}"
    ) as saver:
        await saver.setup()
    async with AsyncSqliteSaver.from_conn_string(str(folder / "langgraph.db")) as lite:
        await lite.setup()
    import sqlite3

    with sqlite3.connect(folder / "floor.db") as db:
        db.execute(
            "CREATE TABLE floor_states (thread_id TEXT, version INTEGER, data BLOB,"
            " PRIMARY KEY (thread_id, version))"
        )


def ms(values: list[float]) -> str:
    """Median (min-max) in milliseconds."""
    if not values or not any(values):
        return ""
    low, high = min(values) * 1000, max(values) * 1000
    return f"{statistics.median(values) * 1000:.0f} ({low:.0f}-{high:.0f})"


# The row each row is measured against, by group.
AGAINST = {
    "import": {
        "import tenxstore": "floor",
        "tenx": "floor",
        "tenx, opened": "floor",
        "tenx-langgraph": "langgraph-pg",
    },
    "PostgreSQL": {"tenx-langgraph": "langgraph", "tenx": "langgraph"},
    "SQLite": {"tenx-langgraph": "langgraph", "tenx": "langgraph"},
}


# The targets: (what, the row, the row it is held to or None, the bound).
TARGETS = [
    ("`import tenxstore` / floor import", ("import", "import tenxstore"), ("import", "floor"), 1.2),
    (
        "a program's import (`CheckpointRepository`) / floor import",
        ("import", "tenx"),
        ("import", "floor"),
        1.2,
    ),
    (
        "a PostgreSQL program's import and repository (asyncpg loaded) / floor import",
        ("import", "tenx, opened"),
        ("import", "floor"),
        1.2,
    ),
    (
        "`TenxCheckpointSaver` import / `AsyncPostgresSaver` import",
        ("import", "tenx-langgraph"),
        ("import", "langgraph-pg"),
        1.0,
    ),
    (
        "PostgreSQL: process to first write, saver / `AsyncPostgresSaver`",
        ("PostgreSQL", "tenx-langgraph"),
        ("PostgreSQL", "langgraph"),
        1.0,
    ),
    (
        "PostgreSQL: process to first write, repository / `AsyncPostgresSaver`",
        ("PostgreSQL", "tenx"),
        ("PostgreSQL", "langgraph"),
        1.0,
    ),
    (
        "SQLite: process to first write, saver / `AsyncSqliteSaver`",
        ("SQLite", "tenx-langgraph"),
        ("SQLite", "langgraph"),
        1.0,
    ),
    (
        "SQLite: process to first write, repository / `AsyncSqliteSaver`",
        ("SQLite", "tenx"),
        ("SQLite", "langgraph"),
        1.0,
    ),
    ("`tenxstore --help`, seconds", ("CLI", "tenxstore --help"), None, 0.6),
]


def targets(by_name: dict[tuple[str, str], Program]) -> list[str]:
    """The targets table: each ratio of medians (or seconds), its bound, met or not."""
    lines = ["| target | measured | bound | met |", "|---|---|---|---|"]
    for what, row, against, bound in TARGETS:
        if row not in by_name or (against is not None and against not in by_name):
            continue
        value = statistics.median(by_name[row].walls)
        if against is not None:
            value /= statistics.median(by_name[against].walls)
        met = "yes" if value <= bound else "no"
        lines.append(f"| {what} | {value:.2f} | <= {bound} | {met} |")
    return lines


def report(made: list[Program], runs: int) -> str:
    """The markdown tables of the runs."""
    lines = [
        "| group | program | process wall, ms: median (min-max) | CPU, ms | import, ms "
        "| first call, ms | wall ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    by_name = {(p.group, p.name): p for p in made}
    for p in made:
        against = AGAINST.get(p.group, {}).get(p.name)
        ratio = ""
        if (p.group, against) in by_name:
            base = by_name[(p.group, against)]
            value = statistics.median(p.walls) / statistics.median(base.walls)
            ratio = f"{value:.2f}x {against}"
        lines.append(
            f"| {p.group} | {p.name} | {ms(p.walls)} | {statistics.median(p.cpus) * 1000:.0f} "
            f"| {ms(p.imports)} | {ms(p.firsts)} | {ratio} |"
        )
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return (
        "## Cold start: a fresh process to its first call\n\n"
        f"`python benchmarks/cold_start.py --runs {runs}` ({when}, Python "
        f"{platform.python_version()}, {os.cpu_count()} cores; PostgreSQL on this machine). "
        "Each program in a fresh process, the programs shuffled in each round; the wall "
        "time is spawn to exit (the interpreter's own start included), the CPU time the "
        "child's; import and first call as the child timed them. The first call is a "
        "read and a write on a thread of its own, on a database already at head.\n\n"
        "Rows: `floor` is the raw driver (asyncpg / aiosqlite: connect, read the "
        "thread's newest row, insert one); `langgraph` LangGraph's `AsyncPostgresSaver` / "
        "`AsyncSqliteSaver` (`aget_tuple` + `aput`); `tenx-langgraph` "
        "`TenxCheckpointSaver` on a `CheckpointRepository` doing the same; `tenx` the "
        "repository alone (`aget_state` + `aput_checkpoint`). In the import group, "
        "`floor` is `import sqlalchemy.ext.asyncio, asyncpg`, `tenx` a program's "
        "`from tenxstore import CheckpointRepository`, and `tenx, opened` that and "
        "`CheckpointRepository(url)` on PostgreSQL (no I/O: asyncpg and the dialect "
        "loaded, as the floor loads asyncpg).\n\n"
        "Where the time goes: the import floor of a store on SQLAlchemy (SQLAlchemy and "
        "asyncpg) is itself about LangGraph's PostgreSQL saver's whole import (psycopg "
        "and LangGraph's base), and a LangGraph program imports both SQLAlchemy and "
        "LangGraph's base (LangChain's core); tenxstore's own share is the `tenx` import "
        "row's excess over the floor and its first call: SQLAlchemy's set-up of its "
        "first connection (the dialect reads the server's settings), the statements the "
        "call compiles, and a new thread's first write, which takes the locked path.\n\n"
        + "\n".join(lines)
        + "\n\nTargets (ratios of the medians of process wall time):\n\n"
        + "\n".join(targets(by_name))
        + "\n"
    )


def main() -> None:
    """Run the programs and write the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per program")
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument(
        "--groups", default="", help="only these groups, comma-separated (import,SQLite...)"
    )
    parser.add_argument(
        "--out",
        default=str(ROOT / "docs" / "benchmarks.md"),
        help="the document whose cold-start section is replaced ('-': print it)",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    # tenxstore's bytecode, as an installed wheel has it (pip compiles at install, as it
    # did the other packages here); a checkout run with PYTHONDONTWRITEBYTECODE would
    # otherwise compile every module of tenxstore in every process.
    compileall.compile_dir(ROOT / "tenxstore", quiet=1)
    with tempfile.TemporaryDirectory(prefix="cold-start-") as folder:
        asyncio.run(set_up(Path(folder)))
        made = [
            p
            for p in programs(Path(folder))
            if not args.groups or p.group in args.groups.split(",")
        ]
        try:
            for _ in range(args.runs):
                order = list(made)
                rng.shuffle(order)
                for program in order:
                    program.run()
        finally:
            for schema in (SCHEMA, LG_SCHEMA):
                asyncio.run(drop_schema(PG_URL, schema))
    text = report(made, args.runs)
    if args.out == "-":
        print(text)
    else:
        replace_section(Path(args.out), "cold-start", text)
        print(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
