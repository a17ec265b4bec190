"""The documents' five memory methods, held to one contract: each test runs against
tenxstore's :class:`MemoryStore` (SQLite) and against :class:`Mem0Store` over a local,
offline Mem0 (Qdrant in local mode in ``tmp_path``, the deterministic test embedding,
``infer=False`` and no LLM: any call of one fails the test, and so does any socket
opened). What needs an LLM (Mem0's ``infer=True``) is not tested here: see
docs/memory.md, "Mem0Store".
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

# Before mem0 is imported: no usage events, and its ~/.mem0 kept out of the home.
os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tenxstore import (
    AuthPolicy,
    ConfigError,
    Memory,
    MemoryNotFound,
    MemoryStore,
    NewMemory,
    StaleStateError,
)
from tenxstore.memory.mem0 import Mem0Store, local_mem0
from tests import services
from tests.memory.embeddings import HashingEmbedding

KINDS = ["memorystore", "mem0"]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any socket connection fails the test (SQLite and local Qdrant need none); and
    mem0 is required (the ``mem0`` extra: a failure under CI, else a skip)."""
    services.require_modules("mem0", "mem0")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a network connection was attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


@pytest.fixture(params=KINDS)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, no_network: None
) -> AsyncIterator[Any]:
    """The same five methods on each kind of store, empty, searched by meaning."""
    if request.param == "memorystore":
        real = MemoryStore(f"sqlite:///{tmp_path / 'm.db'}", embedding=HashingEmbedding())
        await real.asetup()
        yield real
        await real.aclose()
        return
    memory = local_mem0(tmp_path / "qdrant", embedding=HashingEmbedding())
    adapter = Mem0Store(memory)
    yield adapter
    assert memory.llm.calls == 0  # no LLM was ever asked
    await adapter.aclose()


# -- store and get -------------------------------------------------------------------


async def test_store_then_get(store: Any) -> None:
    made = await store.astore("alice", "prefers tea", metadata={"topic": "drinks"})
    assert isinstance(made, Memory)
    assert (made.namespace, made.user_id, made.version, made.expires_at) == (
        ("memories",),
        "alice",
        1,
        None,
    )
    assert (made.content, made.metadata) == ("prefers tea", {"topic": "drinks"})
    assert made.created_at == made.updated_at
    assert await store.aget("alice", made.key) == made
    other = await store.astore("alice", "prefers tea")
    assert other.key != made.key  # no key: a new memory every time


async def test_every_json_value_round_trips(store: Any) -> None:
    meta = {"n": 1, "f": 1.5, "b": True, "none": None, "list": [1, "a"], "nested": {"x": {}}}
    made = await store.astore("alice", "text ünïcode ✓", metadata=meta, key="k")
    got = await store.aget("alice", "k")
    assert got is not None and (got.content, got.metadata) == ("text ünïcode ✓", meta)
    assert got == made


async def test_store_with_a_key_is_an_upsert(store: Any) -> None:
    first = await store.astore("alice", "v1", key="pref", ttl=3600, metadata={"a": 1})
    second = await store.astore("alice", "v2", key="pref")
    assert (second.key, second.version, second.content, second.metadata) == ("pref", 2, "v2", {})
    assert second.created_at == first.created_at
    assert second.updated_at >= first.updated_at
    assert first.expires_at is not None and second.expires_at is None  # the TTL set anew
    third = await store.astore("alice", "v3", key="pref", ttl=timedelta(hours=1))
    assert third.version == 3
    assert third.expires_at is not None and third.expires_at > third.updated_at
    assert await store.aget("alice", "pref") == third


async def test_the_same_key_in_two_namespaces_is_two_memories(store: Any) -> None:
    await store.astore("alice", "home", key="k")
    await store.astore("alice", "work", key="k", namespace=("memories", "work"))
    home = await store.aget("alice", "k")
    work = await store.aget("alice", "k", namespace=("memories", "work"))
    assert home is not None and work is not None
    assert (home.content, work.content, work.namespace) == ("home", "work", ("memories", "work"))
    assert await store.aget("alice", "k", namespace=("other",)) is None


