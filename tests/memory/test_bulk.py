"""Many memories in one call (``astore_many``): the writes of ``astore`` in order, all or
nothing, on every backend; checked before any I/O; with vectors in bulk."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import func, select

from tenxstore import (
    ConfigError,
    EmbeddingError,
    MemoryStore,
    NewMemory,
    SerializationError,
    TenxStoreError,
)
from tenxstore.memory.bulk import _Item, rounds
from tests.conftest import Backend
from tests.memory.conftest import Clock
from tests.memory.embeddings import HashingEmbedding


async def _count(store: MemoryStore) -> tuple[int, int]:
    m, vt = store.rows.m, store.rows.vt
    memories = (await store.base.read(select(func.count()).select_from(m)))[0][0]
    vectors = (await store.base.read(select(func.count()).select_from(vt)))[0][0]
    return int(memories), int(vectors)


@pytest.fixture
async def vstore(store_backend: Backend) -> AsyncIterator[MemoryStore]:
    store = MemoryStore(await store_backend.make(), embedding=HashingEmbedding())
    yield store
    await store.aclose()


async def test_many_are_what_astore_writes_one_by_one(memories: MemoryStore) -> None:
    made = await memories.astore_many(
        "alice",
        [
            "prefers tea",
            NewMemory("lives in Lisbon", key="city", metadata={"src": "chat"}, ttl=3600),
            {"content": "works at Acme", "namespace": ("work",), "key": "job"},
        ],
    )
    assert [m.content for m in made] == ["prefers tea", "lives in Lisbon", "works at Acme"]
    assert [m.version for m in made] == [1, 1, 1]
    assert made[1].metadata == {"src": "chat"} and made[1].expires_at is not None
    assert made[2].namespace == ("work",) and made[0].namespace == ("memories",)
    for m in made:
        assert await memories.aget("alice", m.key, namespace=m.namespace) == m
    one = await memories.astore("alice", "lives in Porto", key="city")
    assert (one.version, one.created_at) == (2, made[1].created_at)


async def test_a_key_given_twice_is_its_next_version(memories: MemoryStore) -> None:
    before = await memories.astore("alice", "v1", key="k", ttl=60)
    made = await memories.astore_many(
        "alice",
        [NewMemory("v2", key="k"), NewMemory("other", key="o"), NewMemory("v3", key="k")],
        batch_size=2,
    )
    assert [(m.key, m.version) for m in made] == [("k", 2), ("o", 1), ("k", 3)]
    assert made[2].created_at == before.created_at and made[2].expires_at is None
    history = await memories.ahistory("alice", "k")
    assert [m.content for m in history] == ["v3", "v2", "v1"]


async def test_an_expired_memory_is_replaced_by_a_new_one(
    memories: MemoryStore, clock: Clock
) -> None:
    old = await memories.astore("alice", "old", key="k", ttl=60)
    await memories.astore("alice", "v1", key="k2")
    clock.advance(61)
    made = await memories.astore_many("alice", [NewMemory("new", key="k")])
    assert made[0].version == 1 and made[0].created_at > old.created_at
    assert [m.content for m in await memories.ahistory("alice", "k")] == ["new"]


async def test_another_users_key_is_not_touched(memories: MemoryStore) -> None:
    bob = await memories.astore("bob", "bob's", key="shared")
    made = await memories.astore_many("alice", [NewMemory("alice's", key="shared")])
    assert made[0].user_id == "alice" and made[0].version == 1
    assert await memories.aget("bob", "shared") == bob


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (NewMemory("x", key=""), ConfigError),
        (NewMemory("x", namespace=("a.b",)), ConfigError),
        (NewMemory("x", ttl=-1), ConfigError),
        ({"content": "x", "colour": "red"}, ConfigError),
        ({"key": "no content"}, ConfigError),
        (42, ConfigError),
        (NewMemory("x", metadata={"n": object()}), SerializationError),
        (NewMemory("\ud800 lone surrogate"), SerializationError),
        (NewMemory("x" * (2 * 1024 * 1024 + 1)), SerializationError),
    ],
)
async def test_one_bad_memory_writes_none(memories: MemoryStore, bad: Any, error: type) -> None:
    await memories.astore("alice", "there before", key="k")
    with pytest.raises(error):
        await memories.astore_many("alice", [NewMemory("fine", key="k"), bad, "fine too"])
    assert [m.content for m in await memories.alist("alice")] == ["there before"]


async def test_arguments_are_checked(memories: MemoryStore) -> None:
    for bad in ({"batch_size": 0}, {"batch_size": 5001}, {"embed_batch_size": True}):
        with pytest.raises(ConfigError):
            await memories.astore_many("alice", ["x"], **bad)
    with pytest.raises(ConfigError):
        await memories.astore_many("alice", "one string is not many")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        await memories.astore_many("", ["x"])
    assert await memories.astore_many("alice", []) == []
    assert await memories.alist("alice") == []


async def test_a_failure_mid_transaction_writes_nothing(memories: MemoryStore) -> None:
    """The database fails on the third round: the rounds before it are rolled back."""
    await memories.astore("alice", "there before", key="k0")
    seen: list[str] = []

    def fail(sql: str) -> None:
        if "INSERT INTO" in sql and "memories" in sql:
            seen.append(sql)
            if len(seen) == 3:
                raise RuntimeError("the server went away")

    stop = memories.backend.on_statement(fail)
    try:
        with pytest.raises((RuntimeError, TenxStoreError)):
            await memories.astore_many("alice", [f"m{n}" for n in range(10)], batch_size=3)
    finally:
        stop()
    assert len(seen) == 3
    assert [m.content for m in await memories.alist("alice")] == ["there before"]


async def test_cancelled_midway_writes_nothing(memories: MemoryStore) -> None:
    started = asyncio.Event()
    loop = asyncio.get_running_loop()
    calls: list[str] = []

    def seen(sql: str) -> None:
        if "INSERT INTO" in sql and "memories" in sql:
            calls.append(sql)
            if len(calls) == 2:
                loop.call_soon_threadsafe(started.set)

    stop = memories.backend.on_statement(seen)
    try:
        task = asyncio.create_task(
            memories.astore_many("alice", [f"m{n}" for n in range(400)], batch_size=1)
        )
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        stop()
    assert await memories.alist("alice") == []
    assert await memories.astore_many("alice", ["after"])  # the store still works


async def test_loads_of_one_key_at_once_lose_nothing(memories: MemoryStore) -> None:
    """Loads and single writers of the same keys at once take turns: every write is a
    version of its key, none lost, none twice (real concurrency, no sleeps)."""
    keys = [f"k{n}" for n in range(6)]
    loads = [
        memories.astore_many("alice", [NewMemory(f"{w}:{k}", key=k) for k in keys[::step]])
        for w, step in (("a", 1), ("b", -1), ("c", 2))
    ]
    singles = [memories.astore("alice", f"s:{k}", key=k) for k in keys[:3]]
    await asyncio.gather(*loads, *singles)
    for n, k in enumerate(keys):
        writes = 2 + (n % 2 == 0) + (n < 3)
        history = await memories.ahistory("alice", k)
        assert sorted(m.version for m in history) == list(range(1, writes + 1)), k


async def test_vectors_are_written_in_bulk_and_found(vstore: MemoryStore) -> None:
    made = await vstore.astore_many(
        "alice",
        [
            NewMemory("Alice drinks a double espresso every morning", key="coffee"),
            NewMemory("Alice is a vegetarian", key="diet"),
            NewMemory("no vector for this one", key="plain", embed=False),
            NewMemory("stored text", key="picked", embed="golden retriever called Biscuit"),
        ],
        embed_batch_size=2,
    )
    assert len(made) == 4
    assert await _count(vstore) == (4, 3)
    hits = await vstore.asearch("alice", "espressos", mode="vector")
    assert hits[0].memory.key == "coffee"
    dog = await vstore.asearch("alice", "retrievers", mode="vector")
    assert dog[0].memory.key == "picked"
    again = await vstore.astore_many("alice", [NewMemory("Alice eats meat now", key="diet")])
    assert again[0].version == 2 and await _count(vstore) == (4, 3)


class _Raises(HashingEmbedding):
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if any("poison" in t for t in texts):
            raise RuntimeError("the model server is down")
        return super().embed_documents(texts)


async def test_an_embedding_failure_writes_nothing(store_backend: Backend) -> None:
    store = MemoryStore(await store_backend.make(), embedding=_Raises())
    try:
        with pytest.raises(EmbeddingError):
            await store.astore_many(
                "alice", ["fine", *(f"m{n}" for n in range(5)), "poison"], embed_batch_size=2
            )
        assert await _count(store) == (0, 0)
    finally:
        await store.aclose()


async def test_the_sync_twin(memories: MemoryStore) -> None:
    made = await asyncio.to_thread(memories.store_many, "alice", ["a", NewMemory("b", key="b")])
    assert [m.content for m in made] == ["a", "b"]
    assert await memories.aget("alice", "b") == made[1]


def _item(ns: str, key: str) -> _Item:
    return _Item(0, ns, key, None, None)  # type: ignore[arg-type]


def test_rounds_take_keys_in_one_order_each_keys_writes_in_the_callers() -> None:
    items = [_item("n", k) for k in ["c", "a", "b", "a", "d", "a", "e"]]
    for n, item in enumerate(items):
        item.at = n
    got = [[[i.at for i in writes] for writes in r] for r in rounds(items, 2)]
    assert got == [[[1, 3, 5], [2]], [[0], [4]], [[6]]]
    assert rounds([_item("y", "a"), _item("x", "b")], 5)[0][0][0].ns == "x"
