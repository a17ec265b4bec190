"""A LangGraph chat graph on every saver, side by side (the workload of issue #16).

A real two-node ``StateGraph``: each turn is one ``ainvoke`` with one ``HumanMessage``
of 200 random characters; node ``human`` checks the turn's input (a guard, writing
nothing) and node ``ai`` appends one ``AIMessage`` of 200 characters, so a thread
grows by one human and one AI message a turn. Two variants of the state:

* ``plain``: ``messages: Annotated[list, add_messages]``;
* ``delta``: ``messages: Annotated[list, DeltaChannel(add_messages_batched)]``
  (LangGraph's beta channel: writes stored once, a snapshot every 100 updates), with
  a batching-invariant reducer built on ``add_messages``.

Savers, each with its own storage and one thread per variant, every one as users get
it (its defaults):

* ``langgraph-pg``: LangGraph's ``AsyncPostgresSaver.from_conn_string`` (its own
  schema, through ``options=-csearch_path``);
* ``tenx-pg``: ``TenxCheckpointSaver`` on ``PgCheckpointer`` (its own schema; Redis
  is the preset's cache, which LangGraph's calls do not use);
* ``langgraph-sqlite``: LangGraph's ``AsyncSqliteSaver`` on a file (needs
  ``pip install langgraph-checkpoint-sqlite``; skipped, and said so, without it);
* ``tenx-sqlite``: ``TenxCheckpointSaver`` on ``SqliteCheckpointer`` (a file);
* ``memory``: LangGraph's ``InMemorySaver``, a reference without storage (the graph
  and LangGraph's serde alone).

All of them run in one process, interleaved turn by turn, the order shuffled every
turn (machine noise hits them alike). Per turn: wall time and this process's CPU
time of the ``ainvoke``. One process holds every saver's graphs and the memory saver's
every checkpoint (a heap that grows with the square of the turns), and Python's full
collection walks all of it — 120-150 ms, charged to whichever saver's allocation
happens to set it off (seen as such spikes on both SQLite savers, and gone with the
collector off). So after every turn, outside the timings, the turn's garbage is
collected and what is left frozen (``gc.freeze``): a collection inside a turn then
walks only what that turn made, as in a process of one saver. ``--gc as-is`` keeps
Python's own schedule. Reported per saver and variant: p50 and mean of the last 10
turns, the growth from turn 10 (mean of turns 6-15) to the end, bytes stored (the
rows of every table the saver uses: ``sum(pg_column_size(t.*))`` on PostgreSQL,
dbstat's payload on SQLite) and on disk (``pg_total_relation_size`` of its tables
with indexes and TOAST / the file and its WAL, as the run left them, and less what
the empty schema occupies), the ratios #16's targets ask for, what each saver adds
to the graph's own turn (its turn less the memory saver's), and the floor of the
growth: LangGraph's serde loading the whole message list.

    python benchmarks/langgraph_chat.py                       # T=200, both variants
    python benchmarks/langgraph_chat.py --turns 50 --variants plain --plot /tmp/lg.png
    python benchmarks/langgraph_chat.py --quick               # 5 turns, a smoke test
    python benchmarks/langgraph_chat.py --profile tenx-pg/plain  # cProfile of late turns

Needs PostgreSQL and Redis (TENXSTORE_BENCH_PG_URL / TENXSTORE_BENCH_REDIS_URL or
``--url``, the local services by default) and ``pip install -e ".[bench]"``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib
import importlib.util
import io
import json
import os
import platform
import pstats
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, TypedDict

import asyncpg
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage
from langchain_core.runnables import RunnableConfig
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from redis.asyncio import Redis
from workload import PG_URL, REDIS_URL, drop_schema, make_schema, words

from tenxstore import PgCheckpointer, SqliteCheckpointer
from tenxstore.langgraph import TenxCheckpointSaver

SAVERS = ("langgraph-pg", "tenx-pg", "langgraph-sqlite", "tenx-sqlite", "memory")
VARIANTS = ("plain", "delta")
BOOKKEEPING = ("alembic_version", "checkpoint_migrations")  # not the thread's bytes
HAS_LG_SQLITE = importlib.util.find_spec("langgraph.checkpoint.sqlite") is not None
THREAD = "chat"
USER = "u"


# -- the graph ---------------------------------------------------------------------------


def add_messages_batched(state: list[Any], writes: Sequence[Any]) -> list[Any]:
    """``add_messages`` over a batch of writes, for ``DeltaChannel``: the same result as
    folding ``add_messages`` write by write (a left fold, so batching-invariant), in one
    call per run of writes without a ``RemoveMessage`` (merging such a run at once
    equals applying its writes one after another: a later id replaces an earlier one
    in place, a new id is appended)."""
    merged: Any = state
    run: list[Any] = []
    for write in writes:
        items = write if isinstance(write, list) else [write]
        if any(isinstance(m, RemoveMessage) for m in items):
            if run:
                merged, run = add_messages(merged, run), []
            merged = add_messages(merged, items)
        else:
            run.extend(items)
    if run:
        merged = add_messages(merged, run)
    return list(merged)


class PlainChat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class DeltaChat(TypedDict):
    messages: Annotated[list[AnyMessage], DeltaChannel(add_messages_batched)]


def build_graph(variant: str, replies: Sequence[str], saver: Any) -> Any:
    """The two-node chat graph, compiled with ``saver``."""

    async def human(state: Any) -> dict[str, Any]:
        if not isinstance(state["messages"][-1], HumanMessage):
            raise ValueError("a turn starts with a human message")
        return {}

    async def ai(state: Any) -> dict[str, Any]:
        turn = (len(state["messages"]) - 1) // 2
        return {"messages": [AIMessage(content=replies[turn], id=f"ai-{turn}")]}

    schema: Any = PlainChat if variant == "plain" else DeltaChat
    return (
        StateGraph(schema)
        .add_node("human", human)
        .add_node("ai", ai)
        .add_edge(START, "human")
        .add_edge("human", "ai")
        .add_edge("ai", END)
        .compile(checkpointer=saver)
    )


# -- storage and its bytes ---------------------------------------------------------------


@dataclass
class Sizes:
    """Per table (rows, bytes of the rows); bytes on disk."""

    tables: dict[str, tuple[int, int]]
    disk: int

    @property
    def rows(self) -> int:
        return sum(b for _, b in self.tables.values())


async def pg_sizes(url: str, schema: str) -> Sizes:
    """The rows (``pg_column_size`` of each whole row) and the on-disk size (tables,
    indexes, TOAST) of a schema's tables."""
    con = await asyncpg.connect(url)
    try:
        found = await con.fetch(
            "SELECT c.relname AS name, pg_total_relation_size(c.oid) AS disk FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1"
            " AND c.relkind = 'r' AND NOT c.relname = ANY($2::text[]) ORDER BY c.relname",
            schema,
            list(BOOKKEEPING),
        )
        tables = {}
        for row in found:
            count, size = await con.fetchrow(
                "SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)"
                f' FROM "{schema}"."{row["name"]}" t'
            )
            tables[row["name"]] = (int(count), int(size))
        return Sizes(tables, sum(int(r["disk"]) for r in found))
    finally:
        await con.close()