# -- update --------------------------------------------------------------------------


async def test_update_replaces_content_or_metadata_and_keeps_the_expiry(store: Any) -> None:
    made = await store.astore("alice", "old", key="k", metadata={"n": 1}, ttl=3600)
    meta_only = await store.aupdate("alice", "k", metadata={"n": 2})
    assert (meta_only.content, meta_only.metadata, meta_only.version) == ("old", {"n": 2}, 2)
    both = await store.aupdate("alice", "k", content="new", expected_version=2)
    assert (both.content, both.metadata, both.version) == ("new", {"n": 2}, 3)
    assert both.expires_at == made.expires_at
    assert both.created_at == made.created_at
    removed = await store.aupdate("alice", "k", metadata={})
    assert removed.metadata == {}  # replaced, not merged
    with pytest.raises(ConfigError):
        await store.aupdate("alice", "k")


async def test_update_of_a_stale_version_raises_and_writes_nothing(store: Any) -> None:
    await store.astore("alice", "v1", key="k")
    await store.aupdate("alice", "k", content="v2")
    with pytest.raises(StaleStateError) as caught:
        await store.aupdate("alice", "k", content="lost", expected_version=1)
    assert (caught.value.expected_version, caught.value.actual_version) == (1, 2)
    assert (vars(caught.value)["key"], vars(caught.value)["namespace"]) == ("k", ("memories",))
    found = await store.aget("alice", "k")
    assert found is not None and (found.content, found.version) == ("v2", 2)


async def test_update_of_an_absent_memory_is_memory_not_found(store: Any) -> None:
    with pytest.raises(MemoryNotFound) as caught:
        await store.aupdate("alice", "nope", content="x")
    assert isinstance(caught.value, KeyError)
    assert (caught.value.key, caught.value.namespace) == ("nope", ("memories",))


async def test_concurrent_compare_and_swap_lets_one_writer_win(store: Any) -> None:
    await store.astore("alice", "v1", key="k")

    async def write(text: str) -> Any:
        try:
            return await store.aupdate("alice", "k", content=text, expected_version=1)
        except StaleStateError as exc:
            return exc

    results = await asyncio.gather(*(write(f"writer {i}") for i in range(4)))
    won = [r for r in results if isinstance(r, Memory)]
    assert len(won) == 1 and won[0].version == 2
    assert all(isinstance(r, StaleStateError) for r in results if r is not won[0])
    found = await store.aget("alice", "k")
    assert found is not None and (found.content, found.version) == (won[0].content, 2)


# -- delete --------------------------------------------------------------------------


async def test_delete(store: Any) -> None:
    await store.astore("alice", "x", key="k")
    assert await store.adelete("alice", "k") is True
    assert await store.aget("alice", "k") is None
    assert await store.adelete("alice", "k") is False
    assert await store.asearch("alice", "x") == []
    again = await store.astore("alice", "y", key="k")
    assert again.version == 1  # a new memory


# -- search --------------------------------------------------------------------------


