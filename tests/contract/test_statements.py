"""Statements and round trips of the hot path.

PostgreSQL (counted on the wire, through a proxy): a state write is ONE statement in
ONE round trip in the common case — the thread exists, the caller owns it, the run's
version still holds — and a read of the head is one. A write without a recorded
version (the first of a thread) takes the locked path (BEGIN, lock, insert the thread,
lock it, write, COMMIT); a conflict adds it after the one statement (BEGIN, lock,
ROLLBACK), which reports the precise version.

SQLite (counted as sent): one thread hop runs BEGIN IMMEDIATE, the lock select, the
state, messages, version bump (and prune), COMMIT; a read is one SELECT.
Behind PgBouncer the head read is one simple Query (COPY) and the steady write two
(BEGIN + the one statement as COPY, then COMMIT: tests/contract/test_pgbouncer.py);
everything else runs in a transaction of SQLAlchemy's.

A LangGraph checkpoint put that continues from the head is ONE statement on
PostgreSQL too, and moves its thread's ``updated_at`` inside it; a read of the head
is one. So are a memory's put (a new one, or its next version) and get; on SQLite
they are one thread hop each.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from sqlalchemy import event

from tenxstore import CheckpointRepository, MemoryStore, StaleStateError
from tenxstore.langgraph import TenxCheckpointSaver
from tests.cache.conftest import sql_statements
from tests.conftest import TEST_KEYS, backend_for, cfg
from tests.memory.embeddings import HashingEmbedding
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
        # SQLite: BEGIN IMMEDIATE, lock, state, messages, bump, (prune), COMMIT;
        # PgBouncer: the one statement (in a transaction of its own), COMMIT
        prune = n > 1
        assert len(steady) == (6 + prune if sqlite else 2), steady
    for read in (repo.aget_state, repo.aget_messages, repo.aget_thread, repo.alist_states):
        with sql_statements(repo) as reads:
            await read(config)  # type: ignore[operator]
        assert len(reads) == (2 if sqlite and read != repo.aget_state else 1), reads


async def langgraph_turns(
    saver: TenxCheckpointSaver, config: dict[str, Any], n: int, version: str | None = None
) -> tuple[dict[str, Any], str | None]:
    """``n`` puts of channel ``step``, each from the one before: (the last config, the
    channel's version)."""
    for step in range(n):
        version = saver.get_next_version(version, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"step": step}
        checkpoint["channel_versions"] = {"step": version}
        metadata: Any = {"source": "loop", "step": step}
        config = await saver.aput(config, checkpoint, metadata, {"step": version})
    return config, version


async def test_a_langgraph_put_is_one_round_trip_and_moves_updated_at(
    pg_url: str, pg_schema: str
) -> None:
    wire = PgWire()
    link = TcpProxy(urlsplit(pg_url).port or 5432, parser=wire.reader())
    await link.start()
    repo = CheckpointRepository(
        f"postgresql://postgres@127.0.0.1:{link.port}/test", schema=pg_schema
    )
    saver = TenxCheckpointSaver(repo)
    try:
        await repo.asetup()
        for warm in ("w1", "w2"):  # connections opened, statements prepared on them
            warm_config = {"configurable": {"thread_id": warm, "user_id": "u"}}
            await langgraph_turns(saver, warm_config, 3)
            await saver.aget_tuple(warm_config)
        config, version = await langgraph_turns(
            saver, {"configurable": {"thread_id": "t", "user_id": "u"}}, 2
        )
        before = await repo.aget_thread(cfg("t", "u"))
        with on_the_wire(wire) as put:
            await langgraph_turns(saver, config, 1, version)
        assert (put.statements, put.round_trips) == (1, 1), vars(put)
        after = await repo.aget_thread(cfg("t", "u"))
        assert before is not None and after is not None and after.updated_at > before.updated_at
        with on_the_wire(wire) as read:
            found = await saver.aget_tuple({"configurable": {"thread_id": "t", "user_id": "u"}})
        assert found is not None and found.metadata["step"] == 0
        assert (read.statements, read.round_trips) == (1, 1), vars(read)
    finally:
        await repo.aclose()
        await link.close()


@pytest.mark.parametrize("name", ["sqlite", "pgbouncer", "mariadb"])
async def test_langgraph_statements_per_put(name: str, tmp_path: Path) -> None:
    """SQLite's one thread hop, and the locked path behind PgBouncer and on MariaDB:
    the thread's ``updated_at`` moves in a statement the put sends anyway (folded into
    the look on PostgreSQL), or in one more statement where it cannot be (MariaDB has
    no data-modifying CTE)."""
    async with backend_for(name, tmp_path) as backend:
        repo = await backend.make()
        saver = TenxCheckpointSaver(repo)
        config, version = await langgraph_turns(
            saver, {"configurable": {"thread_id": "t", "user_id": "u"}}, 2
        )
        before = await repo.aget_thread(cfg("t", "u"))
        with sql_statements(repo) as sent:
            await langgraph_turns(saver, config, 1, version)
        said = "\n".join(s[:150] for s in sent)
        touches = [
            s for s in sent if s.lstrip().startswith(("UPDATE", "WITH")) and "updated_at" in s
        ]
        assert len(touches) == 1, said
        # SQLite: BEGIN IMMEDIATE, the thread, the parent, the base, move the head
        # mark, touch, the checkpoint, its value, COMMIT. PgBouncer: SET LOCAL, lock,
        # look (with the touch), the checkpoint, the head, the bases, the value.
        # MariaDB: lock, look, touch, the checkpoint, the head, the bases, the value.
        assert len(sent) == {"sqlite": 9, "pgbouncer": 7, "mariadb": 7}[name], said
        after = await repo.aget_thread(cfg("t", "u"))
        assert before is not None and after is not None and after.updated_at > before.updated_at


async def test_a_memory_put_and_get_are_one_round_trip_on_postgresql(
    pg_url: str, pg_schema: str
) -> None:
    """A put (a new memory, or the next version of a live one: its row, history,
    vector and scope revision) is ONE statement in ONE round trip, and so is a get,
    sent at driver level (SQLAlchemy's execution layer sees none of them). Sealed, so
    is the next version of a memory the store has written or read (its values are
    sealed for the memory's uid, remembered); of one it has not, two: the second
    sealed for the uid the first reported."""
    wire = PgWire()
    link = TcpProxy(urlsplit(pg_url).port or 5432, parser=wire.reader())
    await link.start()
    url = f"postgresql://postgres@127.0.0.1:{link.port}/test"
    stores = [
        MemoryStore(url, schema=pg_schema, embedding=HashingEmbedding(), keys=keys)
        for keys in (None, TEST_KEYS, TEST_KEYS)
    ]
    executed: list[str] = []
    try:
        for store in stores:
            await store.asetup()
            engine = store.backend.engine.sync_engine
            event.listen(engine, "before_cursor_execute", lambda *a: executed.append(a[2]))
            for _ in range(3):  # connections opened, statements prepared on them
                await store.astore("warm", "warm up", key="w")
                await store.aget("warm", "w")
        plain, sealed, other = stores
        for store, user in ((plain, "alice"), (sealed, "bob")):
            executed.clear()
            with on_the_wire(wire) as new:
                await store.astore(user, "prefers tea", key="drink", metadata={"a": 1})
            assert (new.statements, new.round_trips) == (1, 1), vars(new)
            for n in (2, 3):
                with on_the_wire(wire) as put:
                    made = await store.astore(user, f"prefers tea, version {n}", key="drink")
                assert made.version == n
                assert (put.statements, put.round_trips) == (1, 1), vars(put)
            with on_the_wire(wire) as get:
                found = await store.aget(user, "drink")
            assert found == made and found.metadata == {}
            assert (get.statements, get.round_trips) == (1, 1), vars(get)
            assert executed == []  # every one at driver level
            assert [m.version for m in await store.ahistory(user, "drink")] == [3, 2, 1]
        with on_the_wire(wire) as unknown:
            made = await other.astore("bob", "prefers coffee", key="drink")
        assert made.version == 4 and (unknown.statements, unknown.round_trips) == (2, 2)
        assert (await sealed.aget("bob", "drink")) == made
    finally:
        for store in stores:
            await store.aclose()
        await link.close()


async def test_memory_statements_per_put_and_get_on_sqlite(tmp_path: Path) -> None:
    """SQLite, in one thread hop each: a new memory is BEGIN IMMEDIATE, the look,
    the row, the scope's revision, the vector, COMMIT; its next version moves the old
    one to its history and updates the row instead of making one; a get is one
    SELECT, in no transaction."""
    store = MemoryStore(f"sqlite:///{tmp_path / 'm.db'}", embedding=HashingEmbedding())
    await store.asetup()
    try:
        await store.aget("alice", "drink")  # the store id, read once at first use
        with sql_statements(store.repository) as new:
            await store.astore("alice", "prefers tea", key="drink")
        said = "\n".join(s[:60] for s in new)
        assert len(new) == 6 and new[0] == "BEGIN IMMEDIATE" and new[-1] == "COMMIT", said
        with sql_statements(store.repository) as put:
            made = await store.astore("alice", "prefers green tea", key="drink")
        said = "\n".join(s[:60] for s in put)
        assert len(put) == 7 and put[0] == "BEGIN IMMEDIATE" and put[-1] == "COMMIT", said
        with sql_statements(store.repository) as get:
            assert await store.aget("alice", "drink") == made
        assert len(get) == 1 and get[0].startswith("SELECT"), get
    finally:
        await store.aclose()