def sqlite_sizes(path: Path, *, empty: bool = False) -> Sizes:
    """The rows (dbstat's payload per table, else the sum of ``length()`` of the
    columns) and the file with its WAL as left (``empty``: the database's pages, what
    a file just set up holds however its WAL is laid out)."""
    con = sqlite3.connect(path)
    try:
        names = [
            r[0]
            for r in con.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
            if r[0] not in BOOKKEEPING
        ]
        payload: dict[str, int] | None
        try:
            payload = {
                n: int(p or 0)
                for n, p in con.execute("SELECT name, sum(payload) FROM dbstat GROUP BY name")
            }
        except sqlite3.OperationalError:  # no dbstat in this SQLite
            payload = None
        tables = {}
        for name in sorted(names):
            count = int(con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0])
            if payload is not None:
                size = payload.get(name, 0)
            else:
                cols = [r[1] for r in con.execute(f'PRAGMA table_info("{name}")')]
                total = " + ".join(f'coalesce(length(CAST("{c}" AS BLOB)), 0)' for c in cols)
                size = int(
                    con.execute(f'SELECT coalesce(sum({total}), 0) FROM "{name}"').fetchone()[0]
                )
            tables[name] = (count, size)
        if empty:
            pages = con.execute("PRAGMA page_count").fetchone()[0]
            disk = int(pages) * int(con.execute("PRAGMA page_size").fetchone()[0])
        else:
            files = (path, Path(f"{path}-wal"))
            disk = sum(p.stat().st_size for p in files if p.exists())
        return Sizes(tables, disk)
    finally:
        con.close()


