"""Faults under the pool: killed connections, killed writers, bounded lock waits."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from sqlalchemy import make_url

from tenxstore import (
    CheckpointRepository,
    ConnectionLost,
    DatabaseUnavailable,
    LockTimeout,
    StaleStateError,
    StatementCancelled,
)
from tenxstore.serde import encode_state
from tests.conftest import backend_for, cfg
from tests.servers import TcpProxy, free_port


async def backends(admin: Any, name: str, waiting: bool = False) -> list[int]:
    rows = await admin.fetch(
        "SELECT pid FROM pg_stat_activity, pg_stat_clear_snapshot() WHERE application_name = $1 "
        "AND pid <> pg_backend_pid() AND ($2 = false OR wait_event_type = 'Lock')",
        name,
        waiting,
    )
    return [r["pid"] for r in rows]


async def kill(admin: Any, pids: list[int], *, settle: bool = False) -> None:
    """Terminate backends; with ``settle``, also let them go and the client see it,
    as when a server drops idle connections some time before they are used again."""
    for pid in pids:
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
    if settle:
        deadline = time.monotonic() + 10
        while await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = any($1::int[])", pids
        ):
            assert time.monotonic() < deadline, "the backends did not exit"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # the client reads the EOF of each dropped socket


@pytest.fixture
async def admin(pg_url: str) -> Any:
    conn = await asyncpg.connect(pg_url)
    yield conn
    await conn.close()


def named_repo(pg_url: str, schema: str, **options: Any) -> tuple[CheckpointRepository, str]:
    name = f"tenx-{uuid.uuid4().hex[:8]}"
    engine_options = {"connect_args": {"server_settings": {"application_name": name}}}
    return CheckpointRepository(
        pg_url, schema=schema, engine_options=engine_options, **options
    ), name


async def test_killed_idle_connections_cost_nothing(
    pg_url: str, pg_schema: str, admin: Any
) -> None:
    repo, name = named_repo(pg_url, pg_schema)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aget_state(config)
        await repo.aput_state(config, {"n": 1})
        await kill(admin, await backends(admin, name))
        # A read on a dead pooled connection is retried once, on a fresh connection.
        assert await repo.aget_state(cfg("t", "u")) == {"n": 1}
        await repo.aget_state(config)
        await kill(admin, await backends(admin, name), settle=True)
        # A write whose connection died while idle sends nothing on it: it runs on a
        # fresh connection. Its compare-and-swap still holds.
        assert await repo.aput_state(config, {"n": 2}) == 2
        assert await repo.aget_state(cfg("t", "u")) == {"n": 2}
    finally:
        await repo.aclose()


async def test_the_retry_policy_says_how_often_a_dead_connection_is_tried_again(
    pg_url: str, pg_schema: str, admin: Any
) -> None:
    """``RetryPolicy(attempts=1)``: a read whose pooled connection was killed is not
    tried again (ConnectionLost, nothing was written); the default tries once more; a
    wait between tries is the policy's backoff."""
    from tenxstore import ConnectionLost, RetryPolicy

    repo, name = named_repo(pg_url, pg_schema, retry=RetryPolicy(attempts=1))
    patient, patient_name = named_repo(
        pg_url, pg_schema, retry=RetryPolicy(attempts=3, backoff=0.01)
    )
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        await kill(admin, await backends(admin, name), settle=True)
        with pytest.raises(ConnectionLost):
            await repo.aget_state(cfg("t", "u"))
        assert await repo.aget_state(cfg("t", "u")) == {"n": 1}  # a fresh one now
        assert await patient.aget_state(cfg("t", "u")) == {"n": 1}
        await kill(admin, await backends(admin, patient_name), settle=True)
        assert await patient.aget_state(cfg("t", "u")) == {"n": 1}
    finally:
        await repo.aclose()
        await patient.aclose()


async def hold_lock(admin: Any, schema: str) -> Any:
    """Another writer that holds the thread's row lock until its transaction ends."""
    transaction = admin.transaction()
    await transaction.start()
    await admin.execute(f'SELECT 1 FROM "{schema}".threads WHERE thread_id = $1 FOR UPDATE', "t")
    return transaction


