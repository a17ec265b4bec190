"""An expired memory is never returned, before or after a sweep; sweeps go in batches."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tenxstore import ConfigError, MemoryNotFound, MemoryStore
from tests.memory.conftest import Clock

TTL = 60  # seconds: passed on the stores' clock, never waited out


async def test_expired_but_unswept_is_absent_to_every_method(
    memories: MemoryStore, clock: Clock
) -> None:
    await memories.astore("alice", "fleeting word", key="gone", ttl=TTL, namespace=("tmp",))
    await memories.aupdate("alice", "gone", content="fleeting word again", namespace=("tmp",))
    await memories.astore("alice", "lasting word", key="kept", ttl=timedelta(days=1))
    clock.advance(TTL + 1)
    assert await memories.aget("alice", "gone", namespace=("tmp",)) is None
    assert await memories.ahistory("alice", "gone", namespace=("tmp",)) == []
    assert [m.key for m in await memories.alist("alice", namespace=())] == ["kept"]
    assert [h.memory.key for h in await memories.asearch("alice", "word", namespace=())] == ["kept"]
    assert await memories.alist_namespaces("alice") == [("memories",)]
    with pytest.raises(MemoryNotFound):
        await memories.aupdate("alice", "gone", content="x", namespace=("tmp",))
    reborn = await memories.astore("alice", "new life", key="gone", namespace=("tmp",))
    assert reborn.version == 1 and reborn.expires_at is None  # not the expired one's v3
    assert [m.content for m in await memories.ahistory("alice", "gone", namespace=("tmp",))] == [
        "new life"
    ]


async def test_deleting_an_expired_memory_says_it_was_gone(
    memories: MemoryStore, clock: Clock
) -> None:
    await memories.astore("alice", "x", key="k", ttl=TTL)
    clock.advance(TTL + 1)
    assert await memories.adelete("alice", "k") is False
    assert await memories.asweep_expired() == 0  # the delete took its row


async def test_sweep_deletes_in_batches_with_the_history(
    memories: MemoryStore, clock: Clock
) -> None:
    for n in range(7):
        await memories.astore("alice", f"m{n}", key=f"k{n}", ttl=TTL)
        await memories.aupdate("alice", f"k{n}", content=f"m{n} again")
    await memories.astore("alice", "stays", key="stay")
    clock.advance(TTL + 1)
    assert await memories.asweep_expired(batch_size=3) == 7
    assert await memories.asweep_expired(batch_size=3) == 0
    store, v = memories.base, memories.rows.v
    assert len(await store.read(v.select())) == 0
    assert [m.key for m in await memories.alist("alice")] == ["stay"]
    with pytest.raises(ConfigError):
        await memories.asweep_expired(batch_size=0)