@dataclass
class Storage:
    """Where a saver keeps its thread: a PostgreSQL schema or a SQLite file."""

    schema: str | None = None
    path: Path | None = None

    async def vacuum(self, url: str) -> None:
        """What autovacuum does to a PostgreSQL schema's tables (a plain VACUUM: the
        space of deleted rows is marked free for new ones, the files keep their size).
        A SQLite file reuses its free pages without one: nothing to do."""
        if self.schema is None:
            return
        con = await asyncpg.connect(url)
        try:
            for (table,) in await con.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = $1", self.schema
            ):
                await con.execute(f'VACUUM "{self.schema}"."{table}"')
        finally:
            await con.close()

    async def sizes(self, url: str, *, empty: bool = False) -> Sizes:
        if self.schema is not None:
            return await pg_sizes(url, self.schema)
        assert self.path is not None
        return await asyncio.to_thread(sqlite_sizes, self.path, empty=empty)


# -- the systems -------------------------------------------------------------------------


@dataclass
class System:
    """One saver and one variant: its graph, its thread, its samples."""

    saver: str
    variant: str
    graph: Any
    storage: Storage | None
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    empty: Sizes | None = None
    sizes: Sizes | None = None

    @property
    def name(self) -> str:
        return f"{self.saver}/{self.variant}"

    @property
    def config(self) -> RunnableConfig:
        return {"configurable": {"thread_id": THREAD, "user_id": USER}}


def with_search_path(url: str, schema: str) -> str:
    """A libpq URL whose sessions use ``schema``."""
    return url + ("&" if "?" in url else "?") + f"options=-csearch_path%3D{schema}"


async def open_saver(
    kind: str, tag: str, url: str, tmp: Path, schemas: list[str], stack: AsyncExitStack
) -> tuple[Any, Storage | None]:
    """A saver of ``kind`` with storage of its own (closed by ``stack``)."""
    if kind == "memory":
        return InMemorySaver(), None
    if kind == "langgraph-pg":
        schema = f"lgchat_{tag}"
        schemas.append(schema)
        await make_schema(url, schema)
        saver = await stack.enter_async_context(
            AsyncPostgresSaver.from_conn_string(with_search_path(url, schema))
        )
        await saver.setup()
        return saver, Storage(schema=schema)
    if kind == "tenx-pg":
        schema = f"lgchat_{tag}"
        schemas.append(schema)
        await drop_schema(url, schema)
        cp = PgCheckpointer(
            postgres_dsn=url, redis_url=REDIS_URL, schema=schema, key_prefix=f"lgchat-{tag}"
        )
        await stack.enter_async_context(cp)
        await cp.asetup()
        return TenxCheckpointSaver(cp), Storage(schema=schema)
    if kind == "langgraph-sqlite":
        aio = importlib.import_module("langgraph.checkpoint.sqlite.aio")
        path = tmp / f"{tag}.db"
        opened: AbstractAsyncContextManager[Any] = aio.AsyncSqliteSaver.from_conn_string(str(path))
        saver = await stack.enter_async_context(opened)
        await saver.setup()
        return saver, Storage(path=path)
    if kind == "tenx-sqlite":
        path = tmp / f"{tag}.db"
        sqlite_cp = SqliteCheckpointer(path)
        await stack.enter_async_context(sqlite_cp)
        await sqlite_cp.asetup()
        return TenxCheckpointSaver(sqlite_cp), Storage(path=path)
    raise ValueError(f"unknown saver {kind!r}")


