"""Qdrant as the memory's vector index (``QdrantIndex``, local mode: no server), on
every SQL database: found by meaning per user, never a foreign, expired or stale
result, repaired from the database when Qdrant missed a write or was wiped, and the
database's own index answering while Qdrant fails."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from qdrant_client import AsyncQdrantClient, models

from tenxstore import ConfigError, MemoryStore
from tenxstore.memory import QdrantIndex
from tenxstore.memory.qdrant import point_id
from tests.conftest import Backend, backend_for
from tests.memory.conftest import Clock
from tests.memory.embeddings import HashingEmbedding, SmallHashing

LOGGER = "tenxstore.memory.qdrant"


class Breakable(AsyncQdrantClient):
    """A real local-mode client that fails every call while ``broken`` (as a server
    that went away would: ConnectionError)."""

    broken = False

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name != "close" and callable(attr) and super().__getattribute__("broken"):

            async def down(*args: Any, **kwargs: Any) -> Any:
                raise ConnectionError("Qdrant is down")

            return down
        return attr


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with backend_for(request.param, tmp_path) as b:
        yield b


async def _store(db: Backend, index: QdrantIndex, embedding: Any = None) -> MemoryStore:
    store = MemoryStore(
        await db.make(), embedding=embedding or HashingEmbedding(), vector_index=index
    )
    await store.asetup()
    return store


@pytest.fixture
async def qstore(db: Backend, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    store = await _store(db, QdrantIndex(path=str(tmp_path / "qdrant"), retry_after=0))
    yield store
    await store.aclose()


def _index(store: MemoryStore) -> QdrantIndex:
    assert store.vector_index is not None
    return store.vector_index


async def _count(store: MemoryStore) -> int:
    index = _index(store)
    return (await index.client.count(index.collection, exact=True)).count


async def _keys(store: MemoryStore, user: str, query: str, **options: Any) -> list[str]:
    return [h.memory.key for h in await store.asearch(user, query, **options)]


async def test_found_by_meaning_per_user(
    qstore: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    await qstore.astore("alice", "Alice is a vegetarian", key="diet")
    await qstore.astore("alice", "Alice drinks espresso", key="coffee")
    await qstore.astore("bob", "Alice is a vegetarian", key="diet")  # the same text, bob's
    # bob's many nearer points never take alice's top-k slots
    await qstore.astore_many("bob", [f"vegetarians {n}" for n in range(40)])
    assert await _count(qstore) == 43
    hits = await qstore.asearch("alice", "vegetarians", mode="vector", limit=1)
    assert [(h.memory.user_id, h.memory.key) for h in hits] == [("alice", "diet")]
    assert 0.0 <= hits[0].score <= 1.0
    both = await qstore.asearch("alice", "vegetarians", limit=10)
    assert [h.memory.key for h in both] == ["diet", "coffee"]
    assert all(h.memory.user_id == "alice" and 0 <= h.score <= 1 for h in both)
    bobs = await qstore.asearch("bob", "vegetarians", limit=50)
    assert len(bobs) == 41 and {h.memory.user_id for h in bobs} == {"bob"}
    assert caplog.records == []  # Qdrant answered: no fallback


async def test_hybrid_keywords_still_fuse(qstore: MemoryStore) -> None:
    await qstore.astore("alice", "Alice is a vegetarian", key="diet")
    await qstore.astore("alice", "The staging deploy code is QX-7731", key="code")
    await qstore.astore("alice", "no vector here QX-7731", key="plain", embed=False)
    assert (await _keys(qstore, "alice", "QX-7731"))[:2] in (["code", "plain"], ["plain", "code"])
    assert await _keys(qstore, "alice", "vegetarians", mode="vector", limit=1) == ["diet"]


async def test_namespace_and_expiry(qstore: MemoryStore, clock: Clock) -> None:
    await qstore.astore("alice", "vegetarian at work", namespace=("memories", "work"), key="w")
    await qstore.astore("alice", "vegetarian at home", namespace=("memories", "home"), key="h")
    await qstore.astore("alice", "vegetarian for a while", key="t", ttl=60)
    work = await _keys(qstore, "alice", "vegetarian", namespace=("memories", "work"))
    assert work == ["w"]
    assert set(await _keys(qstore, "alice", "vegetarian", mode="vector")) == {"w", "h", "t"}
    clock.advance(61)
    assert set(await _keys(qstore, "alice", "vegetarian", mode="vector")) == {"w", "h"}
    await qstore.asweep_expired()  # a write the index did not see: repaired on read
    assert set(await _keys(qstore, "alice", "vegetarian", mode="vector")) == {"w", "h"}
    assert await _count(qstore) == 2


async def test_update_and_delete(qstore: MemoryStore) -> None:
    await qstore.astore("alice", "Alice is a vegetarian", key="diet")
    await qstore.aupdate("alice", "diet", content="Alice drinks espresso")
    hits = await qstore.asearch("alice", "espresso", mode="vector", limit=1)
    assert hits[0].memory.content == "Alice drinks espresso" and hits[0].memory.version == 2
    assert await qstore.adelete("alice", "diet") is True
    assert await qstore.asearch("alice", "espresso", mode="vector") == []
    assert await _count(qstore) == 0


async def test_a_stale_point_never_returns_wrong_content(qstore: MemoryStore) -> None:
    old = await qstore.astore("alice", "Alice is a vegetarian", key="diet")
    await qstore.astore("bob", "Bob drinks espresso", key="coffee")
    index = _index(qstore)
    query = (await HashingEmbedding().aembed_documents(["espresso"]))[0]
    # alice's point made to look like espresso, with an old revision, and a point
    # claiming bob's memory for alice
    stale = index.client
    forged = [
        models.PointStruct(
            id=point_id("alice", "memories", "diet"),
            vector=query,
            payload={
                "user": "alice",
                "namespace": "memories",
                "ns_path": ["memories"],
                "key": "diet",
                "memory_id": 1,
                "expires_at": None,
                "rev": f"{old.key}:0:x",
            },
        )
    ]
    await stale.upsert(index.collection, forged)
    hits = await qstore.asearch("alice", "espresso", mode="vector")
    assert [(h.memory.user_id, h.memory.content) for h in hits] == [
        ("alice", "Alice is a vegetarian")
    ]
    assert hits[0].score < 0.75  # its own vector's score, not the forged one's
    assert {h.memory.user_id for h in await qstore.asearch("bob", "espresso")} == {"bob"}


async def test_qdrant_wiped_then_reindexed(
    qstore: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    await qstore.astore_many("alice", ["Alice is a vegetarian", "Alice drinks espresso"])
    index = _index(qstore)
    await index.client.delete_collection(index.collection)
    found = await qstore.asearch("alice", "vegetarians", mode="vector")
    assert found[0].memory.content == "Alice is a vegetarian"  # the database's
    assert "failed a search" in caplog.text
    again = await qstore.asearch("alice", "vegetarians", mode="vector")  # made and repaired
    assert [h.memory.content for h in again] == [h.memory.content for h in found]
    assert await _count(qstore) == 2
    await index.client.delete_collection(index.collection)
    await index.client.delete_collection(index.markers_collection)
    assert await qstore.areindex(batch_size=1) == 2
    assert await _count(qstore) == 2


async def test_a_fresh_qdrant_is_filled_from_the_database(db: Backend, tmp_path: Path) -> None:
    first = await _store(db, QdrantIndex(path=str(tmp_path / "one")))
    await first.astore("alice", "Alice is a vegetarian", key="diet")
    await first.aclose()
    plain = MemoryStore(await db.make(), embedding=HashingEmbedding())  # no index
    await plain.astore("alice", "Alice drinks espresso", key="coffee")
    second = await _store(db, QdrantIndex(path=str(tmp_path / "two")))
    try:
        assert await _keys(second, "alice", "espresso", mode="vector", limit=1) == ["coffee"]
        assert await _count(second) == 2  # the scope repaired on read
    finally:
        await second.aclose()
        await plain.aclose()


async def test_qdrant_down_falls_back(
    db: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    client = Breakable(path=str(tmp_path / "q"))
    store = await _store(db, QdrantIndex(client=client, retry_after=0))
    try:
        await store.astore("alice", "Alice is a vegetarian", key="diet")
        client.broken = True
        await store.astore("alice", "Alice drinks espresso", key="coffee")  # committed
        await store.astore("bob", "Bob drinks espresso", key="coffee")
        hits = await store.asearch("alice", "espresso", mode="vector")
        assert [(h.memory.user_id, h.memory.key) for h in hits] == [
            ("alice", "coffee"),
            ("alice", "diet"),
        ]
        assert "failed a write" in caplog.text and "failed a search" in caplog.text
        client.broken = False
        assert await _keys(store, "alice", "espresso", mode="vector") == ["coffee", "diet"]
        assert await _count(store) == 2  # alice's scope repaired; bob's when searched
        assert await _keys(store, "bob", "espresso", mode="vector") == ["coffee"]
        assert await _count(store) == 3
    finally:
        await store.aclose()
    assert await client.collection_exists("tenxstore_memories")  # the caller's client: open
    await client.close()


async def test_model_mismatch_and_arguments(db: Backend, tmp_path: Path) -> None:
    path = str(tmp_path / "q")
    store = await _store(db, QdrantIndex(path=path))
    await store.astore("alice", "Alice is a vegetarian", key="diet")
    await store.aclose()
    plain = MemoryStore(await db.make(), embedding=SmallHashing())
    await plain.areembed()  # the database's vectors are another model's now
    await plain.aclose()
    other = MemoryStore(await db.make(), embedding=SmallHashing(), vector_index=QdrantIndex(path))
    try:
        with pytest.raises(ConfigError, match="Qdrant collection 'tenxstore_memories' holds"):
            await other.asetup()
        with pytest.raises(ConfigError, match="holds vectors of"):
            await other.areindex()  # another model's collection: never remade unasked
        assert await other.areindex(recreate=True) == 1  # made anew for the new model
        assert await _keys(other, "alice", "vegetarians", mode="vector") == ["diet"]
    finally:
        await other.aclose()
    for bad in (
        lambda: QdrantIndex(),
        lambda: QdrantIndex(path, url="http://localhost:6333"),
        lambda: QdrantIndex(path, api_key="k"),
        lambda: QdrantIndex(path, collection=""),
        lambda: MemoryStore("memory", vector_index=QdrantIndex(path)),
        lambda: MemoryStore("memory", embedding=HashingEmbedding(), vector_index=object()),
    ):
        with pytest.raises(ConfigError):
            bad()
    with pytest.raises(ConfigError, match="reindex needs a vector index"):
        await MemoryStore("memory", embedding=HashingEmbedding()).areindex()


def test_import_tenxstore_leaves_qdrant_client_alone() -> None:
    code = (
        "import sys, tenxstore, tenxstore.memory; tenxstore.MemoryStore;"
        "assert 'qdrant_client' not in sys.modules; tenxstore.memory.QdrantIndex;"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


async def test_a_vector_rewritten_at_the_same_version_is_searched_anew(
    qstore: MemoryStore,
) -> None:
    """``areembed`` back to the index's model with another ``text_of`` rewrites every
    vector at the same memory version: Qdrant's points are repaired, not trusted."""
    await qstore.astore("alice", "Alice drinks a double espresso every morning", key="coffee")
    await qstore.astore("alice", "Alice moved to Lisbon in the spring", key="city")
    assert (await _keys(qstore, "alice", "espresso", mode="vector"))[0] == "coffee"
    await qstore.areembed(HashingEmbedding(model_id="elsewhere"))
    topics = {"coffee": "Lisbon trams", "city": "espresso beans"}
    assert await qstore.areembed(text_of=lambda m: topics[m.key]) == 2
    assert (await _keys(qstore, "alice", "espresso", mode="vector"))[0] == "city"
    assert (await _keys(qstore, "alice", "trams", mode="vector"))[0] == "coffee"
