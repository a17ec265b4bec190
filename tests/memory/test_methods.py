"""The documents' methods: store, get, update, delete, history, list, namespaces."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tenxstore import ConfigError, Memory, MemoryNotFound, MemoryStore, StaleStateError
from tests.conftest import Backend


async def test_store_then_get(memories: MemoryStore) -> None:
    made = await memories.astore("alice", "prefers tea", metadata={"topic": "drinks"})
    assert isinstance(made, Memory)
    assert (made.namespace, made.user_id, made.version, made.expires_at) == (
        ("memories",),
        "alice",
        1,
        None,
    )
    assert made.created_at == made.updated_at
    assert await memories.aget("alice", made.key) == made
    other = await memories.astore("alice", "prefers tea")
    assert other.key != made.key  # no key: a new memory every time


async def test_store_with_a_key_is_an_upsert(memories: MemoryStore) -> None:
    first = await memories.astore("alice", "v1", key="pref", ttl=3600, metadata={"a": 1})
    second = await memories.astore("alice", "v2", key="pref")
    assert (second.version, second.content, second.metadata) == (2, "v2", {})
    assert second.created_at == first.created_at
    assert first.expires_at is not None and second.expires_at is None  # the TTL set anew
    third = await memories.astore("alice", "v3", key="pref", ttl=timedelta(hours=1))
    assert third.expires_at is not None and third.expires_at > third.updated_at
    assert [m.content for m in await memories.ahistory("alice", "pref")] == ["v3", "v2", "v1"]


async def test_update_replaces_content_or_metadata_and_keeps_the_expiry(
    memories: MemoryStore,
) -> None:
    made = await memories.astore("alice", "old", key="k", metadata={"n": 1}, ttl=3600)
    meta_only = await memories.aupdate("alice", "k", metadata={"n": 2})
    assert (meta_only.content, meta_only.metadata, meta_only.version) == ("old", {"n": 2}, 2)
    both = await memories.aupdate("alice", "k", content="new", expected_version=2)
    assert (both.content, both.metadata, both.version) == ("new", {"n": 2}, 3)
    assert both.expires_at == made.expires_at
    assert both.created_at == made.created_at
    with pytest.raises(ConfigError):
        await memories.aupdate("alice", "k")


async def test_update_of_a_stale_version_raises_and_writes_nothing(memories: MemoryStore) -> None:
    await memories.astore("alice", "v1", key="k")
    await memories.aupdate("alice", "k", content="v2")
    with pytest.raises(StaleStateError) as caught:
        await memories.aupdate("alice", "k", content="lost", expected_version=1)
    assert (caught.value.expected_version, caught.value.actual_version) == (1, 2)
    found = await memories.aget("alice", "k")
    assert found is not None and (found.content, found.version) == ("v2", 2)


async def test_update_of_an_absent_memory_is_memory_not_found(memories: MemoryStore) -> None:
    with pytest.raises(MemoryNotFound) as caught:
        await memories.aupdate("alice", "nope", content="x")
    assert isinstance(caught.value, KeyError)
    assert str(caught.value) == "no memory 'nope' in namespace ('memories',)"


async def test_delete_takes_the_history_with_it(memories: MemoryStore) -> None:
    await memories.astore("alice", "v1", key="k")
    await memories.aupdate("alice", "k", content="v2")
    assert await memories.adelete("alice", "k") is True
    assert await memories.adelete("alice", "k") is False
    assert await memories.aget("alice", "k") is None
    assert await memories.ahistory("alice", "k") == []
    again = await memories.astore("alice", "reborn", key="k")  # a new memory, a new life
    assert again.version == 1
    assert [m.content for m in await memories.ahistory("alice", "k")] == ["reborn"]


async def test_history_is_bounded_by_the_limit(backend: Backend) -> None:
    store = MemoryStore(await backend.make(), memory_history_limit=3)
    await store.astore("alice", "v1", key="k")
    for n in range(2, 7):
        await store.aupdate("alice", "k", content=f"v{n}")
    versions = await store.ahistory("alice", "k")
    assert [(m.version, m.content) for m in versions] == [(6, "v6"), (5, "v5"), (4, "v4")]
    assert all(m.created_at == versions[0].created_at for m in versions)
    assert await store.ahistory("alice", "never") == []


async def test_list_newest_first_with_namespaces_under_it(memories: MemoryStore) -> None:
    a = await memories.astore("alice", "a", namespace=("memories",))
    b = await memories.astore("alice", "b", namespace=("memories", "work"))
    c = await memories.astore("alice", "c", namespace=("notes",))
    assert [m.key for m in await memories.alist("alice")] == [b.key, a.key]
    assert [m.key for m in await memories.alist("alice", namespace=("memories", "work"))] == [b.key]
    assert [m.key for m in await memories.alist("alice", namespace=())] == [c.key, b.key, a.key]
    assert [m.key for m in await memories.alist("alice", limit=1, offset=1)] == [a.key]


async def test_list_namespaces(memories: MemoryStore) -> None:
    for ns in (("a",), ("a", "b"), ("a", "b", "c"), ("x", "b"), ("x", "y", "c")):
        await memories.astore("alice", "m", namespace=ns)
    assert await memories.alist_namespaces("alice") == [
        ("a",),
        ("a", "b"),
        ("a", "b", "c"),
        ("x", "b"),
        ("x", "y", "c"),
    ]
    assert await memories.alist_namespaces("alice", prefix=("a",)) == [
        ("a",),
        ("a", "b"),
        ("a", "b", "c"),
    ]
    assert await memories.alist_namespaces("alice", suffix=("c",)) == [
        ("a", "b", "c"),
        ("x", "y", "c"),
    ]
    assert await memories.alist_namespaces("alice", max_depth=1) == [("a",), ("x",)]
    assert await memories.alist_namespaces("alice", limit=2, offset=1) == [
        ("a", "b"),
        ("a", "b", "c"),
    ]
    assert await memories.alist_namespaces("bob") == []


async def test_every_json_value_round_trips(memories: MemoryStore) -> None:
    content = "nul \x00 emoji 🧠 accents éü and a long tail " + "x" * 100_000
    metadata = {"big": 2**70, "nested": {"l": [1, 2.5, None, True]}, "nul": "\x00"}
    made = await memories.astore("alice", content, metadata=metadata, key="exact")
    found = await memories.aget("alice", "exact")
    assert found == made
    assert (found.content, found.metadata) == (content, metadata)


async def test_a_stale_update_names_the_memory(memories: MemoryStore) -> None:
    await memories.astore("alice", "v1", key="k", namespace=("n",))
    await memories.aupdate("alice", "k", content="v2", namespace=("n",))
    with pytest.raises(StaleStateError) as caught:
        await memories.aupdate("alice", "k", content="x", expected_version=1, namespace=("n",))
    assert (caught.value.key, caught.value.namespace) == ("k", ("n",))  # type: ignore[attr-defined]


async def test_the_longest_ids_and_namespace(memories: MemoryStore) -> None:
    """255 characters each, of four bytes in UTF-8: MySQL's unique key holds them."""
    user, key = "\U0001f9e0" * 255, "\U0001f511" * 255
    namespace = ("\U0001f4c1" * 127, "\U0001f4c2" * 127)  # 255 with the "."
    made = await memories.astore(user, "deep", key=key, namespace=namespace)
    assert await memories.aget(user, key, namespace=namespace) == made
    assert await memories.alist_namespaces(user, prefix=namespace[:1]) == [namespace]