async def gone(admin: Any, pids: list[int]) -> None:
    """Wait until the server has ended these backends (it looks every second)."""
    deadline = time.monotonic() + 10
    while await admin.fetchval(  # a fresh view each time, inside the lock's transaction
        "SELECT count(*) FROM pg_stat_activity, pg_stat_clear_snapshot() WHERE pid = any($1)",
        pids,
    ):
        assert time.monotonic() < deadline, "the server never ended the orphaned statement"
        await asyncio.sleep(0.01)  # polling the server's view, not a race


async def waiting_writer(admin: Any, name: str) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = await backends(admin, name, waiting=True)
        if pids:
            return pids
        await asyncio.sleep(0.01)  # polling for the writer to reach the lock, not a race
    raise AssertionError("the writer never waited on the lock")


async def closed(admin: Any, name: str) -> list[int]:
    """The application's backends still there once the server has ended the ones whose
    client closed them (a closed client's backend exits on its own, soon after)."""
    deadline = time.monotonic() + 10
    while True:
        left = await backends(admin, name)
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.01)  # polling the server's view, not a race


async def test_a_writer_killed_while_waiting_on_the_lock(
    pg_url: str, pg_schema: str, admin: Any
) -> None:
    repo, name = named_repo(pg_url, pg_schema)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        holder = await hold_lock(admin, pg_schema)
        write = asyncio.ensure_future(repo.aput_state(config, {"n": "killed"}))
        await kill(admin, await waiting_writer(admin, name))
        with pytest.raises(ConnectionLost) as err:
            await asyncio.wait_for(write, 10)  # an error, not a hang
        # Lost in flight: tenxstore looked, on a fresh connection, and it was not applied.
        assert err.value.committed is False
        await holder.rollback()
        reader = cfg("t", "u")
        assert await repo.aget_state(reader) == {"n": 1}  # nothing of it is visible
        assert await repo.aput_state(reader, {"n": 2}) == 2
    finally:
        await repo.aclose()


async def test_a_writer_whose_query_is_cancelled_gets_statement_cancelled(
    pg_url: str, pg_schema: str, admin: Any
) -> None:
    """pg_cancel_backend (an operator, statement_timeout) of a write waiting on the
    thread's lock: StatementCancelled, nothing written, and the next write works."""
    repo, name = named_repo(pg_url, pg_schema)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        holder = await hold_lock(admin, pg_schema)
        write = asyncio.ensure_future(repo.aput_state(config, {"n": "cancelled"}))
        for pid in await waiting_writer(admin, name):
            await admin.execute("SELECT pg_cancel_backend($1)", pid)
        with pytest.raises(StatementCancelled, match="nothing was written") as err:
            await asyncio.wait_for(write, 10)
        assert err.value.committed is False
        await holder.rollback()
        assert await repo.aget_state(config) == {"n": 1}
        assert await repo.aput_state(config, {"n": 2}) == 2
    finally:
        await repo.aclose()


async def test_lock_waits_are_bounded_on_postgresql(
    pg_url: str, pg_schema: str, admin: Any
) -> None:
    repo, _ = named_repo(pg_url, pg_schema, lock_timeout=0.2)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        holder = await hold_lock(admin, pg_schema)
        with pytest.raises(LockTimeout):
            await asyncio.wait_for(repo.aput_state(config, {"n": "blocked"}), 10)
        with pytest.raises(TimeoutError):  # LockTimeout is a TimeoutError
            await asyncio.wait_for(repo.aclean_thread(cfg("t", "u")), 10)
        await holder.rollback()
        assert await repo.aget_state(cfg("t", "u")) == {"n": 1}
        assert await repo.aput_state(config, {"n": 2}) == 2
    finally:
        await repo.aclose()


async def test_lock_waits_are_bounded_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    repo = CheckpointRepository(f"sqlite:///{path}", lock_timeout=0.2)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(LockTimeout):
                await asyncio.wait_for(repo.aput_state(config, {"n": "blocked"}), 10)
            assert await repo.aget_state(cfg("t", "u")) == {"n": 1}  # readers are not blocked (WAL)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert await repo.aput_state(config, {"n": 2}) == 2
    finally:
        await repo.aclose()


