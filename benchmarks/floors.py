"""tenxstore against the physical floor: the fewest round trips the work needs, on the
raw driver, prepared, on a held connection.

Every turn of a conversation reads the thread's head state and writes the next one
(a ~5 KB state with some nulls, two new messages). Each system keeps its own thread;
inside a turn the systems run in a shuffled order, in one process, so machine noise
hits them alike. Wall time and this process's CPU time are recorded per operation.

Floors (asyncpg / redis-py / sqlite3 directly):

* ``floor-pg``: the write is ONE prepared statement in autocommit — data-modifying CTEs
  that compare-and-swap the version, insert the state and the new messages (``unnest``,
  ``ON CONFLICT DO NOTHING``) and prune — and the read ONE prepared ``SELECT`` of the
  head state plus ``orjson.loads``, on one held connection;
* ``floor-redis``: one ``GET`` + ``orjson.loads`` (cached read); one ``SET`` beside the
  write floor (cached write);
* ``floor-sqlite``: the same transaction with the ``sqlite3`` module, in one
  ``asyncio.to_thread`` hop (and the read in one hop);
* ``floor-mysql``: MariaDB/MySQL on a held asyncmy connection in autocommit: the write
  ONE prepared ``CALL`` of a procedure (compare-and-swap, state, messages, prune and
  COMMIT) and the read ONE prepared ``SELECT`` plus ``orjson.loads`` (see
  ``benchmarks/mysql_floor.py``);
* ``floor-pgbouncer``: through a transaction-pooling PgBouncer 1.18 (no prepared
  statements in transaction mode), ONE simple Query each on a held connection: the
  write statement and the read with values as literals, rows as binary ``COPY``;
* ``reference-7``: the old baseline — BEGIN, lock, state, messages, bump, prune, COMMIT
  on asyncpg — as a reference row, not a target.

tenxstore: ``tenx-pg`` (``CheckpointRepository``), ``tenx-pg+redis``
(``CachedCheckpointer``), ``tenx-sqlite``, ``tenx-mysql`` (MariaDB,
``TENXSTORE_BENCH_MYSQL_URL``; a database of its own is created beside the URL's),
``tenx-pgbouncer`` (``pool_mode="transaction"``, through a PgBouncer started as the
tests start theirs: the ``pgbouncer`` binary).

    python benchmarks/floors.py                  # writes docs/benchmarks.md and the plot
    python benchmarks/floors.py --turns 100 --runs 1 --tp-turns 10 --out /tmp/b.md

Needs PostgreSQL and Redis (TENXSTORE_BENCH_PG_URL / TENXSTORE_BENCH_REDIS_URL, the
local services by default) and ``pip install -e ".[bench]"``.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import orjson
from mysql_floor import MysqlFloor, mysql_database, mysql_throughput
from redis.asyncio import Redis
from workload import (
    MYSQL_URL,
    PG_URL,
    REDIS_URL,
    ROOT,
    drop_schema,
    kept_sections,
    next_state,
    pct,
    timed_runs,
    turn_messages,
)

from tenxstore import CachedCheckpointer, CheckpointRepository
from tenxstore.serde import encode, encode_state
from tests.servers import PgWire, TcpProxy

HISTORY = 20  # state_history_limit of every system
USER = "u"

Op = Callable[[dict[str, Any], list[dict[str, Any]]], Awaitable[Any]]


@dataclass
class System:
    """One system: how it reads its thread's head, and writes a turn."""

    name: str
    read: Callable[[], Awaitable[Any]] | None  # None: a write-only reference
    write: Op


@dataclass
class Samples:
    """Wall and CPU seconds per operation, by system."""

    wall: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cpu: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    async def time(self, key: str, call: Awaitable[Any]) -> Any:
        cpu, wall = time.process_time(), time.perf_counter()
        result = await call
        self.wall[key].append(time.perf_counter() - wall)
        self.cpu[key].append(time.process_time() - cpu)
        return result

    def p50(self, key: str) -> float:
        return statistics.median(self.wall[key])

    def cpu50(self, key: str) -> float:
        return statistics.median(self.cpu[key])


# -- the floors ------------------------------------------------------------------------


def q(schema: str) -> str:
    return f'"{schema}"'


def floor_write_sql(schema: str) -> str:
    s = q(schema)
    return f"""
WITH cas AS (
  UPDATE {s}.threads SET version = version + 1, updated_at = $4
  WHERE thread_id = $1 AND user_id = $2 AND version = $3 RETURNING version),
new_state AS (
  INSERT INTO {s}.states (thread_id, version, state_data, created_at)
  SELECT $1, version, $5, $4 FROM cas),
new_messages AS (
  INSERT INTO {s}.messages (thread_id, message_id, role, payload, created_at)
  SELECT $1, b.id, b.role, b.payload, $4
  FROM cas, unnest($6::text[], $7::text[], $8::text[]) WITH ORDINALITY AS b(id, role, payload, o)
  ORDER BY b.o ON CONFLICT DO NOTHING),
pruned AS (
  DELETE FROM {s}.states WHERE thread_id = $1
  AND version <= (SELECT version FROM cas) - {HISTORY})
SELECT version FROM cas"""


