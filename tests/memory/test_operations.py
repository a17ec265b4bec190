"""What a store owes its operators, for memories: erasing a user, retention, stats,
export/import/copy, sealed values, key rotation and the key counts."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import pytest

import tenxstore
from tenxstore import (
    ConfigError,
    DecryptionError,
    InMemoryCheckpointer,
    KeyRing,
    MemoryStore,
    archive,
)
from tenxstore.keyusage import akey_usage
from tenxstore.rotation import arotate_keys, astale_rows
from tests.conftest import SQL_BACKENDS, TEST_KEYS, Backend, backend_for, cfg
from tests.memory.conftest import Clock


async def _seed(store: MemoryStore) -> None:
    await store.astore("alice", "alice likes tea", key="tea", metadata={"n": 1})
    await store.aupdate("alice", "tea", content="alice likes green tea")
    await store.astore("alice", "alice in a namespace", namespace=("work", "x"))
    await store.astore("bob", "bob likes coffee", key="coffee")


async def test_delete_user_erases_memories_and_their_history(backend: Backend) -> None:
    cp = await backend.make()
    store = MemoryStore(cp)
    await _seed(store)
    await cp.aput_state(cfg("t-alice"), {"n": 1})
    planned = await cp.adelete_user("alice", dry_run=True)
    assert (planned.threads, planned.memories, planned.memory_versions) == (1, 2, 1)
    done = await cp.adelete_user("alice", batch_size=1)
    assert (done.threads, done.memories, done.memory_versions) == (1, 2, 1)
    assert done.rows == 1 + 1 + 2 + 1  # a thread, its state, two memories, a version
    assert await store.alist("alice", namespace=()) == []
    assert await store.ahistory("alice", "tea") == []
    assert [m.key for m in await store.alist("bob")] == ["coffee"]
    v = store.rows.v
    assert await store.base.read(v.select()) == []
    # the scopes' revision stamps named the user and its namespaces: gone with them
    r = store.rows.r
    assert {row.user_id for row in await store.base.read(r.select())} == {"bob"}


async def test_prune_leaves_memories_unless_asked(backend: Backend, clock: Clock) -> None:
    cp = await backend.make()
    store = MemoryStore(cp)
    await _seed(store)
    idle = timedelta(hours=1)
    clock.advance(idle.total_seconds() + 60)
    kept = await cp.aprune_idle(idle)
    assert kept.memories == 0 and len(await store.alist("alice", namespace=())) == 2
    fresh = await store.astore("alice", "written just now", key="fresh")
    planned = await cp.aprune_idle(idle, dry_run=True, include_memories=True)
    assert (planned.memories, planned.memory_versions) == (3, 1)
    pruned = await cp.aprune_idle(idle, include_memories=True)
    assert (pruned.memories, pruned.memory_versions) == (3, 1)
    assert await store.alist(None, namespace=(), auth_policy=_operator()) == [fresh]


def _operator() -> object:
    from tenxstore import AuthPolicy

    return AuthPolicy(enforce_user_isolation=False)


async def test_stats_count_memories(backend: Backend) -> None:
    cp = await backend.make()
    store = MemoryStore(cp)
    await _seed(store)
    await cp.aput_state(cfg("t", "alice"), {"n": 1})
    stats = await cp.astats(top=5, exact=True)
    assert (stats.memories, stats.memory_users, stats.expired_memories) == (3, 2, 0)
    assert [(u.user_id, u.memories) for u in stats.top_users] == [("alice", 2)]
    names = {t.name: t.rows for t in stats.tables}
    assert names["memories"] == 3 and names["memory_versions"] == 1


async def test_export_and_import_carry_memories(backend: Backend, tmp_path: Path) -> None:
    cp = await backend.make()
    store = MemoryStore(cp)
    await _seed(store)
    path = tmp_path / "alice.jsonl"
    assert await archive.export_threads(cp, path, user_id="alice") == 2  # no thread of hers
    async with InMemoryCheckpointer() as target:
        await target.asetup()
        counted = await archive.import_file(target, path)
        assert counted == {"memories created": 2}
        again = await archive.import_file(target, path)
        assert again == {"memories unchanged": 2}
        copy = MemoryStore(target)
        assert await copy.ahistory("alice", "tea") == await store.ahistory("alice", "tea")
        assert await copy.alist("bob") == []
        assert [h.memory.key for h in await copy.asearch("alice", "green")] == ["tea"]
        await store.aupdate("alice", "tea", content="changed at the source")
        await archive.export_threads(cp, path, user_id="alice")
        with pytest.raises(tenxstore_import_conflict()):
            await archive.import_file(target, path)
        replaced = await archive.import_file(target, path, on_conflict="replace")
        assert replaced == {"memories replaced": 1, "memories unchanged": 1}


def tenxstore_import_conflict() -> type[Exception]:
    from tenxstore import ImportConflict

    return ImportConflict


async def test_a_sealed_export_keeps_memories_sealed(backend: Backend, tmp_path: Path) -> None:
    cp = await backend.make(keys=TEST_KEYS)
    store = MemoryStore(cp)
    await _seed(store)
    out = io.StringIO()
    await archive.write_exports(cp, out, sealed=True)
    assert "likes" not in out.getvalue()
    assert out.getvalue().count('"sealed"') == 3
    path = tmp_path / "sealed.jsonl"
    path.write_text(out.getvalue())
    async with InMemoryCheckpointer(keys=TEST_KEYS) as target:
        await target.asetup()
        assert await archive.import_file(target, path) == {"memories created": 3}
        found = await MemoryStore(target).aget("bob", "coffee")
        assert found is not None and found.content == "bob likes coffee"
    moved = out.getvalue().replace('"coffee"]', '"tea"]')  # bound to its memory
    path.write_text(moved)
    async with InMemoryCheckpointer(keys=TEST_KEYS) as target:
        await target.asetup()
        with pytest.raises(DecryptionError):
            await archive.import_file(target, path)


async def test_copy_carries_memories(backend: Backend) -> None:
    cp = await backend.make()
    await _seed(MemoryStore(cp))
    async with InMemoryCheckpointer() as target:
        await target.asetup()
        assert await archive.copy_memories(cp, target) == {"created": 3}
        assert await archive.copy_memories(cp, target) == {"unchanged": 3}
        assert len(await MemoryStore(target).alist(None, auth_policy=_operator())) == 2


async def test_values_are_sealed_and_the_index_is_not(backend: Backend) -> None:
    store = MemoryStore(await backend.make(keys=TEST_KEYS))
    await _seed(store)
    for table in (store.rows.m, store.rows.v):
        for row in await store.base.read(table.select()):
            assert row.content.startswith("!tx2:") and row.metadata.startswith("!tx2:")
    terms = [row.terms for row in await store.base.read(store.rows.m.select())]
    assert any(t is not None and "tea" in t for t in terms)  # the index leaks words
    usage = await akey_usage(store.repository)
    assert usage.plaintext == 0 and sum(usage.by_key.values()) == 8
    assert usage.unopened == {key: 0 for key in usage.by_key}


@pytest.mark.parametrize("name", SQL_BACKENDS)
async def test_rotation_seals_memories_again(name: str, tmp_path: Path) -> None:
    old = KeyRing([("old", bytes(range(32)))])
    both = KeyRing([("old", bytes(range(32))), ("new", bytes(range(100, 132)))], sealing="new")
    only_new = KeyRing([("new", bytes(range(100, 132)))])
    async with backend_for(name, tmp_path) as backend:
        await _seed(MemoryStore(await backend.make(keys=old)))
        rotating = await backend.make(keys=both)
        assert await astale_rows(rotating) == 4  # rows: three memories, one past version
        result = await arotate_keys(rotating, batch_size=2)
        assert result.done and result.rotated["memories"] == 3
        assert result.rotated["memory_versions"] == 1
        after = MemoryStore(await backend.make(keys=only_new))
        assert [m.content for m in await after.ahistory("alice", "tea")] == [
            "alice likes green tea",
            "alice likes tea",
        ]


async def test_a_keyless_writer_is_refused_on_a_sealed_store(sql_backend: Backend) -> None:
    await _seed(MemoryStore(await sql_backend.make(keys=TEST_KEYS)))
    keyless = MemoryStore(
        tenxstore.CheckpointRepository(
            sql_backend.url or "", schema=sql_backend.schema, **sql_backend.options
        )
    )
    sql_backend.made.append(keyless.repository)
    with pytest.raises(ConfigError, match="TENXSTORE_KEYS"):
        await keyless.astore("alice", "in clear")
    assert await keyless.adelete("bob", "coffee") is True  # a delete stores nothing