def test_lock_timeout_is_validated() -> None:
    for bad in (0, -1, "1", True):
        with pytest.raises(ValueError):
            CheckpointRepository("sqlite:///x.db", lock_timeout=bad)  # type: ignore[arg-type]


async def test_a_cancelled_writer_leaves_no_open_transaction(
    pg_url: str, pg_schema: str, admin: Any
) -> None:
    repo, name = named_repo(pg_url, pg_schema)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        holder = await hold_lock(admin, pg_schema)
        write = asyncio.ensure_future(repo.aput_state(config, {"n": "cancelled"}))
        await waiting_writer(admin, name)
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        await holder.rollback()
        open_transactions = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
            "AND state LIKE 'idle in transaction%'",
            name,
        )
        assert open_transactions == 0
        for n in (2, 3):  # the pool hands out clean connections only
            assert await repo.aput_state(config, {"n": n}) == n
        assert await repo.aget_state(cfg("t", "u")) == {"n": 3}
    finally:
        await repo.aclose()


class Budget:
    """How many times a condition may still fire."""

    def __init__(self, times: int) -> None:
        self.left = times

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


async def test_a_connection_that_breaks_while_opening_is_opened_again(
    pg_url: str, pg_schema: str
) -> None:
    breaks = Budget(0)
    # The server "dies" when a new connection sends its session setup (SET lock_timeout).
    port = urlsplit(pg_url).port or 5432
    link = TcpProxy(port, drop=lambda chunk: b"lock_timeout" in chunk and breaks.take())
    await link.start()
    repo = CheckpointRepository(
        f"postgresql://postgres@127.0.0.1:{link.port}{urlsplit(pg_url).path}", schema=pg_schema
    )
    try:
        await repo.asetup()
        await repo.aput_state(cfg("t", "u"), {"n": 1})
        for call in (
            lambda: repo.aget_state(cfg("t", "u")),
            lambda: repo.aput_state(cfg("t", "u"), {"n": 2}),
        ):
            await repo.aclose()  # the next call opens a new connection
            breaks.left = 1
            await call()  # the first opening breaks; nothing was sent: opened again
            assert breaks.left == 0
        await repo.aclose()
        breaks.left = 2  # twice: it gives up, typed, and nothing was written
        with pytest.raises(ConnectionLost) as err:
            await repo.aput_state(cfg("t", "u"), {"n": "lost"})
        assert err.value.committed is False
        assert await repo.aget_state(cfg("t", "u")) == {"n": 2}
        del err  # its traceback holds the broken opening's frames until collected
    finally:
        await repo.aclose()
        await link.close()
    gc.collect()  # no connection was left to the garbage collector


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("postgresql://postgres@127.0.0.1:{free}/test", "connection refused"),
        ("postgresql://postgres@no-such-host.invalid:5432/test", "unknown host"),
        ("postgresql://postgres:secret@127.0.0.1:5432/no_such_database", "no such database"),
        ("postgresql://no_such_role@127.0.0.1:5432/test", "authentication failed"),
        ("sqlite:////no/such/directory/x.db", "cannot open the file"),
    ],
)
async def test_an_unusable_database_is_named_and_explained(url: str, why: str) -> None:
    url = url.format(free=free_port())
    repo = CheckpointRepository(url)
    try:
        for call in (repo.aget_state(cfg()), repo.aput_state(cfg(), {"x": 1}), repo.asetup()):
            with pytest.raises(DatabaseUnavailable) as err:
                await call
            message = str(err.value)
            assert why in message and "secret" not in message
            assert make_url(url).host or "sqlite" in message
        health = await repo.acheck()
        assert not health.ok and health.database_error is not None and why in health.database_error
    finally:
        await repo.aclose()