def floor_read_sql(schema: str) -> str:
    s = q(schema)
    return (
        f"SELECT s.state_data FROM {s}.threads t JOIN {s}.states s "
        "ON s.thread_id = t.thread_id AND s.version = t.version "
        "WHERE t.thread_id = $1 AND t.user_id = $2"
    )


def message_rows(messages: list[dict[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    return (
        [m["id"] for m in messages],
        [m["role"] for m in messages],
        [orjson.dumps(m).decode() for m in messages],
    )


async def new_thread(con: asyncpg.Connection, schema: str, thread: str) -> None:
    await con.execute(
        f"INSERT INTO {q(schema)}.threads (thread_id, user_id, version, created_at, updated_at)"
        " VALUES ($1, $2, 0, now(), now())",
        thread,
        USER,
    )


class PgFloor:
    """The write and read floors on one held, prepared asyncpg connection."""

    def __init__(self, con: asyncpg.Connection, schema: str, thread: str) -> None:
        self.con, self.schema, self.thread = con, schema, thread
        self.version = 0

    async def prepare(self) -> PgFloor:
        await new_thread(self.con, self.schema, self.thread)
        self.write_stmt = await self.con.prepare(floor_write_sql(self.schema))
        self.read_stmt = await self.con.prepare(floor_read_sql(self.schema))
        return self

    async def write(self, state: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        payload = orjson.dumps(state).decode()
        now = datetime.now(timezone.utc)
        version = await self.write_stmt.fetchval(
            self.thread, USER, self.version, now, payload, *message_rows(messages)
        )
        assert version == self.version + 1, "the floor's compare-and-swap failed"
        self.version = version

    async def read(self) -> Any:
        return orjson.loads(await self.read_stmt.fetchval(self.thread, USER))


class Reference7:
    """The old baseline: seven statements in a transaction (a reference row)."""

    def __init__(self, con: asyncpg.Connection, schema: str, thread: str) -> None:
        self.con, self.schema, self.thread = con, schema, thread

    async def prepare(self) -> Reference7:
        await new_thread(self.con, self.schema, self.thread)
        s = q(self.schema)
        c = self.con
        self.lock = await c.prepare(
            f"SELECT version FROM {s}.threads WHERE thread_id = $1 AND user_id = $2 FOR UPDATE"
        )
        self.state = await c.prepare(
            f"INSERT INTO {s}.states (thread_id, version, state_data, created_at)"
            " VALUES ($1, $2, $3, $4)"
        )
        self.messages = await c.prepare(
            f"INSERT INTO {s}.messages (thread_id, message_id, role, payload, created_at)"
            " SELECT $1, b.id, b.role, b.payload, $5"
            " FROM unnest($2::text[], $3::text[], $4::text[]) AS b(id, role, payload)"
            " ON CONFLICT DO NOTHING"
        )
        self.bump = await c.prepare(
            f"UPDATE {s}.threads SET version = $2, updated_at = $3 WHERE thread_id = $1"
        )
        self.prune = await c.prepare(
            f"DELETE FROM {s}.states WHERE thread_id = $1 AND version <= $2"
        )
        return self

    async def write(self, state: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        now = datetime.now(timezone.utc)
        async with self.con.transaction():
            version = await self.lock.fetchval(self.thread, USER) + 1
            await self.state.fetch(self.thread, version, orjson.dumps(state).decode(), now)
            await self.messages.fetch(self.thread, *message_rows(messages), now)
            await self.bump.fetch(self.thread, version, now)
            await self.prune.fetch(self.thread, version - HISTORY)


class RedisFloor:
    """One GET + orjson.loads; one SET of the same text."""

    def __init__(self, client: Redis, key: str) -> None:
        self.client, self.key = client, key

    async def write(self, state: dict[str, Any]) -> None:
        await self.client.set(self.key, orjson.dumps(state), px=86_400_000)

    async def read(self) -> Any:
        return orjson.loads(await self.client.get(self.key))


class SqliteFloor:
    """The SQLite transaction with the sqlite3 module, one thread hop per call."""

    def __init__(self, path: Path, thread: str) -> None:
        self.path, self.thread = path, thread
        self.version = 0

    def prepare(self) -> SqliteFloor:
        con = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA busy_timeout=30000")
        con.execute(
            "INSERT INTO threads (thread_id, user_id, version, created_at, updated_at)"
            " VALUES (?, ?, 0, ?, ?)",
            (self.thread, USER, "2026-01-01", "2026-01-01"),
        )
        self.con = con
        return self

    def _write(self, payload: str, rows: list[tuple[Any, ...]], now: str) -> int:
        c = self.con
        c.execute("BEGIN IMMEDIATE")
        try:
            done = c.execute(
                "UPDATE threads SET version = version + 1, updated_at = ?"
                " WHERE thread_id = ? AND user_id = ? AND version = ?",
                (now, self.thread, USER, self.version),
            )
            assert done.rowcount == 1, "the floor's compare-and-swap failed"
            version = self.version + 1
            c.execute(
                "INSERT INTO states (thread_id, version, state_data, created_at)"
                " VALUES (?, ?, ?, ?)",
                (self.thread, version, payload, now),
            )
            c.executemany(
                "INSERT OR IGNORE INTO messages (thread_id, message_id, role, payload,"
                " created_at) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            c.execute(
                "DELETE FROM states WHERE thread_id = ? AND version <= ?",
                (self.thread, version - HISTORY),
            )
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return version

    async def write(self, state: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        now = datetime.now(timezone.utc).isoformat()
        payload = orjson.dumps(state).decode()
        ids, roles, payloads = message_rows(messages)
        rows = [(self.thread, i, r, p, now) for i, r, p in zip(ids, roles, payloads, strict=True)]
        self.version = await asyncio.to_thread(self._write, payload, rows, now)

    def _read(self) -> Any:
        text = self.con.execute(
            "SELECT s.state_data FROM threads t JOIN states s ON s.thread_id = t.thread_id"
            " AND s.version = t.version WHERE t.thread_id = ? AND t.user_id = ?",
            (self.thread, USER),
        ).fetchone()[0]
        return orjson.loads(text)

    async def read(self) -> Any:
        return await asyncio.to_thread(self._read)


def tenx_system(name: str, cp: Any, thread: str, cached: bool) -> System:
    config = {"thread_id": thread, "user_id": USER}

    async def read() -> Any:
        if cached:
            return await cp.aget_state_cache(config)
        return await cp.aget_state(config)

    async def write(state: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        await cp.aput_checkpoint(config, state, messages)

    return System(name, read, write)


# -- behind PgBouncer (transaction pooling) ---------------------------------------------


def bouncer_url() -> str:
    """PG_URL through a transaction-pooling PgBouncer started as the tests start theirs
    (``tests.services.pgbouncer_url``; PgBouncer passes any database through)."""
    from tests import services

    port = urlsplit(services.pgbouncer_url()).port
    parts = urlsplit(PG_URL)
    return PG_URL.replace(parts.netloc, f"{parts.username or 'postgres'}@127.0.0.1:{port}")


def dollar(text: str) -> str:
    """A string literal that no character of ``text`` can end (the floor's quoting)."""
    tag = "f" + uuid.uuid4().hex
    assert tag not in text and "\x00" not in text
    return f"${tag}${text}${tag}$"


def text_array(values: list[str]) -> str:
    return "ARRAY[" + ", ".join(dollar(v) for v in values) + "]::text[]" if values else "'{}'"


def copy_fields(data: bytes) -> list[bytes | None]:
    """The fields of the first row of a binary COPY (none: an empty list)."""
    at = 19 + int.from_bytes(data[15:19], "big")  # signature, flags, header extension
    count = int.from_bytes(data[at : at + 2], "big", signed=True)
    at += 2
    out: list[bytes | None] = []
    for _ in range(max(count, 0)):
        size = int.from_bytes(data[at : at + 4], "big", signed=True)
        at += 4
        out.append(None if size < 0 else data[at : at + size])
        at += max(size, 0)
    return out


class BouncerFloor:
    """The floors through PgBouncer 1.18 in transaction mode (no prepared statements):
    ONE simple Query each, values as literals, rows as binary COPY, on a held
    connection. The write is the session floor's one statement in autocommit — one
    round trip, though its outcome after a lost link cannot be told (tenxstore takes
    two: see ``tenxstore.backends.pgbouncer``)."""

    def __init__(self, con: asyncpg.Connection, schema: str, thread: str) -> None:
        self.con, self.schema, self.thread = con, schema, thread
        self.version = 0

    async def prepare(self) -> BouncerFloor:
        await new_thread(self.con, self.schema, self.thread)
        return self

    async def _copy(self, sql: str) -> list[bytes | None]:
        data: list[bytes] = []

        async def sink(chunk: bytes) -> None:
            data.append(chunk)

        await self.con.copy_from_query(sql, output=sink, format="binary")
        return copy_fields(b"".join(data))

    async def write(self, state: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        now = f"'{datetime.now(timezone.utc).isoformat()}'::timestamptz"
        ids, roles, payloads = message_rows(messages)
        s = q(self.schema)
        thread = dollar(self.thread)
        sql = f"""
WITH cas AS (
  UPDATE {s}.threads SET version = version + 1, updated_at = {now}
  WHERE thread_id = {thread} AND user_id = {dollar(USER)} AND version = {self.version}
  RETURNING version),
new_state AS (
  INSERT INTO {s}.states (thread_id, version, state_data, created_at)
  SELECT {thread}, version, {dollar(orjson.dumps(state).decode())}, {now} FROM cas),
new_messages AS (
  INSERT INTO {s}.messages (thread_id, message_id, role, payload, created_at)
  SELECT {thread}, b.id, b.role, b.payload, {now}
  FROM cas, unnest({text_array(ids)}::text[], {text_array(roles)}::text[],
    {text_array(payloads)}::text[]) WITH ORDINALITY AS b(id, role, payload, o)
  ORDER BY b.o ON CONFLICT DO NOTHING),
pruned AS (
  DELETE FROM {s}.states WHERE thread_id = {thread}
  AND version <= (SELECT version FROM cas) - {HISTORY})
SELECT version FROM cas"""
        (version,) = await self._copy(sql)
        assert version is not None, "the floor's compare-and-swap failed"
        self.version = int.from_bytes(version, "big", signed=True)

    async def read(self) -> Any:
        s = q(self.schema)
        (state,) = await self._copy(
            f"SELECT s.state_data FROM {s}.threads t JOIN {s}.states s "
            "ON s.thread_id = t.thread_id AND s.version = t.version "
            f"WHERE t.thread_id = {dollar(self.thread)} AND t.user_id = {dollar(USER)}"
        )
        assert state is not None
        return orjson.loads(state)


async def bouncer_leg(schema: str) -> tuple[list[System], list[Callable[[], Awaitable[Any]]]]:
    """``floor-pgbouncer`` and ``tenx-pgbouncer`` (``pool_mode="transaction"``) on the
    run's schema, through one PgBouncer; and their closers."""
    url = bouncer_url()
    con = await asyncpg.connect(url, statement_cache_size=0)
    floor = await BouncerFloor(con, schema, "floor-bouncer").prepare()
    tenx = CheckpointRepository(
        url, schema=schema, state_history_limit=HISTORY, pool_mode="transaction"
    )
    await tenx.asetup()
    systems = [
        System("floor-pgbouncer", floor.read, floor.write),
        tenx_system("tenx-pgbouncer", tenx, "tenx-bouncer", cached=False),
    ]
    return systems, [tenx.aclose, con.close]


def bouncer_rows(runs: list[Samples]) -> list[str]:
    """The summary table's PgBouncer rows."""
    return [
        ratio_row(
            "PgBouncer write: tenx-pgbouncer / write floor (1 round trip; tenxstore takes 2)",
            runs,
            "tenx-pgbouncer/write",
            "floor-pgbouncer/write",
            "≤ 2",
        ),
        ratio_row(
            "PgBouncer read: tenx-pgbouncer / read floor (1 round trip)",
            runs,
            "tenx-pgbouncer/read",
            "floor-pgbouncer/read",
            "≤ 1.5",
        ),
    ]


# -- the sequential run ----------------------------------------------------------------


@dataclass
class Setup:
    systems: list[System]
    cached_write_floor: tuple[PgFloor, RedisFloor] | None
    closers: list[Callable[[], Awaitable[Any]]]
    schema: str
    sqlite_path: Path


async def build(run: str, sqlite_dir: Path) -> Setup:
    schema = f"floors_{run}"
    tenx = CheckpointRepository(PG_URL, schema=schema, state_history_limit=HISTORY)
    await tenx.asetup()
    cached = CachedCheckpointer(
        CheckpointRepository(PG_URL, schema=schema, state_history_limit=HISTORY),
        redis_url=REDIS_URL,
        key_prefix=f"floors-{run}",
    )
    path = sqlite_dir / "floors.db"
    tenx_sqlite = CheckpointRepository(f"sqlite:///{path}", state_history_limit=HISTORY)
    await tenx_sqlite.asetup()
    floor_con = await asyncpg.connect(PG_URL)
    ref_con = await asyncpg.connect(PG_URL)
    redis = Redis.from_url(REDIS_URL)
    pg_floor = await PgFloor(floor_con, schema, "floor").prepare()
    reference = await Reference7(ref_con, schema, "reference").prepare()
    cached_floor_pg = await PgFloor(floor_con, schema, "floor-cached").prepare()
    redis_floor = RedisFloor(redis, f"floors-{run}:floor")
    sqlite_floor = SqliteFloor(path, "floor").prepare()
    mysql_db = f"floors_{run}"
    await mysql_database(mysql_db)
    base = MYSQL_URL.rsplit("/", 1)[0]
    tenx_mysql = CheckpointRepository(f"{base}/{mysql_db}", state_history_limit=HISTORY)
    await tenx_mysql.asetup()
    mysql_floor = await MysqlFloor(mysql_db, "floor", HISTORY).prepare()

    async def cached_floor_write(state: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        await cached_floor_pg.write(state, messages)
        await redis_floor.write(state)

    systems = [
        System("floor-pg", pg_floor.read, pg_floor.write),
        System("floor-redis", redis_floor.read, cached_floor_write),
        System("floor-sqlite", sqlite_floor.read, sqlite_floor.write),
        System("reference-7", None, reference.write),
        tenx_system("tenx-pg", tenx, "tenx", cached=False),
        tenx_system("tenx-pg+redis", cached, "tenx-cached", cached=True),
        tenx_system("tenx-sqlite", tenx_sqlite, "tenx", cached=False),
        System("floor-mysql", mysql_floor.read, mysql_floor.write),
        tenx_system("tenx-mysql", tenx_mysql, "tenx", cached=False),
    ]
    bouncer_systems, bouncer_closers = await bouncer_leg(schema)
    systems += bouncer_systems

    async def close_mysql() -> None:
        mysql_floor.con.close()
        await mysql_database(mysql_db, drop=True)

    async def close_redis() -> None:
        keys = [k async for k in redis.scan_iter(match=f"floors-{run}*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()

    closers: list[Callable[[], Awaitable[Any]]] = [
        *bouncer_closers,
        tenx.aclose,
        cached.aclose,
        tenx_sqlite.aclose,
        tenx_mysql.aclose,
        close_mysql,
        floor_con.close,
        ref_con.close,
        close_redis,
    ]
    sqlite_floor_close = sqlite_floor.con.close

    async def close_sqlite_floor() -> None:
        sqlite_floor_close()

    closers.append(close_sqlite_floor)
    return Setup(systems, (cached_floor_pg, redis_floor), closers, schema, path)


async def sequential(turns: int, seed: int, samples: Samples) -> dict[str, Any]:
    """One conversation of ``turns`` turns per system, the systems shuffled per turn."""
    run = uuid.uuid4().hex[:8]
    rng = random.Random(seed)
    order = random.Random(seed + 1)
    with tempfile.TemporaryDirectory() as tmp:
        setup = await build(run, Path(tmp))
        context: list[dict[str, Any]] = []
        try:
            for turn in range(turns):
                messages = turn_messages(turn, rng)
                context = [*context, *messages]
                state = next_state(turn, context, rng)
                systems = list(setup.systems)
                order.shuffle(systems)
                for system in systems:
                    if turn and system.read is not None:  # turn 0 has nothing to read
                        await samples.time(f"{system.name}/read", system.read())
                    await samples.time(f"{system.name}/write", system.write(state, messages))
        finally:
            for close in setup.closers:
                await close()
        try:
            hot = await hot_updates(setup.schema)
        finally:
            await drop_schema(PG_URL, setup.schema)
    return {"hot": hot, "state_bytes": len(encode_state(state))}


async def hot_updates(schema: str) -> dict[str, int]:
    """HOT and dead rows of the threads table, once every writer has closed (a backend
    flushes its statistics as it exits)."""
    con = await asyncpg.connect(PG_URL)
    try:
        for _ in range(50):
            row = await con.fetchrow(
                "SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup FROM pg_stat_user_tables"
                " WHERE schemaname = $1 AND relname = 'threads'",
                schema,
            )
            if row is not None and row["n_tup_upd"]:
                break
            await asyncio.sleep(0.1)  # statistics arrive asynchronously
            await con.execute("SELECT pg_stat_clear_snapshot()")
    finally:
        await con.close()
    if row is None:
        return {"updates": 0, "hot": 0, "dead": 0}
    return {"updates": row["n_tup_upd"], "hot": row["n_tup_hot_upd"], "dead": row["n_dead_tup"]}


# -- throughput --------------------------------------------------------------------------


async def _no_reset(_con: asyncpg.Connection) -> None:
    return None


async def throughput(conversations: int, turns: int, seed: int) -> dict[str, dict[str, float]]:
    """``conversations`` concurrent conversations of ``turns`` turns (read + write each),
    on a pool of 10 connections: the floor on asyncpg's pool (no reset query on release),
    then tenxstore on its own pool of 10, in a shuffled order."""
    run = uuid.uuid4().hex[:8]
    schema = f"floors_tp_{run}"
    tenx = CheckpointRepository(
        PG_URL,
        schema=schema,
        state_history_limit=HISTORY,
        engine_options={"pool_size": 10, "max_overflow": 0},
    )
    await tenx.asetup()
    pool = await asyncpg.create_pool(PG_URL, min_size=10, max_size=10, reset=_no_reset)
    assert pool is not None
    write_sql, read_sql = floor_write_sql(schema), floor_read_sql(schema)
    rng = random.Random(seed)
    data = []
    context: list[dict[str, Any]] = []
    for turn in range(turns):
        messages = turn_messages(turn, rng)
        context = [*context, *messages]
        data.append((next_state(turn, context, rng), messages))
    floor_versions = [0] * conversations
    configs = [{"thread_id": f"tenx-{c}", "user_id": USER} for c in range(conversations)]

    async def floor_write(c: int, state: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        async with pool.acquire() as con:
            if floor_versions[c] == 0:
                await new_thread(con, schema, f"floor-{c}")
            floor_versions[c] = await con.fetchval(
                write_sql,
                f"floor-{c}",
                USER,
                floor_versions[c],
                datetime.now(timezone.utc),
                orjson.dumps(state).decode(),
                *message_rows(messages),
            )

    async def floor_conversation(c: int) -> None:
        for state, messages in data[1:]:
            async with pool.acquire() as con:
                orjson.loads(await con.fetchval(read_sql, f"floor-{c}", USER))
            await floor_write(c, state, messages)

    async def tenx_conversation(c: int) -> None:
        for state, messages in data[1:]:
            await tenx.aget_state(configs[c])
            await tenx.aput_checkpoint(configs[c], state, messages)

    try:
        # Untimed: every conversation's first turn (which creates its thread) opens the
        # pools' connections; the steady turns after it are timed.
        state, messages = data[0]
        await asyncio.gather(*(floor_write(c, state, messages) for c in range(conversations)))
        await asyncio.gather(
            *(tenx.aput_checkpoint(configs[c], state, messages) for c in range(conversations))
        )
        results = await timed_runs(
            [("floor-pg", floor_conversation), ("tenx-pg", tenx_conversation)],
            conversations,
            turns,
            seed,
        )
    finally:
        await pool.close()
        await tenx.aclose()
        await drop_schema(PG_URL, schema)
    return results


# -- on the wire ---------------------------------------------------------------------------


async def on_the_wire(ops: int = 20) -> dict[str, tuple[int, int]]:
    """Statements and round trips per operation, counted on the wire by a proxy
    (median over ``ops`` steady operations; COMMIT and ROLLBACK included)."""
    wire = PgWire()
    link = await TcpProxy(urlsplit(PG_URL).port or 5432, parser=wire.reader()).start()
    parts = urlsplit(PG_URL)
    url = PG_URL.replace(parts.netloc, f"{parts.username}@127.0.0.1:{link.port}")
    run = uuid.uuid4().hex[:8]
    schema = f"floors_wire_{run}"
    counts: dict[str, list[tuple[int, int]]] = defaultdict(list)
    tenx = CheckpointRepository(url, schema=schema, state_history_limit=HISTORY)
    await tenx.asetup()
    con = await asyncpg.connect(url)
    ref_con = await asyncpg.connect(url)
    try:
        floor = await PgFloor(con, schema, "floor").prepare()
        reference = await Reference7(ref_con, schema, "reference").prepare()
        system = tenx_system("tenx-pg", tenx, "tenx", cached=False)
        rng = random.Random(3)
        context: list[dict[str, Any]] = []
        for turn in range(ops + 2):
            messages = turn_messages(turn, rng)
            context = [*context, *messages]
            state = next_state(turn, context, rng)
            for name, write, read in (
                ("floor-pg", floor.write, floor.read),
                ("reference-7", reference.write, None),
                ("tenx-pg", system.write, system.read),
            ):
                wire.reset()
                await write(state, messages)
                if turn >= 2:  # the first write of a thread, and warm-up, are not steady
                    counts[f"{name}/write"].append((wire.statements, wire.round_trips))
                if read is not None:
                    wire.reset()
                    await read()
                    if turn >= 2:
                        counts[f"{name}/read"].append((wire.statements, wire.round_trips))
    finally:
        await con.close()
        await ref_con.close()
        await tenx.aclose()
        await link.close()
        await drop_schema(PG_URL, schema)
    return {
        key: (
            int(statistics.median(s for s, _ in found)),
            int(statistics.median(r for _, r in found)),
        )
        for key, found in counts.items()
    }


# -- encoding --------------------------------------------------------------------------------


def encoding(seed: int) -> dict[str, float]:
    """Encoding the benchmark's state (with its nulls): tenxstore's exact encoder
    against ``orjson.dumps`` alone, microseconds per call."""
    rng = random.Random(seed)
    context: list[dict[str, Any]] = []
    for turn in range(30):
        context += turn_messages(turn, rng)
    state = next_state(30, context, rng)
    assert b"null" in orjson.dumps(state)

    def best(fn: Callable[[], Any], n: int = 5000) -> float:
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            runs.append((time.perf_counter() - start) / n)
        return min(runs) * 1e6

    return {
        "orjson": best(lambda: orjson.dumps(state)),
        "tenxstore": best(lambda: encode(state)),
        "bytes": float(len(orjson.dumps(state))),
    }


# -- the report ------------------------------------------------------------------------------


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def ratio_row(
    label: str, runs: list[Samples], top: str, bottom: str | list[str], target: str
) -> str:
    """The ratio of p50s in each run: its median and spread over the runs."""
    bottoms = [bottom] if isinstance(bottom, str) else bottom
    values = [r.p50(top) / sum(r.p50(b) for b in bottoms) for r in runs]
    spread = f"{min(values):.2f} to {max(values):.2f}" if len(values) > 1 else "—"
    return f"| {label} | {statistics.median(values):.2f} | {spread} | {target} |"


def report(
    runs: list[Samples],
    extra: dict[str, Any],
    tp: dict[int, list[dict[str, dict[str, float]]]],
    wire: dict[str, tuple[int, int]],
    enc: dict[str, float],
    args: argparse.Namespace,
) -> str:
    lines = [
        "# Benchmarks: tenxstore against the physical floor",
        "",
        f"Generated by `python benchmarks/floors.py --turns {args.turns} --runs {args.runs}"
        f" --tp-turns {args.tp_turns}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
        f"Machine: {platform.machine()}, {_cores()} cores, {platform.system()}"
        f" {platform.release()}, Python {platform.python_version()}; PostgreSQL and Redis on"
        " loopback. State: "
        f"{extra['state_bytes']:,} bytes of JSON with nulls; two new messages per turn;"
        f" `state_history_limit={HISTORY}`.",
        "",
        "Each run is one conversation per system; inside every turn the systems go in a"
        " shuffled order (one process). The floors are the fewest round trips the work"
        " needs on the raw driver, prepared, on a held connection (see"
        " `benchmarks/floors.py`). Ratios are of medians (p50) within one run; the"
        f" spread is over {len(runs)} run(s).",
        "",
        "## Ratios (p50)",
        "",
        "| ratio | median | spread | target |",
        "|---|---|---|---|",
        ratio_row(
            "PostgreSQL durable write: tenx-pg / write floor",
            runs,
            "tenx-pg/write",
            "floor-pg/write",
            "≤ 1.5",
        ),
        ratio_row(
            "uncached read: tenx-pg / read floor",
            runs,
            "tenx-pg/read",
            "floor-pg/read",
            "≤ 1.5",
        ),
        ratio_row(
            "cached read: tenx-pg+redis / Redis GET + loads",
            runs,
            "tenx-pg+redis/read",
            "floor-redis/read",
            "≤ 1.2",
        ),
        ratio_row(
            "cached write: tenx-pg+redis / (write floor + Redis SET)",
            runs,
            "tenx-pg+redis/write",
            "floor-redis/write",
            "≤ 1.5",
        ),
        ratio_row(
            "SQLite write: tenx-sqlite / sqlite3 in one hop",
            runs,
            "tenx-sqlite/write",
            "floor-sqlite/write",
            "≤ 2",
        ),
        ratio_row(
            "SQLite read: tenx-sqlite / sqlite3 in one hop",
            runs,
            "tenx-sqlite/read",
            "floor-sqlite/read",
            "≤ 2",
        ),
        ratio_row(
            "MariaDB write: tenx-mysql / write floor (one prepared CALL)",
            runs,
            "tenx-mysql/write",
            "floor-mysql/write",
            "≤ 1.5",
        ),
        ratio_row(
            "MariaDB read: tenx-mysql / read floor (one prepared SELECT)",
            runs,
            "tenx-mysql/read",
            "floor-mysql/read",
            "≤ 1.5",
        ),
        *bouncer_rows(runs),
        ratio_row(
            "reference: 7 statements in a transaction / write floor",
            runs,
            "reference-7/write",
            "floor-pg/write",
            "(not a target)",
        ),
        "",
        "## Per operation, first run (microseconds; CPU is this process's)",
        "",
        "| system | read p50 | read p99 | read CPU | write p50 | write p99 | write CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    first = runs[0]
    names = sorted({k.split("/")[0] for k in first.wall})
    for name in names:
        cells = []
        for op in ("read", "write"):
            key = f"{name}/{op}"
            if key in first.wall:
                cells += [
                    us(first.p50(key)),
                    us(pct(first.wall[key], 0.99)),
                    us(first.cpu50(key)),
                ]
            else:
                cells += ["—", "—", "—"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "`floor-redis` writes are the write floor followed by one Redis `SET`: the floor of"
        " a cached write.",
        "",
        "## Statements and round trips per steady operation, on the wire",
        "",
        "Counted by a proxy between the client and PostgreSQL (Execute and Query messages;"
        " a round trip is each Sync or Query), COMMIT and ROLLBACK included.",
        "",
        "| system | read (statements, round trips) | write (statements, round trips) |",
        "|---|---|---|",
    ]
    for name in ("floor-pg", "tenx-pg", "reference-7"):
        read = wire.get(f"{name}/read")
        write = wire[f"{name}/write"]
        lines.append(
            f"| {name} | {'—' if read is None else f'{read[0]}, {read[1]}'} |"
            f" {write[0]}, {write[1]} |"
        )
    lines += [
        "",
        "## Throughput: concurrent conversations, a pool of 10 connections",
        "",
        "Each conversation reads and writes its own thread; operations per second over"
        " every conversation, and this process's CPU per operation (median of the runs).",
        "",
        "| conversations | floor ops/s | tenx ops/s | tenx / floor | floor CPU/op (µs) |"
        " tenx CPU/op (µs) |",
        "|---|---|---|---|---|---|",
    ]
    lines += throughput_rows(tp, "pg")
    lines += [
        "",
        "MariaDB, the same conversations on asyncmy (the floor: a pool of 10 autocommit"
        " connections, its two statements prepared on each; tenxstore: its pool of 10):",
        "",
        "| conversations | floor ops/s | tenx ops/s | tenx / floor | floor CPU/op (µs) |"
        " tenx CPU/op (µs) |",
        "|---|---|---|---|---|---|",
    ]
    lines += throughput_rows(tp, "mysql")
    hot = extra["hot"]
    lines += [
        "",
        "Target: tenx / floor ≥ 0.8 at 8 and 32 conversations.",
        "",
        "## HOT updates of the thread row",
        "",
        f"In the first run's schema, after every system's writes: {hot['updates']:,} updates"
        f" of `threads`, {hot['hot']:,} of them HOT ({_share(hot['hot'], hot['updates'])}),"
        f" {hot['dead']:,} dead rows left. A version bump touches no indexed column"
        " (migration 0004 indexes `threads(user_id)` alone, and leaves 10% of each page"
        " free), so PostgreSQL updates the row in place of its page.",
        "",
        "## Encoding a state with nulls",
        "",
        f"The benchmark's state ({enc['bytes']:,.0f} bytes, with nulls): `orjson.dumps`"
        f" {enc['orjson']:.2f} µs, tenxstore's exact encoder {enc['tenxstore']:.2f} µs"
        f" ({enc['tenxstore'] / enc['orjson']:.1f} times; target: at most 2). orjson writes"
        " NaN and infinities as `null`, so a `null` in its output needs a look for non-finite"
        " floats: msgpack's float bytes, in C, and the tree is walked only on a candidate."
        " The target is out of reach so: that look alone (msgpack's encoding, then a"
        " search of its bytes) costs about 1.7 times orjson's whole encoding, and orjson"
        " has no option that keeps NaN apart from `null` (it was 6.3 times with a walk of"
        " the tree in Python).",
        "",
        "![p50 per operation against its floor](benchmark-floors.png)",
        "",
    ]
    return "\n".join(lines)


def throughput_rows(tp: dict[int, list[dict[str, dict[str, float]]]], db: str) -> list[str]:
    """The throughput table's rows of ``floor-<db>`` against ``tenx-<db>``."""
    lines = []
    floor_key, tenx_key = f"floor-{db}", f"tenx-{db}"
    for n, results in sorted(tp.items()):
        floor = statistics.median(r[floor_key]["ops_per_s"] for r in results)
        tenx = statistics.median(r[tenx_key]["ops_per_s"] for r in results)
        ratios = [r[tenx_key]["ops_per_s"] / r[floor_key]["ops_per_s"] for r in results]
        spread = f" ({min(ratios):.2f} to {max(ratios):.2f})" if len(ratios) > 1 else ""
        lines.append(
            f"| {n} | {floor:,.0f} | {tenx:,.0f} | {statistics.median(ratios):.2f}{spread} |"
            f" {us(statistics.median(r[floor_key]['cpu_per_op'] for r in results))} |"
            f" {us(statistics.median(r[tenx_key]['cpu_per_op'] for r in results))} |"
        )
    return lines


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "—"


def _cores() -> int:
    import os

    return os.cpu_count() or 0


def plot(runs: list[Samples], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = [
        ("PG write", "tenx-pg/write", "floor-pg/write"),
        ("PG read", "tenx-pg/read", "floor-pg/read"),
        ("cached read", "tenx-pg+redis/read", "floor-redis/read"),
        ("cached write", "tenx-pg+redis/write", "floor-redis/write"),
        ("SQLite write", "tenx-sqlite/write", "floor-sqlite/write"),
        ("SQLite read", "tenx-sqlite/read", "floor-sqlite/read"),
    ]
    first = runs[0]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    x = range(len(pairs))
    ax.bar([i - 0.2 for i in x], [first.p50(f) * 1e6 for _, _, f in pairs], 0.4, label="floor")
    ax.bar([i + 0.2 for i in x], [first.p50(t) * 1e6 for _, t, _ in pairs], 0.4, label="tenxstore")
    ax.set_xticks(list(x), [label for label, _, _ in pairs])
    ax.set_ylabel("p50 (µs)")
    ax.set_title("tenxstore against the physical floor, per operation")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tp-turns", type=int, default=100, help="turns per conversation")
    parser.add_argument("--tp-sizes", type=str, default="1,8,32")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args()

    runs, extra = [], {}
    for i in range(args.runs):
        samples = Samples()
        found = await sequential(args.turns, seed=7 + i, samples=samples)
        extra = extra or found
        runs.append(samples)
    tp: dict[int, list[dict[str, dict[str, float]]]] = defaultdict(list)
    for i in range(args.runs):
        for n in (int(s) for s in args.tp_sizes.split(",")):
            found = await throughput(n, args.tp_turns, seed=11 + i)
            found |= await mysql_throughput(n, args.tp_turns, seed=11 + i, history=HISTORY)
            tp[n].append(found)
    wire = await on_the_wire()
    enc = encoding(5)
    text = report(runs, extra, tp, wire, enc, args) + kept_sections(args.out)
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(text)
    plot(runs, args.out.parent / "benchmark-floors.png")
    print(text)


if __name__ == "__main__":
    asyncio.run(main())
