"""Conversation benchmark: tenxstore against the raw drivers and LangGraph, side by side.

For T turns on one thread each system reads the latest state, appends two messages
(~200 random characters each) and writes a new state (step counter, summary, the
last 20 messages as context, a few custom fields). The systems run interleaved turn
by turn in one process, so machine noise hits all of them alike:

* ``tenx-pg+redis`` — ``PgCheckpointer`` (cached read, durable write + cache refresh);
* ``tenx-pg``       — its ``CheckpointRepository`` alone (database read and write);
* ``tenx-sqlite``   — ``SqliteCheckpointer``;
* ``raw``           — a reference: the same work hand-written on asyncpg as seven
  statements in one transaction, plus a raw Redis SET/GET with the same serializer
  (the physical floor — one statement — is ``benchmarks/floors.py``'s);
* ``langgraph``     — LangGraph's ``AsyncPostgresSaver`` holding the conversation the
  way LangGraph users do (a ``messages`` channel with the whole list).

    python benchmarks/conversation.py                 # T=250 with LangGraph, T=1000 flatness
    python benchmarks/conversation.py --turns 100 --flat-turns 0 --no-langgraph

Needs PostgreSQL and Redis (TENXSTORE_BENCH_PG_URL / TENXSTORE_BENCH_REDIS_URL, by
default the local services) and ``pip install -e ".[bench]"``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from redis.asyncio import Redis
from workload import (
    PG_URL,
    REDIS_URL,
    ROOT,
    drop_schema,
    make_schema,
    next_state,
    pct,
    words,
)

from tenxstore import CheckpointRepository, PgCheckpointer, SqliteCheckpointer, StaleStateError
from tenxstore.cache import cache_key
from tenxstore.serde import decode, encode_state

# -- systems -------------------------------------------------------------------------


@dataclass
class System:
    """One system under test: a read and a write of one turn."""

    name: str
    read: Callable[[], Awaitable[Any]]
    write: Callable[[dict[str, Any], list[dict[str, Any]]], Awaitable[Any]]
    close: Callable[[], Awaitable[None]]
    schema: str | None = None
    statements: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    counter: list[int] | None = None


def count_statements(repository: Any) -> list[int]:
    """Statements the repository sends (its hot path's included), counted as sent."""
    box = [0]

    def bump(_statement: str) -> None:
        box[0] += 1

    repository.backend.on_statement(bump)
    return box


async def tenx_system(name: str, cp: Any, reader: str, repo: Any, schema: str | None) -> System:
    config: dict[str, Any] = {"thread_id": "bench", "user_id": "u"}
    read_fn = getattr(cp, reader)

    async def read() -> Any:
        return await read_fn(config)

    async def write(state: dict[str, Any], messages: list[dict[str, Any]]) -> Any:
        return await cp.aput_checkpoint(config, state, messages)

    return System(name, read, write, cp.aclose, schema, counter=count_statements(repo))


class Raw:
    """The same work on the raw drivers, seven statements in a transaction (a reference;
    the floor is in ``benchmarks/floors.py``)."""

    def __init__(
        self, pool: Any, redis: Redis, schema: str, thread: str = "bench", limit: int = 20
    ) -> None:
        self.pool, self.redis, self.thread, self.limit = pool, redis, thread, limit
        self.version = 0
        self.key = cache_key("raw_cache", thread, "u", True)
        s = f'"{schema}"'
        self.sql = {
            "lock": f"SELECT user_id, version FROM {s}.threads WHERE thread_id = $1 FOR UPDATE",
            "upsert": f"INSERT INTO {s}.threads (thread_id, user_id, version, created_at, "
            "updated_at) VALUES ($1, $2, 0, $3, $3) ON CONFLICT (thread_id) DO NOTHING",
            "state": f"INSERT INTO {s}.states (thread_id, version, state_data, created_at) "
            "VALUES ($1, $2, $3, $4)",
            "messages": f"INSERT INTO {s}.messages (thread_id, message_id, role, payload, "
            "created_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (thread_id, message_id) "
            "DO NOTHING",
            "bump": f"UPDATE {s}.threads SET version = $2, updated_at = $3 WHERE thread_id = $1",
            "prune": f"DELETE FROM {s}.states WHERE thread_id = $1 AND version <= $2",
            "read": f"SELECT t.version, s.state_data FROM {s}.threads t LEFT JOIN {s}.states s "
            "ON s.thread_id = t.thread_id AND s.version = t.version "
            "WHERE t.thread_id = $1 AND t.user_id = $2",
        }

    async def write(self, state: dict[str, Any], messages: list[dict[str, Any]]) -> int:
        now, thread = datetime.now(timezone.utc), self.thread
        payload = encode_state(state)
        rows = [(thread, m["id"], m["role"], orjson.dumps(m).decode(), now) for m in messages]
        async with self.pool.acquire() as con, con.transaction():
            row = await con.fetchrow(self.sql["lock"], thread)
            if row is None:
                await con.execute(self.sql["upsert"], thread, "u", now)
                row = await con.fetchrow(self.sql["lock"], thread)
            if row["user_id"] != "u" or row["version"] != self.version:
                raise StaleStateError(thread, self.version, row["version"])
            version = row["version"] + 1
            await con.execute(self.sql["state"], thread, version, payload, now)
            await con.executemany(self.sql["messages"], rows)
            await con.execute(self.sql["bump"], thread, version, now)
            if version > self.limit:
                await con.execute(self.sql["prune"], thread, version - self.limit)
        self.version = version
        await self.redis.set(self.key, orjson.dumps({**state, "__v": version}), px=86_400_000)
        return version

    async def read_cached(self) -> Any:
        raw = await self.redis.get(self.key)
        return None if raw is None else orjson.loads(raw)

    async def read_db(self) -> Any:
        row = await self.pool.fetchrow(self.sql["read"], self.thread, "u")
        return None if row is None or row["state_data"] is None else decode(row["state_data"])


class LangGraph:
    """LangGraph's AsyncPostgresSaver, storing the whole message list as a channel."""

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self.config: dict[str, Any] = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
        self.messages: list[dict[str, Any]] = []
        self.turn = 0

    async def read(self) -> Any:
        found = await self.saver.aget_tuple(self.config)
        return None if found is None else found.checkpoint["channel_values"]

    async def write(self, state: dict[str, Any], messages: list[dict[str, Any]]) -> Any:
        from langgraph.checkpoint.base import empty_checkpoint

        # As LangGraph's loop does: the node's writes against the checkpoint it ran
        # from, then the next checkpoint with every channel that changed.
        if "checkpoint_id" in self.config["configurable"]:
            await self.saver.aput_writes(self.config, [("messages", messages)], f"task-{self.turn}")
        self.turn += 1
        self.messages = [*self.messages, *messages]
        checkpoint = empty_checkpoint()
        values = {**{k: v for k, v in state.items() if k != "context"}, "messages": self.messages}
        checkpoint["channel_values"] = values
        checkpoint["channel_versions"] = dict.fromkeys(values, self.turn)
        metadata = {"source": "loop", "step": self.turn}
        self.config = await self.saver.aput(
            self.config, checkpoint, metadata, dict.fromkeys(values, self.turn)
        )


async def schema_bytes(url: str, schema: str) -> tuple[int, int]:
    """Bytes of a schema's tables with their indexes and TOAST: as left by the run,
    and live (after VACUUM FULL drops the dead rows that pruning and updates leave
    until autovacuum reuses their space)."""
    query = (
        "SELECT c.oid::regclass::text AS name, pg_total_relation_size(c.oid) AS bytes "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND c.relkind = 'r' "
        "AND c.relname NOT IN ('alembic_version', 'checkpoint_migrations')"
    )
    con = await asyncpg.connect(url)
    try:
        rows = await con.fetch(query, schema)
        before = sum(r["bytes"] for r in rows)
        for r in rows:
            await con.execute(f"VACUUM FULL {r['name']}")
        after = sum(r["bytes"] for r in await con.fetch(query, schema))
        return before, after
    finally:
        await con.close()


def sqlite_bytes(path: Path) -> tuple[int, int]:
    """The database file and its WAL, then the file alone after a checkpoint and VACUUM."""
    import sqlite3

    files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
    before = sum(p.stat().st_size for p in files if p.exists())
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("VACUUM")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
    return before, path.stat().st_size


# -- the run -------------------------------------------------------------------------


@dataclass
class Timings:
    read: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    write: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


async def build(run_id: str, langgraph: bool, sqlite_dir: Path) -> tuple[list[System], list[Any]]:
    systems: list[System] = []
    closers: list[Any] = []
    redis = Redis.from_url(REDIS_URL)
    closers.append(redis.aclose)

    schema = f"bench_{run_id}_cached"
    cached = PgCheckpointer(
        postgres_dsn=PG_URL, redis_url=REDIS_URL, schema=schema, key_prefix=f"bench_{run_id}"
    )
    await cached.asetup()
    systems.append(
        await tenx_system("tenx-pg+redis", cached, "aget_state_cache", cached.inner, schema)
    )

    schema = f"bench_{run_id}_repo"
    repo = CheckpointRepository(PG_URL, schema=schema)
    await repo.asetup()
    systems.append(await tenx_system("tenx-pg", repo, "aget_state", repo, schema))

    sqlite = SqliteCheckpointer(sqlite_dir / f"bench_{run_id}.db")
    await sqlite.asetup()
    systems.append(await tenx_system("tenx-sqlite", sqlite, "aget_state", sqlite.inner, None))

    schema = f"bench_{run_id}_raw"
    setup = CheckpointRepository(PG_URL, schema=schema)  # the same tables, made by our migration
    await setup.asetup()
    await setup.aclose()
    pool = await asyncpg.create_pool(PG_URL, min_size=2, max_size=4)
    raw = Raw(pool, redis, schema)
    closers.append(pool.close)
    systems.append(System("raw-cached", raw.read_cached, raw.write, _noop, schema))
    systems.append(System("raw-db", raw.read_db, _no_write, _noop, None))

    if langgraph:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        schema = f"bench_{run_id}_langgraph"
        await make_schema(PG_URL, schema)
        conn = PG_URL + ("&" if "?" in PG_URL else "?") + f"options=-csearch_path%3D{schema}"
        context = AsyncPostgresSaver.from_conn_string(conn)
        saver = await context.__aenter__()
        await saver.setup()
        lg = LangGraph(saver)
        closers.append(lambda: context.__aexit__(None, None, None))
        systems.append(System("langgraph", lg.read, lg.write, _noop, schema))
    return systems, closers


async def _noop() -> None:
    return None


async def _no_write(_state: dict[str, Any], _messages: list[dict[str, Any]]) -> None:
    return None


async def conversation(turns: int, langgraph: bool, seed: int = 7) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    sqlite_dir = ROOT / "benchmarks" / ".data"
    sqlite_dir.mkdir(exist_ok=True)
    systems, closers = await build(run_id, langgraph, sqlite_dir)
    # What an empty schema occupies (a page per table and index): not the thread's.
    empty = {s.name: (await schema_bytes(PG_URL, s.schema))[1] for s in systems if s.schema}
    empty["tenx-sqlite"] = sqlite_bytes(sqlite_dir / f"bench_{run_id}.db")[1]
    timings = Timings()
    statements: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    rng = random.Random(seed)
    context: list[dict[str, Any]] = []
    systems_closed = False
    try:
        for turn in range(1, turns + 1):
            new = [
                {"id": f"{turn}-u", "role": "user", "content": words(rng)},
                {"id": f"{turn}-a", "role": "assistant", "content": words(rng)},
            ]
            context = [*context, *new][-20:]
            state = next_state(turn, context, rng)
            order = systems[:]
            random.Random(turn).shuffle(order)  # no system always runs first
            for system in order:
                before = system.counter[0] if system.counter else 0
                started = time.perf_counter()
                await system.read()
                timings.read[system.name].append(time.perf_counter() - started)
                middle = system.counter[0] if system.counter else 0
                started = time.perf_counter()
                await system.write(state, [dict(m) for m in new])
                timings.write[system.name].append(time.perf_counter() - started)
                if system.counter:
                    statements[system.name]["read"].append(middle - before)
                    statements[system.name]["write"].append(system.counter[0] - middle)
        for s in systems:
            await s.close()
        systems_closed = True
        sizes = {s.name: await schema_bytes(PG_URL, s.schema) for s in systems if s.schema}
        sizes["tenx-sqlite"] = sqlite_bytes(sqlite_dir / f"bench_{run_id}.db")
        sizes = {k: (v[0] - empty[k], v[1] - empty[k]) for k, v in sizes.items()}
    finally:
        if not systems_closed:
            for s in systems:
                await s.close()
        for close in reversed(closers):
            await close()
        for s in systems:
            if s.schema:
                await drop_schema(PG_URL, s.schema)
        for p in sqlite_dir.glob(f"bench_{run_id}.db*"):
            p.unlink()
    return {"timings": timings, "sizes": sizes, "statements": statements, "turns": turns}


async def throughput(threads: int, turns: int) -> dict[str, float]:
    """Turns per second with `threads` conversations at once on one pool."""
    run_id = uuid.uuid4().hex[:8]
    results: dict[str, float] = {}
    schema = f"bench_{run_id}_tp"
    cp = PgCheckpointer(
        postgres_dsn=PG_URL,
        redis_url=REDIS_URL,
        schema=schema,
        key_prefix=f"bench_{run_id}",
        pool_config={"pool_size": 10, "max_overflow": 0},
    )
    await cp.asetup()
    raw_schema = f"bench_{run_id}_tpraw"
    setup = CheckpointRepository(PG_URL, schema=raw_schema)
    await setup.asetup()
    await setup.aclose()
    pool = await asyncpg.create_pool(PG_URL, min_size=10, max_size=10)
    redis = Redis.from_url(REDIS_URL)

    async def tenx_conversation(i: int) -> None:
        rng = random.Random(i)
        config: dict[str, Any] = {"thread_id": f"tp-{i}", "user_id": "u"}
        context: list[dict[str, Any]] = []
        for turn in range(1, turns + 1):
            await cp.aget_state_cache(config)
            new = [
                {"id": f"{turn}-u", "role": "user", "content": words(rng)},
                {"id": f"{turn}-a", "role": "assistant", "content": words(rng)},
            ]
            context = [*context, *new][-20:]
            await cp.aput_checkpoint(config, next_state(turn, context, rng), new)

    async def raw_conversation(i: int) -> None:
        rng = random.Random(i)
        raw = Raw(pool, redis, raw_schema, thread=f"tp-{i}")
        context: list[dict[str, Any]] = []
        for turn in range(1, turns + 1):
            await raw.read_cached()
            new = [
                {"id": f"{turn}-u", "role": "user", "content": words(rng)},
                {"id": f"{turn}-a", "role": "assistant", "content": words(rng)},
            ]
            context = [*context, *new][-20:]
            await raw.write(next_state(turn, context, rng), new)

    try:
        for name, fn in (("raw", raw_conversation), ("tenx-pg+redis", tenx_conversation)):
            started = time.perf_counter()
            await asyncio.gather(*(fn(i) for i in range(threads)))
            results[name] = threads * turns / (time.perf_counter() - started)
    finally:
        await cp.aclose()
        await pool.close()
        await redis.aclose()
        await drop_schema(PG_URL, schema)
        await drop_schema(PG_URL, raw_schema)
    return results


# -- reporting -----------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def flatness(values: list[float]) -> float:
    return statistics.mean(values[-10:]) / statistics.mean(values[10:20])


def report(main: dict[str, Any], flat: dict[str, Any] | None, tp: dict[str, float] | None) -> str:
    t: Timings = main["timings"]
    turns = main["turns"]
    lines = [
        "# Benchmarks\n",
        "Generated by `python benchmarks/conversation.py` on "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}; "
        "PostgreSQL and Redis on loopback.\n",
        f"## Per operation, T={turns} turns on one thread (milliseconds)\n",
        "| system | read p50 | read p99 | write p50 | write p99 "
        "| last 10 / turns 11-20 (read, write) |",
        "|---|---|---|---|---|---|",
    ]
    for name in t.read:
        r, w = t.read[name], t.write[name]
        write_cells = (
            (ms(pct(w, 0.5)), ms(pct(w, 0.99)), f"{flatness(w):.2f}")
            if name != "raw-db"
            else ("—", "—", "—")
        )
        lines.append(
            f"| {name} | {ms(pct(r, 0.5))} | {ms(pct(r, 0.99))} | {write_cells[0]} "
            f"| {write_cells[1]} | {flatness(r):.2f}, {write_cells[2]} |"
        )
    p50 = lambda d, n: pct(d[n], 0.5)  # noqa: E731
    ratios = [
        (
            "durable write: tenx-pg+redis / raw (asyncpg tx + Redis SET)",
            p50(t.write, "tenx-pg+redis") / p50(t.write, "raw-cached"),
            "≤ 1.5",
        ),
        (
            "cached read: tenx-pg+redis / raw Redis GET + decode",
            p50(t.read, "tenx-pg+redis") / p50(t.read, "raw-cached"),
            "≤ 1.3",
        ),
        (
            "uncached read: tenx-pg / raw SELECT + decode",
            p50(t.read, "tenx-pg") / p50(t.read, "raw-db"),
            "≤ 1.5",
        ),
    ]
    if "langgraph" in t.read:
        tenx = statistics.mean(t.read["tenx-pg+redis"]) + statistics.mean(t.write["tenx-pg+redis"])
        lg = statistics.mean(t.read["langgraph"]) + statistics.mean(t.write["langgraph"])
        ratios.append(("LangGraph / tenx-pg+redis, mean turn (read + write)", lg / tenx, "≥ 3"))
        floor = statistics.mean(t.read["raw-cached"]) + statistics.mean(t.write["raw-cached"])
        ratios.append(("LangGraph / raw reference, mean turn", lg / floor, ""))
        sizes = main["sizes"]
        ratios.append(
            (
                "LangGraph / tenxstore, bytes stored (live, after VACUUM FULL)",
                sizes["langgraph"][1] / sizes["tenx-pg+redis"][1],
                "≥ 50",
            )
        )
        ratios.append(
            (
                "LangGraph / tenxstore, bytes on disk as the run left them",
                sizes["langgraph"][0] / sizes["tenx-pg+redis"][0],
                "",
            )
        )
    lines += ["\n## Ratios (p50 unless said)\n", "| ratio | measured | target |", "|---|---|---|"]
    lines += [f"| {label} | {value:.2f} | {target} |" for label, value, target in ratios]
    lines += [
        "\n## Bytes stored per thread after T turns (tables, indexes, TOAST)\n",
        "Less what the empty schema occupies. As the run left them (dead rows of pruned"
        " states and updated thread rows included, until autovacuum reuses them), and"
        " live after `VACUUM FULL` (SQLite: the WAL checkpointed and `VACUUM`).\n",
        "| system | as left | live |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v[0]:,} | {v[1]:,} |" for k, v in main["sizes"].items()]
    lines += [
        "\n## SQL statements per operation (median; counted as sent)\n",
        "| system | read | write |",
        "|---|---|---|",
    ]
    for name, counts in main["statements"].items():
        read, write = statistics.median(counts["read"]), statistics.median(counts["write"])
        lines.append(f"| {name} | {read:g} | {write:g} |")
    lines.append(
        "| raw (by construction) | 1 (or 1 Redis GET) "
        "| 7: BEGIN, lock, state, messages, bump, prune, COMMIT; + 1 Redis SET |"
    )
    lines.append(
        "\ntenx-pg's steady write is one statement of data-modifying CTEs (the version's "
        "compare-and-swap, state, messages, prune) in autocommit; the cached write adds "
        "one pipelined Redis round trip (the guarded put and the other isolation mode's "
        "fence). Statements and round trips on the wire, against the floor: "
        "[benchmarks.md](benchmarks.md)."
    )
    if flat is not None:
        ft: Timings = flat["timings"]
        lines += [
            f"\n## Cost flat in history, T={flat['turns']}: "
            "mean of the last 10 turns / turns 11-20\n",
            "Each turn's time is the mean over the `--flat-repeats` conversations run;"
            " the raw rows show the machine's own noise.\n",
            "| system | read | write |",
            "|---|---|---|",
        ]
        for name in ft.read:
            w = f"{flatness(ft.write[name]):.2f}" if name != "raw-db" else "—"
            lines.append(f"| {name} | {flatness(ft.read[name]):.2f} | {w} |")
    if tp is not None:
        lines += [
            "\n## Throughput: 64 conversations at once, pool of 10 connections\n",
            "| system | turns/s (read + write) |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v:,.0f} |" for k, v in tp.items()]
    lines += [
        "\n## Reading the numbers\n",
        "- Every system pays PostgreSQL's WAL flush at COMMIT (synchronous_commit on); "
        "it is most of a write on this machine. The raw rows here are a reference of "
        "seven statements; the physical floor is in [benchmarks.md](benchmarks.md).",
        "- LangGraph's cost grows with the conversation (it stores the whole message list "
        "in every checkpoint): compare its last-10 / turns 11-20 ratio with the others'.",
        "- Live bytes: tenxstore keeps each message once plus `state_history_limit` "
        "snapshots; the snapshots here hold the last 20 messages, so they are a large "
        "part of its footprint.",
        "- SQLite rows swing with fsync latency on this disk; run alone, its per-turn "
        "cost is flat in history too.",
        "\n![per-turn latency](benchmark-latency.png)\n",
    ]
    return "\n".join(lines)


