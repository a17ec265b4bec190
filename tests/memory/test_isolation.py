"""Memories are the user's: another user's reads as absent to every method; ids and
labels are data (LIKE wildcards, ``*`` and ``\\`` match only themselves)."""

from __future__ import annotations

import pytest

from tenxstore import AuthPolicy, ConfigError, MemoryNotFound, MemoryStore
from tests.conftest import Backend

SIMILAR = ["user_1", "user_10", "user%", "user_", "USER_1", "user\\1"]


async def test_another_users_memory_is_absent_to_every_method(memories: MemoryStore) -> None:
    for user in SIMILAR:
        await memories.astore(user, f"word of {user}", key="k", namespace=("ns",))
    for user in SIMILAR:
        mine = await memories.aget(user, "k", namespace=("ns",))
        assert mine is not None and mine.content == f"word of {user}"
        assert [m.user_id for m in await memories.alist(user, namespace=("ns",))] == [user]
        hits = await memories.asearch(user, "word", namespace=("ns",), limit=50)
        assert [h.memory.user_id for h in hits] == [user]
        assert len(await memories.ahistory(user, "k", namespace=("ns",))) == 1
        assert await memories.alist_namespaces(user) == [("ns",)]
    for absent in ("user", "user_2", "user%%", "u", "user_1 "):
        assert await memories.aget(absent, "k", namespace=("ns",)) is None
        assert await memories.alist(absent, namespace=()) == []
        assert await memories.asearch(absent, "word", namespace=()) == []
        assert await memories.ahistory(absent, "k", namespace=("ns",)) == []
        assert await memories.alist_namespaces(absent) == []
        with pytest.raises(MemoryNotFound):
            await memories.aupdate(absent, "k", content="stolen", namespace=("ns",))
        assert await memories.adelete(absent, "k", namespace=("ns",)) is False
    theirs = await memories.astore("user", "my own", key="k", namespace=("ns",))
    assert theirs.version == 1  # another user's key is not this user's memory
    assert (await memories.aget("user_1", "k", namespace=("ns",))).content == "word of user_1"  # type: ignore[union-attr]


@pytest.mark.parametrize("label", ["a%", "a_", "a*", "a\\"])
async def test_namespace_labels_match_only_themselves(memories: MemoryStore, label: str) -> None:
    await memories.astore("alice", "inside", key="in", namespace=(label, "x"))
    await memories.astore("alice", "beside", key="out", namespace=("ab", "x"))
    await memories.astore("alice", "prefix", key="pre", namespace=("a",))
    listed = await memories.alist("alice", namespace=(label,))
    assert [m.key for m in listed] == ["in"]
    assert await memories.alist_namespaces("alice", prefix=(label,)) == [(label, "x")]
    assert [m.key for m in await memories.alist("alice", namespace=("a",))] == ["pre"]
    hits = await memories.asearch("alice", "inside beside prefix", namespace=(label,))
    assert [h.memory.key for h in hits] == ["in"]


async def test_auth_policy_lifts_isolation_for_listings(memories: MemoryStore) -> None:
    await memories.astore("alice", "shared word", key="a")
    await memories.astore("bob", "shared word", key="b")
    operator = AuthPolicy(enforce_user_isolation=False)
    assert {m.user_id for m in await memories.alist(None, auth_policy=operator)} == {
        "alice",
        "bob",
    }
    assert len(await memories.asearch("anyone", "shared", auth_policy=operator)) == 2
    assert await memories.alist_namespaces(None, auth_policy=operator) == [("memories",)]
    with pytest.raises(ConfigError):
        await memories.alist(None)  # isolation applies: a user is needed
    with pytest.raises(ConfigError):  # a client's mapping never lifts isolation
        await memories.alist("alice", auth_policy={"enforce_user_isolation": False})  # type: ignore[arg-type]
    with pytest.raises(ConfigError):  # a memory is always some user's
        await memories.aget(None, "a", auth_policy=operator)


async def test_isolation_off_lists_every_user(backend: Backend) -> None:
    store = MemoryStore(await backend.make(enforce_user_isolation=False))
    assert store.enforce_user_isolation is False
    await store.astore("alice", "x")
    await store.astore("bob", "x")
    assert len(await store.alist(None)) == 2
    scoped = AuthPolicy(enforce_user_isolation=True)
    assert [m.user_id for m in await store.alist("bob", auth_policy=scoped)] == ["bob"]
