"""The operator's commands on memories: ``memories``, ``delete-user``, ``prune
--include-memories``, ``export --user``/``import``, ``stats`` and ``doctor``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tenxstore import AuthPolicy, MemoryStore
from tests.memory.conftest import Clock
from tests.test_cli import db, invoke, repo_for
from tests.test_cli_lifecycle import row

__all__ = ["db"]


def seed(args: list[str], clock: Clock) -> None:
    async def go() -> None:
        async with MemoryStore(repo_for(args)) as store:
            await store.asetup()
            await store.astore("alice", "Prefers window seats", key="seat")
            await store.aupdate("alice", "seat", content="Prefers aisle seats")
            await store.astore("alice", "A note at work", key="note", namespace=("work",))
            await store.astore("bob", "Bob's code is QX-7731", key="code")
            await store.astore("bob", "gone soon", key="tmp", ttl=60)
            await store.repository.aput_state({"thread_id": "t", "user_id": "alice"}, {"n": 1})
            await store.repository.aclose()

    asyncio.run(go())
    clock.advance(61)  # bob's tmp expires


def keys(args: list[str]) -> list[tuple[str, str]]:
    async def go() -> list[tuple[str, str]]:
        async with MemoryStore(repo_for(args)) as store:
            found = await store.alist(None, namespace=(), auth_policy=AuthPolicy(False))
            await store.repository.aclose()
            return sorted((str(m.user_id), m.key) for m in found)

    return asyncio.run(go())


def test_memories_commands(db: list[str], clock: Clock) -> None:
    seed(db, clock)
    listed = invoke("memories", "list", *db)
    assert listed.exit_code == 0, listed.output
    assert "seat" in listed.output and "code" in listed.output and "tmp" not in listed.output
    mine = invoke("memories", "list", "--user", "bob", *db)
    assert "code" in mine.output and "seat" not in mine.output
    found = invoke("memories", "search", "QX-7731", *db)
    assert found.exit_code == 0 and "code" in found.output and "1.000" in found.output
    shown = invoke("memories", "show", "seat", "--user", "alice", *db)
    assert shown.exit_code == 0, shown.output
    assert "Prefers aisle seats" in shown.output and "Prefers window seats" in shown.output
    absent = invoke("memories", "show", "seat", "--user", "bob", *db)
    assert absent.exit_code == 1 and "no memory 'seat' of user 'bob'" in absent.output
    doctor = invoke("doctor", *db)
    assert "memories  4, 1 expired waiting for `tenxstore memories sweep`" in doctor.output
    swept = invoke("memories", "sweep", *db)
    assert "swept 1 expired memory" in swept.output
    stats = invoke("stats", *db)
    assert "memories  3 of 2 user(s)" in stats.output


def test_delete_user_and_prune_and_export(db: list[str], tmp_path: Path, clock: Clock) -> None:
    seed(db, clock)
    dump = tmp_path / "alice.jsonl"
    exported = invoke("export", "--user", "alice", "-o", str(dump), *db)
    assert exported.exit_code == 0 and "exported 3 line(s)" in exported.output  # t, 2 memories
    kept = invoke("prune", "--idle-for", "1h", "--dry-run", *db)
    assert kept.exit_code == 0 and "memor" not in kept.output
    erased = invoke("delete-user", "alice", "--yes", *db)
    assert erased.exit_code == 0, erased.output
    assert row(erased.output, "memories") == 2 and row(erased.output, "memory versions") == 1
    assert keys(db) == [("bob", "code")]  # (and bob's expired tmp, not shown)
    imported = invoke("import", str(dump), *db)
    assert imported.exit_code == 0 and "2 memories created" in imported.output
    assert keys(db) == [("alice", "note"), ("alice", "seat"), ("bob", "code")]
    clock.advance(2)
    pruned = invoke("prune", "--idle-for", "1s", "--include-memories", "--yes", *db)
    assert pruned.exit_code == 0, pruned.output
    assert row(pruned.output, "memories") == 4  # imported ones keep their times; tmp too
    assert keys(db) == []