async def test_connections_kept_for_hot_calls_never_starve_the_pool(
    pg_url: str, pg_schema: str
) -> None:
    """Hot calls keep connections between calls; a checkout that waits for the pool
    (a hot call's, or SQLAlchemy's) still gets one, on a pool with no overflow."""
    repo = CheckpointRepository(
        pg_url,
        schema=pg_schema,
        engine_options={"pool_size": 2, "max_overflow": 0, "pool_timeout": 10},
    )
    try:
        await repo.asetup()
        configs = [cfg(f"t{i}") for i in range(16)]
        for config in configs:
            await repo.aput_state(config, {"n": 0})
        # Two hot writes at once: both connections now idle, kept for the next hot call.
        await asyncio.gather(*(repo.aput_state(c, {"n": 1}) for c in configs[:2]))
        assert len(await repo.alist_threads(cfg())) == 16  # SQLAlchemy's own checkout

        async def conversation(config: dict[str, Any], n: int) -> None:
            for turn in range(2, 6):
                assert await repo.aget_state(config) == {"n": turn - 1 if n < 2 or turn > 2 else 0}
                await repo.aput_state(config, {"n": turn})
                await repo.aget_messages(config)  # SQLAlchemy's checkout among hot ones

        await asyncio.wait_for(
            asyncio.gather(*(conversation(c, i) for i, c in enumerate(configs))), 60
        )
        for config in configs:
            assert await repo.aget_state(dict(config)) == {"n": 5}
    finally:
        await repo.aclose()


@pytest.mark.parametrize("verification_reaches_the_server", [True, False])
async def test_a_write_lost_while_waiting_for_the_lock_never_commits_afterwards(
    pg_url: str, pg_schema: str, admin: Any, verification_reaches_the_server: bool
) -> None:
    """The link breaks while the write waits for the row lock: the server does not
    notice (the statement would commit once the lock frees). tenxstore ends that
    backend before it looks; when it cannot look, the outcome is unknown."""
    link = await TcpProxy(urlsplit(pg_url).port or 5432).start()
    name = f"tenx-{uuid.uuid4().hex[:8]}"
    repo = CheckpointRepository(
        f"postgresql://postgres@127.0.0.1:{link.port}{urlsplit(pg_url).path}",
        schema=pg_schema,
        engine_options={"connect_args": {"server_settings": {"application_name": name}}},
    )
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        holder = await hold_lock(admin, pg_schema)
        write = asyncio.ensure_future(repo.aput_state(config, {"n": "lost"}))
        orphan = await waiting_writer(admin, name)
        if not verification_reaches_the_server:
            link.cut()  # and refused from now on
        else:
            link.cut()
            link.restore()
        with pytest.raises(ConnectionLost) as err:
            await asyncio.wait_for(write, 30)
        if not verification_reaches_the_server:
            # tenxstore could not end it; the server does, once it sees the client gone
            # (client_connection_check_interval), while the lock is still held.
            await gone(admin, orphan)
        await holder.rollback()  # the lock frees: an orphaned statement would commit now
        assert err.value.committed is (False if verification_reaches_the_server else None)
        assert await backends(admin, name, waiting=True) == []
        version = await admin.fetchval(f'SELECT version FROM "{pg_schema}".threads')
        assert version == 1  # nothing committed, whatever the error said
    finally:
        link.restore()
        await repo.aclose()
        await link.close()


async def test_a_write_cancelled_twice_never_commits_after_the_call(
    pg_url: str, pg_schema: str, admin: Any
) -> None:
    """anyio's cancel scopes cancel again at every await: the call still waits until
    the server has cancelled the statement."""
    repo, name = named_repo(pg_url, pg_schema)
    try:
        await repo.asetup()
        await repo.aput_state(cfg("t", "u"), {"n": 0})
        for n in range(1, 4):
            config = cfg("t", "u")
            await repo.aget_state(config)
            holder = await hold_lock(admin, pg_schema)
            write = asyncio.ensure_future(repo.aput_state(config, {"n": n}))
            await waiting_writer(admin, name)
            write.cancel()
            await asyncio.sleep(0)
            write.cancel()  # again, while it waits for the server's cancel
            with pytest.raises(asyncio.CancelledError):
                await write
            await holder.rollback()
            assert await repo.aget_state(cfg("t", "u")) == {"n": 0}
            assert await backends(admin, name, waiting=True) == []
    finally:
        await repo.aclose()


