"""The one-step put and get (:mod:`tenxstore.memory.fast`) against the locked path they
stand in for: the same calls, on one database, by a store that takes the one step and
one that never does (``fast`` None), leave the same memories, versions, history,
vectors and revisions behind; and a put the one step cannot commit writes nothing of
its own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from tenxstore import CheckpointRepository, MemoryStore
from tenxstore.backends.pgvector import aenable
from tests.conftest import _with_encryption, backend_for
from tests.memory.conftest import Clock
from tests.memory.embeddings import HashingEmbedding
from tests.memory.test_pgvector import _vector_database


def _seen(memory: Any) -> tuple[Any, ...]:
    """What a call returned, but for its times (two stores, two moments)."""
    if memory is None:
        return (None,)
    kept = memory.created_at == memory.updated_at
    return (
        memory.key,
        memory.content,
        memory.metadata,
        memory.version,
        kept,
        memory.expires_at is None,
    )


async def _script(store: MemoryStore, user: str, clock: Clock) -> list[tuple[Any, ...]]:
    """Puts and gets through every case of a put: new, next versions past the history
    limit, a TTL set and cleared, with and without a vector, a generated key, an
    expired memory replaced (the locked path's, either way)."""
    said = [_seen(await store.astore(user, "tea", key="k1", metadata={"n": 1}))]
    for n in range(2, 7):
        ttl = 60 if n == 3 else None
        said.append(_seen(await store.astore(user, f"tea {n}", key="k1", ttl=ttl)))
        said.append(_seen(await store.aget(user, "k1")))
    said.append(_seen(await store.astore(user, "coffee", key="k2", embed=False)))
    said.append(_seen(await store.astore(user, "coffee beans", key="k2")))
    said.append(_seen(await store.astore(user, "coffee grounds", key="k2", embed="beans")))
    said.append(_seen(await store.astore(user, "no coffee", key="k2", embed=False)))
    said.append(_seen(await store.astore(user, "short lived", key="k3", ttl=1)))
    clock.advance(2)
    said.append(_seen(await store.aget(user, "k3")))
    said.append(_seen(await store.astore(user, "lives again", key="k3")))
    made = await store.astore(user, "a generated key", namespace=("other", "place"))
    said.append(_seen(made)[1:])
    said.append(_seen(await store.aget(user, made.key, namespace=("other", "place")))[1:])
    said.append(_seen(await store.aget(user, "never")))
    return said


async def _state(store: MemoryStore, user: str) -> dict[str, Any]:
    """A user's memories as stored: each one's history, and its vector."""
    rows = store.rows
    m, vt = rows.m, rows.vt
    state: dict[str, Any] = {}
    for key in ("k1", "k2", "k3"):
        state[key] = [_seen(h) for h in await store.ahistory(user, key)]
    vectors = select(m.c.memory_key, vt.c.model_id, vt.c.dims, vt.c.vector).select_from(
        m.join(vt, vt.c.memory_id == m.c.id)
    )
    named = vectors.where(m.c.user_id == user, m.c.namespace == "memories")
    found = await store.base.read(named.order_by(m.c.memory_key))
    state["vectors"] = [tuple(r) for r in found]
    r = rows.r
    scopes = select(r.c.namespace).where(r.c.user_id == user).order_by(r.c.namespace)
    state["revisions"] = [row.namespace for row in await store.base.read(scopes)]
    state["by words"] = [
        (h.memory.key, h.memory.content) for h in await store.asearch(user, "tea", mode="keyword")
    ]
    return state


@pytest.mark.parametrize("name", _with_encryption(["sqlite", "postgresql"]))
async def test_one_step_and_locked_path_store_the_same(
    name: str, tmp_path: Path, clock: Clock
) -> None:
    async with backend_for(name, tmp_path) as backend:
        repo = await backend.make()
        one_step = MemoryStore(repo, embedding=HashingEmbedding(), memory_history_limit=3)
        locked = MemoryStore(repo, embedding=HashingEmbedding(), memory_history_limit=3)
        assert one_step.fast is not None and one_step.fast.available
        locked.fast = None  # every put and get takes the locked path
        assert await _script(one_step, "fast", clock) == await _script(locked, "slow", clock)
        assert await _state(one_step, "fast") == await _state(locked, "slow")
        vectors = await _state(one_step, "fast")
        assert [v[0] for v in vectors["vectors"]] == ["k1", "k3"]  # k2's last put had none


@pytest.mark.parametrize("name", _with_encryption(["sqlite", "postgresql"]))
async def test_a_put_the_one_step_leaves_writes_nothing(
    name: str, tmp_path: Path, clock: Clock
) -> None:
    """An expired memory under the key: the one step writes nothing (its row, history,
    vector and revision are as they were) and says the locked path must do it."""
    from tenxstore.memory import fast, writes

    async with backend_for(name, tmp_path) as backend:
        store = MemoryStore(await backend.make(), embedding=HashingEmbedding())
        await store.astore("alice", "short lived", key="k", ttl=1)
        await store.astore("alice", "short lived, again", key="k", ttl=1)
        before = await _raw(store)
        clock.advance(2)
        new = writes.written(store, "lives again", None)
        blob = await writes.vector(store, "lives again", True)
        assert await fast.put(store, "alice", "memories", "k", new, blob) is None
        assert await _raw(store) == before
        again = await store.astore("alice", "lives again", key="k")  # the locked path's
        assert (again.version, again.content) == (1, "lives again")


async def _raw(store: MemoryStore) -> list[Any]:
    """Every row of the memory tables, as stored."""
    rows = store.rows
    found: list[Any] = []
    for table in (rows.m, rows.v, rows.vt, rows.r):
        found.append(sorted(tuple(map(str, r)) for r in await store.base.read(select(table))))
    return found


@pytest.fixture
async def vector_schema() -> AsyncIterator[tuple[str, str]]:
    """A schema of its own in this worker's database with pgvector (as
    tests/memory/test_pgvector.py makes it), dropped afterwards."""
    import asyncpg

    url = await asyncio.to_thread(_vector_database)
    name = f"f_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        yield url, name
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


async def test_pgvectors_column_is_written_as_the_locked_path_writes_it(
    vector_schema: tuple[str, str],
) -> None:
    """With pgvector enabled, the one step writes the ``vector`` column beside the
    bytes as the locked path does; a store that began before it was enabled (and so
    does not know the column) leaves it empty, as the locked path does, so searches
    find that memory exactly rather than by a stale vector."""
    vector_url, schema = vector_schema
    repo = CheckpointRepository(vector_url, schema=schema)
    await repo.asetup()
    before = MemoryStore(repo, embedding=HashingEmbedding())
    await before.astore("early", "Alice has a golden retriever", key="pet")
    async with repo.store.backend.connect() as conn, conn.begin():
        await aenable(conn, schema)
    one_step = MemoryStore(repo, embedding=HashingEmbedding())
    locked = MemoryStore(repo, embedding=HashingEmbedding())
    locked.fast = None
    for store, user in ((one_step, "fast"), (locked, "slow")):
        for said in ("Alice has a golden retriever", "Alice adopted a grey cat"):
            await store.astore(user, said, key="pet")
        await store.astore(user, "Alice drinks a double espresso", key="coffee")
    assert one_step.vectors is not None and one_step.vectors.pg is not None
    await before.astore("early", "Alice adopted a grey cat", key="pet")  # a next version
    assert before.vectors is not None and before.vectors.pg is None
    async with repo.store.backend.connect() as conn:
        found = await conn.execute(
            text(
                f'SELECT m.user_id, m.memory_key, v.embedding::text FROM "{schema}".memories m '
                f'JOIN "{schema}".memory_vectors v ON v.memory_id = m.id ORDER BY 1, 2'
            )
        )
        columns = {(r[0], r[1]): r[2] for r in found}
    assert columns[("early", "pet")] is None
    for key in ("pet", "coffee"):
        assert columns[("fast", key)] is not None
        assert columns[("fast", key)] == columns[("slow", key)]
    hits = await one_step.asearch("early", "grey cats", mode="vector")
    assert [h.memory.content for h in hits] == ["Alice adopted a grey cat"]
    await repo.aclose()


@pytest.mark.parametrize("name", _with_encryption(["sqlite", "postgresql"]))
async def test_concurrent_puts_of_one_memory_lose_nothing(name: str, tmp_path: Path) -> None:
    """Puts of one key at once, beside puts of other keys of its namespace (a writer's
    commit may land between another's snapshot and its locks): consecutive versions,
    every content in the history, and the vector the last version's, which a search
    of a matrix cached before them finds (each write renewed the scope's revision)."""
    async with backend_for(name, tmp_path) as backend:
        store = MemoryStore(await backend.make(), embedding=HashingEmbedding())
        await store.astore("alice", "first words", key="k")
        assert [h.memory.key for h in await store.asearch("alice", "first words")] == ["k"]

        async def put(n: int) -> int:
            await store.astore("alice", f"other {n}", key=f"o{n % 3}")
            return (await store.astore("alice", f"wombat number {n}", key="k")).version

        made = await asyncio.gather(*(put(n) for n in range(8)))
        assert sorted(made) == list(range(2, 10))
        versions = await store.ahistory("alice", "k")
        assert [m.version for m in versions] == list(range(9, 0, -1))
        assert {m.content for m in versions} == {
            "first words",
            *(f"wombat number {n}" for n in range(8)),
        }
        last = versions[0].content
        hits = await store.asearch("alice", last, mode="vector", score_threshold=0.99)
        assert [(h.memory.key, h.memory.content) for h in hits] == [("k", last)]


@pytest.mark.parametrize("name", ["sqlite+encrypted", "postgresql+encrypted"])
async def test_a_remembered_uid_of_a_memory_gone_or_made_again(name: str, tmp_path: Path) -> None:
    """A sealing store remembers each memory's uid; when another store deletes the
    memory, or makes it again (a new life: a new uid), the next put still writes the
    memory as it is, and a memory made anew gets a uid of its own, never the one
    remembered."""
    async with backend_for(name, tmp_path) as backend:
        repo = await backend.make()
        one, other = MemoryStore(repo), MemoryStore(repo)
        m = one.rows.m
        uid_of_k = select(m.c.uid).where(m.c.memory_key == "k")
        await one.astore("alice", "v1", key="k")
        uids = [(await one.base.read(uid_of_k))[0][0]]
        assert await other.adelete("alice", "k")
        await other.astore("alice", "again", key="k")
        uids.append((await one.base.read(uid_of_k))[0][0])
        made = await one.astore("alice", "v2", key="k")
        assert (made.version, made.content) == (2, "v2")
        assert await other.aget("alice", "k") == made
        assert await other.adelete("alice", "k")
        made = await one.astore("alice", "v3", key="k")
        assert (made.version, made.content) == (1, "v3")
        assert await other.aget("alice", "k") == made
        assert (await one.base.read(uid_of_k))[0][0] not in uids
        assert [h.content for h in await other.ahistory("alice", "k")] == ["v3"]