async def test_search_finds_by_meaning_best_first(store: Any) -> None:
    await store.astore("alice", "I drink espresso every morning", key="coffee")
    await store.astore("alice", "My sister lives in Lisbon", key="family")
    await store.astore("alice", "I am allergic to peanuts", key="health")
    hits = await store.asearch("alice", "espressos", limit=5)
    assert hits and hits[0].memory.key == "coffee"
    assert all(0.0 <= h.score <= 1.0 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert len(await store.asearch("alice", "espressos", limit=1)) == 1
    assert await store.asearch("alice", "espressos", limit=0) == []
    high = await store.asearch("alice", "espressos", score_threshold=0.5)
    assert all(h.score >= 0.5 for h in high)


async def test_search_filters_on_metadata(store: Any) -> None:
    await store.astore("alice", "tea in the morning", key="a", metadata={"n": 1, "t": "x"})
    await store.astore("alice", "tea at night", key="b", metadata={"n": 5, "t": "y"})
    await store.astore("alice", "tea with lunch", key="c", metadata={})

    async def keys(filter: dict[str, Any]) -> set[str]:
        return {h.memory.key for h in await store.asearch("alice", "tea", filter=filter)}

    assert await keys({"t": "x"}) == {"a"}
    assert await keys({"n": {"$gt": 2}}) == {"b"}
    assert await keys({"t": {"$in": ["x", "y"]}}) == {"a", "b"}
    assert await keys({"t": {"$ne": "x"}}) == {"b", "c"}  # an absent key matches $ne
    with pytest.raises(ConfigError):
        await store.asearch("alice", "tea", filter={"n": {"$regex": "."}})


async def test_search_is_scoped_to_the_namespace_and_those_under_it(store: Any) -> None:
    await store.astore("alice", "tea at home", key="a")
    await store.astore("alice", "tea at work", key="b", namespace=("memories", "work"))
    await store.astore("alice", "tea elsewhere", key="c", namespace=("other",))
    found = {h.memory.key for h in await store.asearch("alice", "tea")}
    assert found == {"a", "b"}
    work = await store.asearch("alice", "tea", namespace=("memories", "work"))
    assert {h.memory.key for h in work} == {"b"}
    everywhere = await store.asearch("alice", "tea", namespace=())
    assert {h.memory.key for h in everywhere} == {"a", "b", "c"}


# -- users ---------------------------------------------------------------------------


async def test_one_user_never_sees_another_users_memories(store: Any) -> None:
    await store.astore("alice", "alice likes green tea", key="k", metadata={"s": 1})
    assert await store.aget("bob", "k") is None
    assert await store.asearch("bob", "green tea") == []
    assert await store.asearch("bob", "green tea", namespace=()) == []
    with pytest.raises(MemoryNotFound):
        await store.aupdate("bob", "k", content="mine now")
    assert await store.adelete("bob", "k") is False
    bobs = await store.astore("bob", "bob likes green tea", key="k")
    assert bobs.version == 1  # bob's own memory under the same key
    alices = await store.aget("alice", "k")
    assert alices is not None and (alices.content, alices.version) == ("alice likes green tea", 1)
    assert [h.memory.user_id for h in await store.asearch("alice", "green tea")] == ["alice"]


@pytest.mark.parametrize("bad", [None, "", 7, "x" * 256])
async def test_a_missing_or_invalid_user_is_config_error(store: Any, bad: Any) -> None:
    with pytest.raises(ConfigError):
        await store.astore(bad, "x")
    with pytest.raises(ConfigError):
        await store.aget(bad, "k")
    with pytest.raises(ConfigError):
        await store.asearch(bad, "x")
    with pytest.raises(ConfigError):
        await store.aupdate(bad, "k", content="x")
    with pytest.raises(ConfigError):
        await store.adelete(bad, "k")


async def test_bad_arguments_are_config_errors(store: Any) -> None:
    with pytest.raises(ConfigError):
        await store.astore("alice", "x", namespace=("a.b",))
    with pytest.raises(ConfigError):
        await store.astore("alice", "x", namespace=())
    with pytest.raises(ConfigError):
        await store.astore("alice", "x", ttl=0)
    with pytest.raises(ConfigError):
        await store.aget("alice", "")
    with pytest.raises(ConfigError):
        await store.asearch("alice", "x", limit=-1)
    with pytest.raises(ConfigError):
        await store.asearch("alice", "x", score_threshold=2)
    with pytest.raises(ConfigError):
        await store.aget("alice", "k", auth_policy={"enforce_user_isolation": False})
    scoped = await store.aget("alice", "k", auth_policy=AuthPolicy(enforce_user_isolation=True))
    assert scoped is None


# -- expiry --------------------------------------------------------------------------


async def test_an_expired_memory_is_never_returned(store: Any) -> None:
    await store.astore("alice", "short lived tea", key="k", ttl=0.5)
    await store.astore("alice", "long lived tea", key="long", ttl=3600)
    assert await store.aget("alice", "k") is not None
    await asyncio.sleep(0.7)
    assert await store.aget("alice", "k") is None
    assert {h.memory.key for h in await store.asearch("alice", "tea")} == {"long"}
    with pytest.raises(MemoryNotFound):
        await store.aupdate("alice", "k", content="x")
    again = await store.astore("alice", "back", key="k")
    assert (again.version, again.expires_at) == (1, None)  # the expired one was gone
    await store.astore("alice", "gone soon", key="g", ttl=0.3)
    await asyncio.sleep(0.5)
    assert await store.adelete("alice", "g") is False


# -- what TenxStore reads besides: listings and the bulk store ------------------------


async def test_list_newest_first_with_namespaces_under_it(store: Any) -> None:
    a = await store.astore("alice", "a", namespace=("memories",))
    b = await store.astore("alice", "b", namespace=("memories", "work"))
    c = await store.astore("alice", "c", namespace=("notes",))
    assert [m.key for m in await store.alist("alice")] == [b.key, a.key]
    assert [m.key for m in await store.alist("alice", namespace=("memories", "work"))] == [b.key]
    assert [m.key for m in await store.alist("alice", namespace=())] == [c.key, b.key, a.key]
    assert [m.key for m in await store.alist("alice", limit=1, offset=1)] == [a.key]
    assert await store.alist("bob", namespace=()) == []


async def test_list_namespaces(store: Any) -> None:
    for ns in (("a",), ("a", "b"), ("a", "b", "c"), ("x", "b"), ("x", "y", "c")):
        await store.astore("alice", "m", namespace=ns)
    assert await store.alist_namespaces("alice") == [
        ("a",),
        ("a", "b"),
        ("a", "b", "c"),
        ("x", "b"),
        ("x", "y", "c"),
    ]
    assert await store.alist_namespaces("alice", prefix=("a",)) == [
        ("a",),
        ("a", "b"),
        ("a", "b", "c"),
    ]
    assert await store.alist_namespaces("alice", suffix=("c",)) == [
        ("a", "b", "c"),
        ("x", "y", "c"),
    ]
    assert await store.alist_namespaces("alice", max_depth=1) == [("a",), ("x",)]
    assert await store.alist_namespaces("alice", limit=2, offset=1) == [("a", "b"), ("a", "b", "c")]
    assert await store.alist_namespaces("bob") == []


async def test_store_many_in_order(store: Any) -> None:
    made = await store.astore_many(
        "alice", ["one", {"content": "two", "key": "k"}, NewMemory("three", key="k")]
    )
    assert [(m.content, m.version) for m in made] == [("one", 1), ("two", 1), ("three", 2)]
    found = await store.aget("alice", "k")
    assert found is not None and found.content == "three"
    with pytest.raises(ConfigError):
        await store.astore_many("alice", ["fine", {"content": "bad", "ttl": -1}])
    assert [m.content for m in await store.alist("alice")] == ["three", "one"]  # none stored


# -- the sync twins ------------------------------------------------------------------


def test_sync_twins(tmp_path: Path, no_network: None) -> None:
    for kind in KINDS:
        if kind == "memorystore":
            s: Any = MemoryStore(f"sqlite:///{tmp_path / 's.db'}", embedding=HashingEmbedding())
            s.setup()
        else:
            s = Mem0Store(local_mem0(tmp_path / "q", embedding=HashingEmbedding()))
        made = s.store("alice", "sync espresso", key="k", metadata={"a": 1})
        assert s.get("alice", "k") == made
        assert s.update("alice", "k", content="sync espressos", expected_version=1).version == 2
        assert [h.memory.key for h in s.search("alice", "espresso")] == ["k"]
        assert s.delete("alice", "k") is True
        assert s.get("alice", "k") is None
        asyncio.run(s.aclose())
