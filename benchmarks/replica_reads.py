"""Read throughput with one read replica against the primary alone, and the raw floor.

A PostgreSQL 15 primary and a hot standby (asynchronous streaming replication, on
loopback; ``tests/replication.py`` starts them in a temporary directory) hold a read
set: ``--threads`` threads of one user, each with ``--versions`` state versions (the
~5 KB state of ``workload.py``) and two messages a version. Once the standby has
replayed it all, each round runs ``--concurrency`` tasks doing ``--reads`` reads each,
a mix of ``alist_states``, ``aget_messages`` and ``alist_threads`` (the threads page,
50 of them), each with a fresh config (no recorded version: every read may go to a
replica), the same reads on each system in turn, the order shuffled every round
(seeded), in one process, garbage collected outside the timings:

* ``floor``: raw asyncpg on the primary, a held connection a task, the statements the
  repository sends for the same reads (taken from it with a cursor listener) prepared,
  ``orjson.loads`` of every JSON column: one round trip a read, the fewest the work
  needs;
* ``primary alone``: ``CheckpointRepository(primary)``;
* ``primary + 1 replica``: ``CheckpointRepository(primary, replica_urls=[standby])``.

Each repository's pools hold ``--pool`` connections a database (the concurrency, by
default, like the floor's): with the library's default pool (``--pool 0``: 10, and 10
more that are closed when they come back to a full pool) 16 tasks keep opening
connections, a cost of the pool's size rather than of the reads.

Printed: per system the median over rounds of reads/s (wall, the round's reads over
its duration) and of this process's CPU time per read (the client's share: the servers
run in processes of their own), the paired medians of each round's ratios against the
floor and of the replica configuration against the primary alone, the share of reads
``read_source`` says a replica served, and the lag probes the repository sent.

``--delay S`` makes the standby replay each commit ``S`` seconds late
(``recovery_min_apply_delay``) while a ticker commits a row on the primary ten times a
second (a standby with no commits to replay is never behind): past
``max_replica_lag`` (5 s) the reads fall back to the primary.

What this machine can show: on one machine (2 cores here) the primary, the standby and
the client share the CPU, so the replica adds no capacity: a read it serves is the same
work on another process of the same cores. What the numbers show is what routing costs
the client (the lag probes, a second pool) and that the reads move; on separate
machines, the replica's share of the reads is that much work taken off the primary.

    python benchmarks/replica_reads.py                    # 20 rounds, 16 tasks x 30 reads
    python benchmarks/replica_reads.py --delay 10         # the standby too far behind
    python benchmarks/replica_reads.py --rounds 1 --reads 5   # smoke

Needs PostgreSQL 15's server programs (``/usr/lib/postgresql/15/bin``); run as root,
they run as the ``postgres`` user through ``runuser``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from sqlalchemy import event
from workload import next_state, turn_messages  # beside this file; puts the root on sys.path

import tenxstore
from tenxstore import CheckpointRepository, read_source
from tests.replication import PgPair, available, poll, started

USER = "u"
KINDS = ("states", "messages", "threads")
FLOOR, ALONE, REPLICA = "floor (asyncpg, primary)", "primary alone", "primary + 1 replica"
PROBE = "pg_current_wal_flush_lsn"  # the first statement of a lag probe, on the primary


def thread_id(n: int) -> str:
    return f"t-{n:04d}"


def config(kind: str, thread: str) -> dict[str, Any]:
    """A fresh config: nothing recorded, so any replica within bound may answer."""
    if kind == "threads":
        return {"configurable": {"user_id": USER}}
    return {"configurable": {"thread_id": thread, "user_id": USER}}


# -- the pair and its read set -------------------------------------------------------


def replayed(nodes: PgPair) -> bool:
    """Whether the standby has replayed everything the primary flushed."""
    position = nodes.sql("a", "SELECT pg_current_wal_flush_lsn()")
    return nodes.sql("b", f"SELECT pg_last_wal_replay_lsn() >= '{position}'::pg_lsn") == "t"


def delay_replay(nodes: PgPair, seconds: float) -> None:
    """The standby replays each commit ``seconds`` after it was made."""
    ms = int(seconds * 1000)
    nodes.sql("b", f"ALTER SYSTEM SET recovery_min_apply_delay = '{ms}ms'")
    nodes.sql("b", "SELECT pg_reload_conf()")
    nodes.wait_sql(
        "b",
        "SELECT setting FROM pg_settings WHERE name = 'recovery_min_apply_delay'",
        str(ms),
        "the standby taking its replay delay",
    )


async def seed(url: str, threads: int, versions: int, seed_: int) -> None:
    """The read set, written on the primary by 8 tasks (each thread's versions in order)."""
    repo = CheckpointRepository(url, state_history_limit=max(versions, 1))
    try:
        await repo.asetup()
        queue = list(range(threads))

        async def writer(rng: random.Random) -> None:
            while queue:
                n = queue.pop()
                cfg = config("states", thread_id(n))
                context: list[dict[str, Any]] = []
                for version in range(versions):
                    messages = turn_messages(version, rng)
                    context += messages
                    await repo.aput_checkpoint(cfg, next_state(version, context, rng), messages)

        await asyncio.gather(*(writer(random.Random(seed_ * 100 + i)) for i in range(8)))
    finally:
        await repo.aclose()


async def ticker(url: str, stop: asyncio.Event) -> None:
    """A commit on the primary every 0.1 s until ``stop`` (what a delayed standby lags)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS replica_bench_ticks (at timestamptz)")
        insert = await conn.prepare("INSERT INTO replica_bench_ticks VALUES (now())")
        while not stop.is_set():
            await insert.fetch()
            with contextlib.suppress(asyncio.TimeoutError):  # not TimeoutError before 3.11
                await asyncio.wait_for(stop.wait(), 0.1)
    finally:
        await conn.close()


# -- the systems -----------------------------------------------------------------------


@dataclass
class Tally:
    """What a system's reads were served by, and the lag probes it sent."""

    replica: int = 0
    reads: int = 0
    probes: int = 0


@dataclass
class Repository:
    """A ``CheckpointRepository``; each read's source taken from ``read_source``."""

    repo: CheckpointRepository
    tally: Tally = field(default_factory=Tally)

    def __post_init__(self) -> None:
        self.repo.backend.on_statement(self._sent)  # on both: the same listener cost

    def _sent(self, sql: str) -> None:
        if PROBE in sql:
            self.tally.probes += 1

    async def read(self, kind: str, thread: str, _slot: int) -> int:
        cfg = config(kind, thread)
        if kind == "states":
            found: list[Any] = await self.repo.alist_states(cfg)
        elif kind == "messages":
            found = await self.repo.aget_messages(cfg)
        else:
            found = await self.repo.alist_threads(cfg)
        source = read_source(cfg)
        self.tally.reads += 1
        if source is not None and not source.primary:
            self.tally.replica += 1
        return len(found)

    async def aclose(self) -> None:
        await self.repo.aclose()


async def captured_sql(url: str, thread: str) -> dict[str, tuple[str, tuple[Any, ...]]]:
    """Per kind of read, the statement and parameters a repository on the primary sends
    for it (of ``thread``), taken from its cursor events."""
    repo = CheckpointRepository(url)
    seen: list[tuple[str, tuple[Any, ...]]] = []

    def listen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, tuple(parameters)))

    try:
        await repo.asetup()
        await repo.alist_threads(config("threads", thread))  # the store's first-use reads
        engine = repo.backend.engine.sync_engine
        event.listen(engine, "before_cursor_execute", listen)
        found = {}
        for kind in KINDS:
            seen.clear()
            cfg = config(kind, thread)
            if kind == "states":
                await repo.alist_states(cfg)
            elif kind == "messages":
                await repo.aget_messages(cfg)
            else:
                await repo.alist_threads(cfg)
            reads = [(sql, params) for sql, params in seen if sql.lstrip().startswith("SELECT")]
            if len(reads) != 1:
                raise RuntimeError(f"{kind}: expected one SELECT, the repository sent {seen}")
            found[kind] = reads[0]
        event.remove(engine, "before_cursor_execute", listen)
        return found
    finally:
        await repo.aclose()