@asynccontextmanager
async def redis_cleanup(prefix: str) -> AsyncIterator[None]:
    """Delete the cache keys the run's ``PgCheckpointer``s may have left."""
    try:
        yield
    finally:
        client = Redis.from_url(REDIS_URL)
        try:
            keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()


# -- the run -----------------------------------------------------------------------------


@dataclass
class Run:
    systems: list[System]
    turns: int
    seconds: float
    skipped: list[str]
    profile: str | None = None
    floor: dict[str, float] = field(default_factory=dict)


async def timed(system: System, call: Awaitable[Any], profiler: cProfile.Profile | None) -> Any:
    if profiler is not None:
        profiler.enable()
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        return await call
    finally:
        system.wall.append(time.perf_counter() - wall)
        system.cpu.append(time.process_time() - cpu)
        if profiler is not None:
            profiler.disable()


async def run(args: argparse.Namespace) -> Run:
    savers = [s for s in args.savers if s != "langgraph-sqlite" or HAS_LG_SQLITE]
    skipped = [s for s in args.savers if s not in savers]
    rng = random.Random(args.seed)
    humans = [words(rng) for _ in range(args.turns)]
    replies = [words(rng) for _ in range(args.turns)]
    run_id = uuid.uuid4().hex[:8]
    schemas: list[str] = []
    systems: list[System] = []
    profiler = cProfile.Profile() if args.profile else None
    profile_from = args.profile_from if args.profile_from is not None else 3 * args.turns // 4
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lgchat-") as tmp:
        try:
            async with redis_cleanup(f"lgchat-{run_id}"), AsyncExitStack() as stack:
                for variant in args.variants:
                    for kind in savers:
                        tag = f"{run_id}_{kind.replace('-', '_')}_{variant}"
                        saver, storage = await open_saver(
                            kind, tag, args.url, Path(tmp), schemas, stack
                        )
                        graph = build_graph(variant, replies, saver)
                        systems.append(System(kind, variant, graph, storage))
                for system in systems:
                    if system.storage is not None:
                        system.empty = await system.storage.sizes(args.url, empty=True)
                for turn in range(args.turns):
                    order = systems[:]
                    random.Random(args.seed * 100_003 + turn).shuffle(order)  # no one first
                    for system in order:
                        message = HumanMessage(content=humans[turn], id=f"human-{turn}")
                        profiling = system.name == args.profile and turn >= profile_from
                        await timed(
                            system,
                            system.graph.ainvoke({"messages": [message]}, system.config),
                            profiler if profiling else None,
                        )
                    if args.gc == "per-turn":  # every saver alike, outside the timings
                        gc.collect()
                        gc.freeze()
                    if args.vacuum_every and (turn + 1) % args.vacuum_every == 0:
                        for system in systems:  # every saver alike, outside the timings
                            if system.storage is not None:
                                await system.storage.vacuum(args.url)
                expected = [text for pair in zip(humans, replies, strict=True) for text in pair]
                for system in systems:  # every saver holds the whole conversation
                    state = await system.graph.aget_state(system.config)
                    got = [m.content for m in state.values["messages"]]
                    if got != expected:
                        raise AssertionError(
                            f"{system.name} holds {len(got)} messages, not the {len(expected)}"
                            " the conversation wrote (or other ones)"
                        )
            seconds = time.perf_counter() - started
            for system in systems:  # once every saver has closed (SQLite: WAL checkpointed)
                if system.storage is not None:
                    system.sizes = await system.storage.sizes(args.url)
        finally:
            for schema in schemas:
                await drop_schema(args.url, schema)
    result = Run(systems, args.turns, seconds, skipped, floor=serde_floor(humans, replies))
    if profiler is not None:
        result.profile = profile_text(profiler, args.profile, profile_from, args.turns)
    return result