async def test_a_write_cancelled_before_its_statement_gives_its_connection_back(
    pg_url: str, pg_schema: str
) -> None:
    repo = CheckpointRepository(
        pg_url, schema=pg_schema, engine_options={"pool_size": 2, "max_overflow": 0}
    )
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        for n in range(20):
            write = asyncio.ensure_future(repo.aput_state(config, {"n": n}))
            await asyncio.sleep(0)  # it took a connection and looks at it once
            write.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await write
            await repo.aget_state(config)
        # All came back: the pool still serves two calls at once without waiting.
        await asyncio.wait_for(
            asyncio.gather(repo.aget_messages(config), repo.alist_threads(config)), 5
        )
    finally:
        await repo.aclose()


async def test_concurrent_writes_without_a_version_keep_the_history_limit(
    pg_url: str, pg_schema: str
) -> None:
    repo = CheckpointRepository(pg_url, schema=pg_schema, state_history_limit=1)
    try:
        await repo.asetup()
        await repo.aput_state(cfg("t", "u"), {"n": 0})
        for _ in range(3):
            await asyncio.gather(*(repo.aput_state(cfg("t", "u"), {"n": i}) for i in range(10)))
            assert len(await repo.alist_states(cfg("t", "u"))) == 1
    finally:
        await repo.aclose()