class Floor:
    """Raw asyncpg on the primary: a held connection per task, the repository's
    statements prepared on each, every JSON column decoded with ``orjson``."""

    def __init__(self, sql: dict[str, tuple[str, tuple[Any, ...]]], thread: str) -> None:
        self.sql = sql
        self.thread = thread  # the thread id the statements were captured with
        self.slots: list[dict[str, Any]] = []
        self.conns: list[asyncpg.Connection] = []
        self.tally = Tally()

    async def open(self, url: str, slots: int) -> None:
        for _ in range(slots):
            conn = await asyncpg.connect(url)
            self.conns.append(conn)
            self.slots.append({k: await conn.prepare(sql) for k, (sql, _) in self.sql.items()})

    def params(self, kind: str, thread: str) -> tuple[Any, ...]:
        return tuple(thread if p == self.thread else p for p in self.sql[kind][1])

    async def read(self, kind: str, thread: str, slot: int) -> int:
        rows = await self.slots[slot][kind].fetch(*self.params(kind, thread))
        if kind == "states":
            found = [
                (orjson.loads(r["state_data"]), r["meta"] and orjson.loads(r["meta"])) for r in rows
            ]
        elif kind == "messages":
            found = [orjson.loads(r["payload"]) for r in rows]
        else:
            found = [r["metadata"] and orjson.loads(r["metadata"]) for r in rows]
        self.tally.reads += 1
        return len(found)

    async def aclose(self) -> None:
        for conn in self.conns:
            await conn.close()