def serde_floor(humans: Sequence[str], replies: Sequence[str]) -> dict[str, float]:
    """What handing the graph its whole message list costs at least: LangGraph's serde
    loading the list (ms, best of 7) at turn 10 and at the last turn."""
    serde = JsonPlusSerializer()
    messages: list[AnyMessage] = []
    for turn, (human, reply) in enumerate(zip(humans, replies, strict=True)):
        messages += [HumanMessage(human, id=f"human-{turn}"), AIMessage(reply, id=f"ai-{turn}")]

    def load_ms(n: int) -> float:
        typed = serde.dumps_typed(messages[:n])
        best = []
        for _ in range(7):
            start = time.perf_counter()
            serde.loads_typed(typed)
            best.append(time.perf_counter() - start)
        return min(best) * 1000

    return {
        "at_10": load_ms(min(20, len(messages))),
        "at_end": load_ms(len(messages)),
        "bytes_at_end": float(len(serde.dumps_typed(messages)[1])),
    }


def profile_text(profiler: cProfile.Profile, name: str, start: int, turns: int) -> str:
    out = io.StringIO()
    out.write(f"\n## Profile of {name}, turns {start + 1}-{turns} (cProfile)\n\n")
    for key in ("cumulative", "tottime"):
        stats = pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(key)
        stats.print_stats(30)
    return out.getvalue()


# -- the report --------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def last(values: list[float], n: int = 10) -> float:
    return statistics.mean(values[-n:])


def paired_adds(saver: System, memory: System, n: int = 50) -> float:
    """What a saver adds to the graph's turn, paired turn by turn: the median over the
    last ``n`` turns of its turn less the memory saver's same turn (both ran in the same
    shuffled round, so machine noise hits them alike)."""
    return statistics.median(
        [a - b for a, b in zip(saver.wall[-n:], memory.wall[-n:], strict=True)]
    )


STORAGE_TARGETS = {"pg": 3.0, "sqlite": 2.0}  # LangGraph's saver adds at least this x ours


def storage_added(by: dict[str, System]) -> list[str]:
    """What each saver adds to the graph's own turn: its turn less the memory saver's
    (the graph and LangGraph's serde with no storage), per variant, and LangGraph's
    saver's against tenxstore's on the same database. A ratio of whole turns can never
    pass the ratio of these: the graph's own cost is in both. The target's measure is
    the paired median of the last 50 turns (:func:`paired_adds`)."""
    lines = [
        "",
        "## What storage adds to the graph (ms; a saver's turn less the memory saver's)",
        "",
        "| variant | database | langgraph adds (last 10) | tenx adds (last 10) | langgraph / tenx"
        " | langgraph adds (p50 of last 50) | tenx adds (p50 of last 50) | langgraph / tenx"
        " (p50 of last 50) | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        memory = by.get(f"memory/{variant}")
        for database in ("pg", "sqlite"):
            theirs = by.get(f"langgraph-{database}/{variant}")
            ours = by.get(f"tenx-{database}/{variant}")
            if memory is None or theirs is None or ours is None:
                continue
            cells = [variant, database]
            base = last(memory.wall)
            they, we = last(theirs.wall) - base, last(ours.wall) - base
            cells += [ms(they), ms(we), f"{they / we:.2f}" if we > 0 else "—"]
            they, we = paired_adds(theirs, memory), paired_adds(ours, memory)
            ratio = they / we if we > 0 else float("inf")
            cells += [ms(they), ms(we), f"{ratio:.2f}" if we > 0 else "—"]
            if variant == "plain":
                target = STORAGE_TARGETS[database]
                cells += [f"≥ {target:g}", "yes" if ratio >= target else "no"]
            else:
                cells += ["—", "—"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def around_ten(values: list[float]) -> float:
    """Mean of turns 6-15 (the 10th turn's neighbourhood; the start of a short run)."""
    return statistics.mean(values[5:15] or values)


def windows(turns: int) -> list[tuple[int, int]]:
    """Five 10-turn windows from the first turns to the last (zero-based, end excluded)."""
    if turns <= 10:
        return [(0, turns)]
    starts = sorted({round(i * (turns - 10) / 4) for i in range(5)})
    return [(s, s + 10) for s in starts]


def machine() -> str:
    versions = []
    for dist in (
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-postgres",
        "langgraph-checkpoint-sqlite",
        "tenxstore",
    ):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} (not installed)")
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()},"
        f" Python {platform.python_version()}; " + ", ".join(versions)
    )


