"""Statements and round trips of the hot path.

PostgreSQL (counted on the wire, through a proxy): a state write is ONE statement in
ONE round trip in the common case — the thread exists, the caller owns it, the run's
version still holds — and a read of the head is one. A write without a recorded
version (the first of a thread) takes the locked path (BEGIN, lock, insert the thread,
lock it, write, COMMIT); a conflict adds it after the one statement (BEGIN, lock,
ROLLBACK), which reports the precise version.

SQLite (counted as sent): one thread hop runs BEGIN IMMEDIATE, the lock select, the
state, messages, version bump (and prune), COMMIT; a read is one SELECT.
Behind PgBouncer every statement runs in a transaction of SQLAlchemy's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tenxstore import CheckpointRepository, StaleStateError
from tests.cache.conftest import sql_statements
from tests.conftest import backend_for, cfg
from tests.servers import PgWire, TcpProxy


@contextmanager
def on_the_wire(wire: PgWire) -> Iterator[PgWire]:
    wire.reset()
    yield wire


async def test_postgresql_round_trips_on_the_wire(pg_url: str, pg_schema: str) -> None:
    wire = PgWire()
    link = TcpProxy(urlsplit(pg_url).port or 5432, parser=wire.reader())
    await link.start()
    repo = CheckpointRepository(
        f"postgresql://postgres@127.0.0.1:{link.port}/test",
        schema=pg_schema,
        state_history_limit=2,
    )
    try:
        await repo.asetup()
        for warm in ("w1", "w2"):  # connections opened, statements prepared on them
            await repo.aput_state(cfg(warm, "u"), {"n": 0})
            await repo.aput_state(cfg(warm, "u"), {"n": 1})
            await repo.aget_state(cfg(warm, "u"))
        config = cfg("t", "u")
        with on_the_wire(wire) as first:
            await repo.aput_checkpoint(config, {"n": 0}, [{"id": "m0"}])
        # no version recorded yet: the locked path (its prune sees what a writer it
        # waited for committed): BEGIN, lock, insert the thread, lock it, write (one
        # statement of CTEs), COMMIT
        assert (first.statements, first.round_trips) == (6, 6), vars(first)
        for n in (1, 2, 3):
            with on_the_wire(wire) as steady:
                await repo.aput_checkpoint(config, {"n": n}, [{"id": f"m{n}a"}, {"id": f"m{n}b"}])
            assert (steady.statements, steady.round_trips) == (1, 1), vars(steady)
        with on_the_wire(wire) as read:
            assert await repo.aget_state(cfg("t", "u")) == {"n": 3}
        assert (read.statements, read.round_trips) == (1, 1), vars(read)
        stale = cfg("t", "u", _checkpoint_version=1)
        with on_the_wire(wire) as conflict, pytest.raises(StaleStateError):
            await repo.aput_state(stale, {"n": "late"})
        assert conflict.statements == 4, vars(conflict)  # one-step, BEGIN, lock, ROLLBACK
    finally:
        await repo.aclose()
        await link.close()


@pytest.mark.parametrize("name", ["sqlite", "pgbouncer"])
async def test_statements_per_operation(name: str, tmp_path: Path) -> None:
    async with backend_for(name, tmp_path) as backend:
        await statements_per_operation(name, await backend.make(state_history_limit=2))


async def statements_per_operation(name: str, repo: CheckpointRepository) -> None:
    config = cfg("t", "u")
    sqlite = name == "sqlite"
    await repo.astore_id()  # read once per process, at first use: not part of a write
    with sql_statements(repo) as first:
        await repo.aput_checkpoint(config, {"n": 0}, [{"id": "m0"}])
    # SQLite: the one-step write finds no thread (BEGIN IMMEDIATE, lock, ROLLBACK), then
    # the locked path (BEGIN IMMEDIATE, lock, insert, lock, state, messages, bump).
    # PgBouncer: the locked path only: SET LOCAL, lock, insert, lock, one CTE statement.
    assert len(first) == (10 if sqlite else 5), first
    for n in (1, 2, 3):  # versions 2, 3, 4: the last two prune (state_history_limit=2)
        with sql_statements(repo) as steady:
            await repo.aput_checkpoint(config, {"n": n}, [{"id": f"m{n}a"}, {"id": f"m{n}b"}])
        # SQLite: BEGIN IMMEDIATE, lock, state, messages, bump, (prune), COMMIT
        prune = n > 1
        assert len(steady) == (6 + prune if sqlite else 3), steady
    for read in (repo.aget_state, repo.aget_messages, repo.aget_thread, repo.alist_states):
        with sql_statements(repo) as reads:
            await read(config)  # type: ignore[operator]
        assert len(reads) == (2 if sqlite and read != repo.aget_state else 1), reads