def plot(main: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t: Timings = main["timings"]
    fig, ax = plt.subplots(figsize=(9, 5))
    for name, label in (
        ("tenx-pg+redis", "tenxstore (PostgreSQL + Redis)"),
        ("raw-cached", "raw asyncpg + Redis"),
        ("langgraph", "LangGraph AsyncPostgresSaver"),
    ):
        if name in t.read:
            per_turn = [(r + w) * 1000 for r, w in zip(t.read[name], t.write[name], strict=True)]
            ax.plot(range(1, len(per_turn) + 1), per_turn, label=label, linewidth=0.8)
    ax.set_xlabel("turn")
    ax.set_ylabel("read + write (ms)")
    ax.set_yscale("log")
    ax.set_title("Per-turn latency against conversation length")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=250)
    parser.add_argument("--flat-turns", type=int, default=1000, help="0 to skip the flatness run")
    parser.add_argument("--flat-repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=64, help="0 to skip the throughput run")
    parser.add_argument("--thread-turns", type=int, default=20)
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-conversation.md")
    args = parser.parse_args()

    main_run = await conversation(args.turns, not args.no_langgraph)
    flat = None
    if args.flat_turns:
        # Ten turns make a noisy mean: average each turn position over a few conversations.
        runs = [await conversation(args.flat_turns, False) for _ in range(args.flat_repeats)]
        flat = runs[0]
        for kind in ("read", "write"):
            merged = getattr(flat["timings"], kind)
            for name in merged:
                series = [getattr(r["timings"], kind)[name] for r in runs]
                merged[name] = [statistics.mean(v) for v in zip(*series, strict=True)]
    tp = await throughput(args.threads, args.thread_turns) if args.threads else None
    text = report(main_run, flat, tp)
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(text)
    plot(main_run, args.out.parent / "benchmark-latency.png")
    print(text)


if __name__ == "__main__":
    asyncio.run(main())