def report(result: Run, args: argparse.Namespace) -> str:
    by = {s.name: s for s in result.systems}
    lines = [
        f"# LangGraph chat graph, T={result.turns} turns per thread (issue #16)",
        "",
        f"`python benchmarks/langgraph_chat.py {' '.join(args.argv)}`".replace(" `", "`"),
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC in {result.seconds:.0f} s."
        f" {machine()}.",
        "Every saver in one process, interleaved turn by turn in a shuffled order; a turn"
        " is one `ainvoke` (one human message in, one AI message appended)."
        + (
            " After every turn, outside the timings, garbage collected and the rest frozen."
            if args.gc == "per-turn"
            else " Python's collector on its own schedule (`--gc as-is`)."
        ),
    ]
    for name in result.skipped:
        lines.append(
            f"**{name} skipped**: langgraph-checkpoint-sqlite is not installed"
            " (pip install langgraph-checkpoint-sqlite)."
        )
    lines += [
        "",
        "## Per turn (ms; CPU: this process's, per turn)",
        "",
        "| saver | variant | wall p50 | wall last 10 | wall turns 6-15 | growth | CPU p50"
        " | CPU last 10 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in result.systems:
        lines.append(
            f"| {s.saver} | {s.variant} | {ms(statistics.median(s.wall))} | {ms(last(s.wall))}"
            f" | {ms(around_ten(s.wall))} | {ms(last(s.wall) - around_ten(s.wall))}"
            f" | {ms(statistics.median(s.cpu))} | {ms(last(s.cpu))} |"
        )
    lines += [
        "",
        "## Bytes stored",
        "",
        "Rows: `sum(pg_column_size(t.*))` of every table the saver uses (SQLite: dbstat's"
        " payload); on disk: tables with indexes and TOAST (SQLite: the file and its WAL)"
        " as the run left them, and less the empty schema's. Migration bookkeeping tables"
        " are left out."
        + (
            f" PostgreSQL tables were vacuumed every {args.vacuum_every} turns (every saver's,"
            " outside the timings), as autovacuum would over a chat's real hours."
            if args.vacuum_every
            else " No vacuum ran: PostgreSQL's files hold every row version ever written."
        ),
        "",
        "| saver | variant | rows | on disk | on disk less empty | tables (rows: bytes) |",
        "|---|---|---|---|---|---|",
    ]
    for s in result.systems:
        if s.sizes is None or s.empty is None:
            continue
        tables = ", ".join(f"{t} ({n:,}: {b:,})" for t, (n, b) in s.sizes.tables.items() if n or b)
        lines.append(
            f"| {s.saver} | {s.variant} | {s.sizes.rows:,} | {s.sizes.disk:,}"
            f" | {s.sizes.disk - s.empty.disk:,} | {tables} |"
        )
    lines += [
        "",
        "## Ratios (#16's targets; per turn = mean of the last 10 turns)",
        "",
        "| ratio | per turn | per turn (p50) | rows | on disk less empty | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, top, bottom, turn_target, bytes_target in (
        ("PG plain: langgraph-pg / tenx-pg", "langgraph-pg/plain", "tenx-pg/plain", 3, 20),
        (
            "langgraph-pg on delta / tenx-pg on plain",
            "langgraph-pg/delta",
            "tenx-pg/plain",
            1,
            1,
        ),
        ("PG delta: langgraph-pg / tenx-pg", "langgraph-pg/delta", "tenx-pg/delta", 1, 1),
        (
            "SQLite plain: langgraph-sqlite / tenx-sqlite",
            "langgraph-sqlite/plain",
            "tenx-sqlite/plain",
            2,
            10,
        ),
        (
            "SQLite delta: langgraph-sqlite / tenx-sqlite",
            "langgraph-sqlite/delta",
            "tenx-sqlite/delta",
            None,
            None,
        ),
        ("tenx-pg: plain / delta", "tenx-pg/plain", "tenx-pg/delta", None, None),
    ):
        if top not in by or bottom not in by:
            continue
        a, b = by[top], by[bottom]
        per_turn = last(a.wall) / last(b.wall)
        p50 = statistics.median(a.wall) / statistics.median(b.wall)
        rows = disk = float("nan")
        if a.sizes and b.sizes and a.empty and b.empty:
            rows = a.sizes.rows / max(b.sizes.rows, 1)
            disk = (a.sizes.disk - a.empty.disk) / max(b.sizes.disk - b.empty.disk, 1)
        target, met = "—", "—"
        if turn_target is not None and bytes_target is not None:
            target = f"per turn ≥ {turn_target}, rows ≥ {bytes_target}"
            met = "yes" if per_turn >= turn_target and rows >= bytes_target else "no"
        lines.append(
            f"| {label} | {per_turn:.2f} | {p50:.2f} | {rows:.2f} | {disk:.2f} | {target} | {met} |"
        )
    lines += storage_added(by)
    floor = result.floor
    lines += [
        "",
        "## Growth and its floor",
        "",
        "Growth = mean of the last 10 turns less the mean of turns 6-15 (table above)."
        " The floor of it: LangGraph's serde loading the whole message list (a graph"
        f" must be handed it every turn) takes {floor['at_10']:.3f} ms at turn 10 and"
        f" {floor['at_end']:.3f} ms at turn {result.turns}"
        f" ({floor['bytes_at_end']:,.0f} bytes serialized): a floor growth of"
        f" {floor['at_end'] - floor['at_10']:.3f} ms. The `memory` rows are the graph and"
        " LangGraph's serde alone, without storage.",
        "",
        "| saver/variant | growth (ms) | growth / floor growth |",
        "|---|---|---|",
    ]
    floor_growth = floor["at_end"] - floor["at_10"]
    for s in result.systems:
        growth = (last(s.wall) - around_ten(s.wall)) * 1000
        times = f"{growth / floor_growth:.1f}" if floor_growth > 0.01 else "—"
        lines.append(f"| {s.name} | {growth:.2f} | {times} |")
    spans = windows(result.turns)
    lines += [
        "",
        "## Wall per turn against turn number (ms, mean of each 10-turn window)",
        "",
        "| saver/variant | " + " | ".join(f"turns {a + 1}-{b}" for a, b in spans) + " |",
        "|---|" + "---|" * len(spans),
    ]
    for s in result.systems:
        cells = " | ".join(ms(statistics.mean(s.wall[a:b])) for a, b in spans)
        lines.append(f"| {s.name} | {cells} |")
    if result.profile:
        lines.append(result.profile)
    return "\n".join(lines)


def plot(result: Run, path: Path) -> str:
    """A PNG of per-turn wall time against turn number, a panel per variant."""
    try:
        import matplotlib
    except ImportError:
        return f"(no plot: matplotlib is not installed; {path} not written)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = sorted({s.variant for s in result.systems}, key=VARIANTS.index)
    fig, axes = plt.subplots(1, len(variants), figsize=(7 * len(variants), 5), squeeze=False)
    for ax, variant in zip(axes[0], variants, strict=True):
        top = 0.0
        for s in result.systems:
            if s.variant == variant:
                turns = range(1, len(s.wall) + 1)
                wall = [w * 1000 for w in s.wall]
                smooth = [statistics.median(wall[max(0, i - 9) : i + 1]) for i in range(len(wall))]
                (line,) = ax.plot(turns, smooth, label=s.saver, linewidth=1.6)
                ax.plot(turns, wall, color=line.get_color(), linewidth=0.6, alpha=0.3)
                top = max(top, *smooth)
        ax.set_title(f"{variant} graph")
        ax.set_xlabel("turn")
        ax.set_ylabel("ainvoke wall time (ms)")
        ax.set_ylim(0, top * 1.4)
        ax.legend()
    fig.suptitle(
        "LangGraph chat graph: ainvoke wall time against turn number"
        " (bold: median of the last 10 turns; faint: each turn)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"Plot: {path}"


def dump(result: Run, path: Path) -> None:
    """The per-turn samples and sizes as JSON."""
    data = {
        "turns": result.turns,
        "seconds": result.seconds,
        "floor": result.floor,
        "systems": {
            s.name: {
                "wall": s.wall,
                "cpu": s.cpu,
                "sizes": None if s.sizes is None else s.sizes.__dict__,
                "empty": None if s.empty is None else s.empty.__dict__,
            }
            for s in result.systems
        },
    }
    path.write_text(json.dumps(data))


def names(text: str, allowed: Sequence[str]) -> list[str]:
    found = [n.strip() for n in text.split(",") if n.strip()]
    wrong = [n for n in found if n not in allowed]
    if wrong or not found:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}; not {wrong}")
    return found


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--url", default=PG_URL, help="PostgreSQL URL (default: %(default)s)")
    parser.add_argument(
        "--variants", type=lambda t: names(t, VARIANTS), default=list(VARIANTS), help="plain,delta"
    )
    parser.add_argument(
        "--savers",
        type=lambda t: names(t, SAVERS),
        default=list(SAVERS),
        help=",".join(SAVERS),
    )
    parser.add_argument(
        "--vacuum-every",
        type=int,
        default=0,
        metavar="N",
        help="VACUUM every PostgreSQL saver's tables every N turns, as autovacuum would over"
        " a chat's real hours (default: never; the files then hold every row ever written)",
    )
    parser.add_argument(
        "--gc",
        choices=("per-turn", "as-is"),
        default="per-turn",
        help="per-turn (default): after every turn, outside the timings, collect the turn's"
        " garbage and freeze what is left, so a full collection inside a turn walks only"
        " what that turn made, not every saver's heap; as-is: Python's own schedule",
    )
    parser.add_argument("--plot", type=Path, help="write a PNG of latency against turn")
    parser.add_argument("--json", type=Path, help="write the per-turn samples as JSON")
    parser.add_argument("--quick", action="store_true", help="5 turns: a smoke test")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--profile", metavar="SAVER/VARIANT", help="cProfile these late turns")
    parser.add_argument("--profile-from", type=int, help="first profiled turn (default 3T/4)")
    args = parser.parse_args(argv)
    if args.quick:
        args.turns = 5
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    if args.profile is not None:
        saver, _, variant = args.profile.partition("/")
        if saver not in args.savers or variant not in args.variants:
            parser.error(f"--profile names a saver/variant that runs, not {args.profile!r}")
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    return args


async def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    result = await run(args)
    print(report(result, args))
    if args.plot is not None:
        print(plot(result, args.plot))
    if args.json is not None:
        dump(result, args.json)


if __name__ == "__main__":
    asyncio.run(main())