# -- the measurement --------------------------------------------------------------------

Read = Callable[[str, str, int], Awaitable[int]]


def plans(args: argparse.Namespace, rng: random.Random) -> list[list[tuple[str, str]]]:
    """A round's reads: per task, ``--reads`` (kind, thread) pairs, the kinds in turn
    (each task starting at another kind), the threads drawn at random."""
    return [
        [
            (KINDS[(task + i) % len(KINDS)], thread_id(rng.randrange(args.threads)))
            for i in range(args.reads)
        ]
        for task in range(args.concurrency)
    ]


async def one_round(read: Read, plan: list[list[tuple[str, str]]]) -> None:
    """Every task's reads, the tasks at once."""

    async def task(slot: int, reads: list[tuple[str, str]]) -> None:
        for kind, thread in reads:
            await read(kind, thread, slot)

    await asyncio.gather(*(task(slot, reads) for slot, reads in enumerate(plan)))


async def measure(
    args: argparse.Namespace, nodes: PgPair
) -> tuple[dict[str, tuple[list[float], list[float]]], dict[str, Tally]]:
    """Per system, reads/s and CPU ms per read, one sample a round; and its tally."""
    primary, standby = nodes.url("a"), nodes.url("b")
    sql = await captured_sql(primary, thread_id(0))
    floor = Floor(sql, thread_id(0))
    await floor.open(primary, args.concurrency)
    pool = {"pool_size": args.pool, "max_overflow": 0} if args.pool else None
    systems: dict[str, Any] = {
        FLOOR: floor,
        ALONE: Repository(CheckpointRepository(primary, engine_options=pool)),
        REPLICA: Repository(
            CheckpointRepository(
                primary, replica_urls=[standby], max_replica_lag=args.max_lag, engine_options=pool
            )
        ),
    }
    stop = asyncio.Event()
    ticking = asyncio.create_task(ticker(primary, stop)) if args.delay else None
    try:
        for system in systems.values():  # the same answers everywhere
            for kind in KINDS:
                counts = {await system.read(kind, thread_id(1), 0) for _ in range(2)}
                expected = {"states": args.versions, "messages": 2 * args.versions}.get(
                    kind, min(50, args.threads)
                )
                if counts != {expected}:
                    raise RuntimeError(f"{kind}: read {counts} rows, expected {expected}")
        if ticking is not None:
            await asyncio.sleep(args.delay + 1)  # the standby past its delay, ticking
        rng = random.Random(args.seed)
        for system in systems.values():  # warm: pools, statement caches, the first probe
            await one_round(system.read, plans(args, rng))
        for system in systems.values():
            system.tally = Tally()
        samples: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in systems}
        reads = args.concurrency * args.reads
        gc.collect()
        for _ in range(args.rounds):
            order = list(systems)
            rng.shuffle(order)
            plan = plans(args, rng)  # the same reads on every system
            for name in order:
                wall, cpu = time.perf_counter(), time.process_time()
                await one_round(systems[name].read, plan)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                samples[name][0].append(reads / wall)
                samples[name][1].append(cpu / reads * 1000)
                gc.collect()
        replicas = systems[REPLICA].repo.backend.replicas
        served = sum(r.served for r in replicas.replicas)
        print(
            f"replica set counters (warm-up included): {served} served by the replica,"
            f" {replicas.primary_reads} by the primary",
            file=sys.stderr,
        )
        return samples, {name: system.tally for name, system in systems.items()}
    finally:
        stop.set()
        if ticking is not None:
            await ticking
        for system in systems.values():
            await system.aclose()