async def test_sqlite_a_cancelled_write_never_commits_after_the_call(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    repo = CheckpointRepository(f"sqlite:///{path}")
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        other.execute("BEGIN IMMEDIATE")  # another process writes
        write = asyncio.ensure_future(repo.aput_state(config, {"n": "cancelled"}))
        await asyncio.sleep(0.1)  # the busy wait is a time: let the write be in it
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        other.execute("ROLLBACK")  # the lock frees: an abandoned write would commit now
        assert await repo.aput_state(dict(config), {"n": 1}) == 2  # the version it read
        assert [s.state for s in await repo.alist_states(cfg("t", "u"))] == [{"n": 1}, {"n": 0}]
    finally:
        other.close()
        await repo.aclose()


async def test_sqlite_reads_never_wait_behind_writers_waiting_for_the_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.db"
    repo = CheckpointRepository(f"sqlite:///{path}", lock_timeout=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    writes: list[asyncio.Future[Any]] = []
    try:
        await repo.asetup()
        for i in range(6):
            await repo.aput_state(cfg(f"t{i}", "u"), {"i": i})
        other.execute("BEGIN IMMEDIATE")
        writes = [
            asyncio.ensure_future(repo.aput_state(cfg(f"t{i}", "u"), {"i": -i})) for i in range(6)
        ]
        reads = [repo.aget_state(cfg(f"t{i}", "u")) for i in range(6)]
        assert await asyncio.wait_for(asyncio.gather(*reads), 5) == [{"i": i} for i in range(6)]
    finally:
        for write in writes:
            write.cancel()  # writers waiting without a bound stop when cancelled
        await asyncio.gather(*writes, return_exceptions=True)
        other.execute("ROLLBACK")
        other.close()
        await repo.aclose()


async def test_sqlite_closed_then_used_again(tmp_path: Path) -> None:
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        await repo.asetup()
        for n in range(1, 3):
            config = cfg("t", "u")
            await repo.aget_state(config)
            assert await repo.aput_state(config, {"n": n}) == n
            await repo.aclose()  # as a loop that ends closes its share
    finally:
        await repo.aclose()


async def test_hot_calls_beyond_the_pool_wait_their_turn_and_cancel_cleanly(
    pg_url: str, pg_schema: str
) -> None:
    """64 conversations on a pool of 4 (no overflow): hot calls beyond the pool wait for
    a connection handed from one call to the next; cancelled waiters and holders give
    theirs on; afterwards every connection is back and SQLAlchemy's calls get one."""
    repo = CheckpointRepository(
        pg_url,
        schema=pg_schema,
        engine_options={"pool_size": 4, "max_overflow": 0, "pool_timeout": 10},
    )
    try:
        await repo.asetup()
        configs = [cfg(f"t{i}") for i in range(64)]
        await asyncio.gather(*(repo.aput_state(c, {"n": 0}) for c in configs))

        async def conversation(config: dict[str, Any]) -> None:
            for n in range(1, 4):
                await repo.aget_state(config)
                await repo.aput_state(config, {"n": n})

        tasks = [asyncio.ensure_future(conversation(c)) for c in configs]
        await asyncio.sleep(0)
        for task in tasks[::7]:
            task.cancel()  # some while they wait their turn, some while they hold one
        outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        assert all(o is None or isinstance(o, asyncio.CancelledError) for o in outcomes)
        for config, outcome in zip(configs, outcomes, strict=True):
            if outcome is None:
                assert await repo.aget_state(dict(config)) == {"n": 3}
        await asyncio.wait_for(asyncio.gather(*(repo.aget_messages(c) for c in configs[:8])), 10)
        pool = repo.engine.sync_engine.pool
        borrowed = repo.backend._engines.current().borrowed  # introspection only
        assert pool.checkedout() == len(borrowed._idle)  # nothing leaked
    finally:
        await repo.aclose()


@pytest.mark.parametrize("name", ["sqlite", "postgresql", "mariadb"])
async def test_an_engine_used_before_it_is_handed_over_gets_tenxstores_session(
    name: str, tmp_path: Path
) -> None:
    """An application's engine whose pool already holds a connection: tenxstore's
    session settings reach that connection too (at its first checkout), not only the
    ones opened after — else it kept the server's defaults (no lock_timeout on
    PostgreSQL; REPEATABLE READ and a 50 s lock wait on MySQL; the driver's implicit
    transactions and no foreign keys on SQLite)."""

    async with backend_for(name, tmp_path) as sql_backend:
        await _handed_over(sql_backend)


async def _handed_over(sql_backend: Any) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    from tenxstore import CheckpointRepository

    url = make_url(sql_backend.url)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+asyncpg")
    elif url.drivername == "sqlite":
        url = url.set(drivername="sqlite+aiosqlite")
    # A pool of one: the repository gets the very connection the application used.
    engine = create_async_engine(url, pool_size=1, max_overflow=0)
    try:
        async with engine.connect() as conn:  # the application's own use, first
            await conn.execute(text("SELECT 1"))
        repo = CheckpointRepository(
            engine, schema=sql_backend.schema, lock_timeout=2, keys=sql_backend.keys
        )
        await repo.asetup()
        await repo.aput_state(cfg(), {"n": 1})
        async with engine.connect() as conn:
            if sql_backend.name.startswith("postgresql"):
                found = (await conn.execute(text("SHOW lock_timeout"))).scalar_one()
                assert found == "2s", found
            elif sql_backend.name == "mariadb":
                found = (
                    await conn.execute(
                        text("SELECT @@tx_isolation, @@innodb_lock_wait_timeout, @@time_zone")
                    )
                ).one()
                assert tuple(found) == ("READ-COMMITTED", 2, "+00:00"), found
            else:
                found = (await conn.execute(text("PRAGMA foreign_keys"))).scalar_one()
                assert found == 1, found
        await repo.aclose()
    finally:
        await engine.dispose()


async def test_connections_killed_under_load_raise_our_errors_only(
    pg_url: str, pg_schema: str, admin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """8 conversations while an operator ends every backend of the application, again
    and again (new connections too, as they open): each call succeeds or raises
    tenxstore's error. A connection ended while it was being set up for a hot call
    escaped as asyncpg's own InterfaceError ("connection is closed")."""
    from tenxstore import TenxStoreError

    repo, name = named_repo(pg_url, pg_schema)
    outcomes: list[BaseException | None] = []
    try:
        await repo.asetup()
        await repo.aget_state(cfg("warm", "u"))  # the first-use check is behind us

        async def conversation(n: int) -> None:
            for turn in range(30):
                config = cfg(f"t{n}", "u")
                try:
                    await repo.aget_state(config)
                    await repo.aput_state(config, {"turn": turn})
                    await repo.aget_messages(config)
                    outcomes.append(None)
                except Exception as exc:
                    outcomes.append(exc)

        talking = asyncio.gather(*(conversation(n) for n in range(8)))
        with caplog.at_level(logging.WARNING):
            while not talking.done():  # sweep after sweep: old backends and new ones
                await kill(admin, await backends(admin, name))
            await talking
        raw = [o for o in outcomes if o is not None and not isinstance(o, TenxStoreError)]
        assert raw == []
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
        assert await repo.aput_state(cfg("after", "u"), {"n": 1}) == 1
    finally:
        await repo.aclose()
    assert await closed(admin, name) == []  # every connection it opened was closed
    gc.collect()  # none was left to the garbage collector


async def test_a_connection_in_use_when_another_is_found_dead_is_closed_after_all(
    pg_url: str, pg_schema: str, admin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A hot call that finds its connection dead drops every idle one (they likely died
    with it) and opens anew. A connection another call was using meanwhile is closed
    in its turn. It went back to a pool replaced meanwhile, which nothing closed: left
    open on the server, and unclosed to the garbage collector (asyncpg's
    ResourceWarning, seen once in ~10 runs of the test above)."""
    repo, name = named_repo(pg_url, pg_schema)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        # Two of SQLAlchemy's checkouts at once: two connections idle in the pool.
        await asyncio.gather(repo.aget_messages(config), repo.aget_messages(config))
        holder = await hold_lock(admin, pg_schema)
        write = asyncio.ensure_future(repo.aput_state(config, {"n": 2}))
        writer = await waiting_writer(admin, name)  # its connection is in use
        idle = [pid for pid in await backends(admin, name) if pid not in writer]
        await kill(admin, idle, settle=True)
        # The read's first connection is dead: it drops the idle ones, opens a new one.
        with caplog.at_level(logging.DEBUG, logger="tenxstore"):
            assert await repo.aget_state(cfg("t2", "u")) is None
        assert "retrying: a connection broke" in caplog.text  # it found one dead
        await holder.rollback()
        assert await write == 2
    finally:
        await repo.aclose()
    assert await closed(admin, name) == []  # every connection it opened was closed
    gc.collect()  # none was left to the garbage collector


async def test_a_lost_write_is_judged_by_its_own_mark_not_by_an_equal_state(
    pg_url: str, pg_schema: str, admin: Any
) -> None:
    """Another writer commits the very state this write sends, as the next version; the
    write's compare-and-swap then matches nothing, and its answer is lost on the way
    back. The look must not take the other writer's row for its own (an equal state
    text passed for it once): the write did not commit, and the caller hears that the
    thread moved on (StaleStateError), not that its write landed."""
    armed = {"write": False, "reply": False}

    def request(chunk: bytes) -> bool:
        if armed["write"] and chunk[:1] == b"B":  # the prepared write's Bind/Execute/Sync
            armed["write"], armed["reply"] = False, True
        return False

    def reply(chunk: bytes) -> bool:
        if armed["reply"]:
            armed["reply"] = False
            return True  # the server answered; the client never hears it
        return False

    link = await TcpProxy(urlsplit(pg_url).port or 5432, drop=request, drop_reply=reply).start()
    repo = CheckpointRepository(
        f"postgresql://postgres@127.0.0.1:{link.port}{urlsplit(pg_url).path}", schema=pg_schema
    )
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        await repo.aget_state(config)  # the read statement prepared too: only writes Bind next
        same = encode_state({"n": 2})
        async with admin.transaction():  # the other writer: version 2, this very state
            await admin.execute(
                f'UPDATE "{pg_schema}".threads SET version = 2 WHERE thread_id = $1', "t"
            )
            await admin.execute(
                f'INSERT INTO "{pg_schema}".states (thread_id, version, state_data, created_at)'
                " VALUES ($1, 2, $2, now())",
                "t",
                same,
            )
        armed["write"] = True
        with pytest.raises(StaleStateError):
            await repo.aput_state(config, {"n": 2})
        assert not armed["write"] and not armed["reply"], "the answer was never cut"
        assert (
            await admin.fetchval(
                f'SELECT count(*) FROM "{pg_schema}".states WHERE thread_id = $1', "t"
            )
            == 2
        )  # versions 1 and the other writer's 2: nothing of this write
    finally:
        await repo.aclose()
        await link.close()