def paired(a: list[float], b: list[float]) -> float:
    """The median of each round's ``a / b``."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def report(
    args: argparse.Namespace,
    samples: dict[str, tuple[list[float], list[float]]],
    tallies: dict[str, Tally],
) -> None:
    print(
        f"{args.threads} threads x {args.versions} versions, {2 * args.versions} messages;"
        f" {args.concurrency} tasks x {args.reads} reads a round, {args.rounds} round(s);"
        f" repository pools: {args.pool or 'the default 10 + 10'} connections;"
        f" standby replay delay {args.delay:g} s, max_replica_lag {args.max_lag:g} s\n"
    )
    print(
        "| system | reads/s (p50) | client CPU ms/read (p50) | reads/s vs floor"
        " | CPU vs floor | reads/s vs primary alone | CPU vs primary alone"
        " | served by the replica | lag probes |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    floor_rate, floor_cpu = samples[FLOOR]
    alone_rate, alone_cpu = samples[ALONE]
    for name, (rate, cpu) in samples.items():
        tally = tallies[name]
        share = f"{tally.replica / tally.reads:.0%}" if tally.reads else "-"
        versus = (
            f"{paired(rate, alone_rate):.2f} | {paired(cpu, alone_cpu):.2f}"
            if name == REPLICA
            else "- | -"
        )
        print(
            f"| {name} | {statistics.median(rate):,.0f} | {statistics.median(cpu):.3f}"
            f" | {paired(rate, floor_rate):.2f} | {paired(cpu, floor_cpu):.2f} | {versus}"
            f" | {share} | {tally.probes if name != FLOOR else '-'} |"
        )


async def run(args: argparse.Namespace, nodes: PgPair) -> None:
    started_at = time.perf_counter()
    await seed(nodes.url("a"), args.threads, args.versions, args.seed)
    poll(lambda: replayed(nodes), "the standby replaying the read set", timeout=120)
    seeded = time.perf_counter() - started_at
    if args.delay:
        delay_replay(nodes, args.delay)
    samples, tallies = await measure(args, nodes)
    report(args, samples, tallies)
    print(
        f"\nseeded and replayed in {seeded:.1f} s; measured in"
        f" {time.perf_counter() - started_at - seeded:.1f} s",
        file=sys.stderr,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--reads", type=int, default=30, help="reads a task and round")
    parser.add_argument("--concurrency", type=int, default=16, help="tasks reading at once")
    parser.add_argument("--threads", type=int, default=200, help="threads in the read set")
    parser.add_argument("--versions", type=int, default=10, help="state versions a thread")
    parser.add_argument("--delay", type=float, default=0.0, help="standby replay delay, s")
    parser.add_argument("--max-lag", type=float, default=5.0, help="max_replica_lag, s")
    parser.add_argument(
        "--pool",
        type=int,
        default=None,
        help="connections a repository pool holds, each database (default: --concurrency;"
        " 0: the library's default, 10 and 10 more that close when they come back)",
    )
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    if args.pool is None:
        args.pool = args.concurrency
    if not available():
        sys.exit("needs PostgreSQL 15's server programs in /usr/lib/postgresql/15/bin")
    print(f"tenxstore from {Path(tenxstore.__file__).parent}", file=sys.stderr)
    began = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="replica-bench-") as directory,
        started(Path(directory), synchronous=False) as nodes,
    ):
        print(f"pair started in {time.perf_counter() - began:.1f} s", file=sys.stderr)
        asyncio.run(run(args, nodes))
    print(f"total {time.perf_counter() - began:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
