"""A store that holds sealed values says so, and a checkpointer without a key ring
refuses to write to it (it would store plaintext beside the sealed values)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from sqlalchemy import text

import tenxstore
from tenxstore import ConfigError, DecryptionError, KeyRing
from tenxstore.keyusage import aclear_sealed, akey_usage, amark_sealed
from tenxstore.langgraph import TenxCheckpointSaver
from tests.conftest import CACHED_BACKENDS, SQL_BACKENDS, backend_for, cfg
from tests.contract.test_encryption import MARKER, chat

RING = KeyRing([("k1", bytes(range(32)))])
SHARED = SQL_BACKENDS + CACHED_BACKENDS  # stores that two instances can share


@pytest.fixture(autouse=True)
def _no_ring_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpointer made with keys=None reads TENXSTORE_KEYS: none here."""
    for name in ("TENXSTORE_KEYS", "TENXSTORE_SEALING_KEY", "TENXSTORE_REQUIRE_SEALED"):
        monkeypatch.delenv(name, raising=False)


async def _keyless_writes(cp: Any, export: Any) -> list[Any]:
    """Every kind of write a checkpointer makes that stores a payload."""
    saver = TenxCheckpointSaver(cp).for_user("alice")
    writes = [
        cp.aimport_thread(export, on_conflict="replace"),
        cp.aput_state(cfg("new"), {"note": MARKER}),
        cp.aput_checkpoint(cfg("t1"), {"note": MARKER}, [{"id": "x", "content": MARKER}]),
        cp.aput_thread(cfg("t1"), name=MARKER),
        cp.abegin_tool_execution(cfg("t1"), "c9", "search", {"q": MARKER}),
        chat(saver).ainvoke(
            {"messages": [HumanMessage(MARKER, id="h9")]}, {"configurable": {"thread_id": "lg"}}
        ),
    ]
    if hasattr(cp, "inner"):  # a cache-only write is plaintext in Redis
        writes.append(cp.aput_state_cache(cfg("t1"), {"note": MARKER}, 1))
    return writes


@pytest.mark.parametrize("name", SHARED)
async def test_a_checkpointer_without_keys_refuses_to_write_to_a_sealed_store(
    name: str, tmp_path: Path
) -> None:
    """The first write of an instance with a key ring marks the store (reads do not);
    an instance without one, started after that, refuses every write that would store
    a payload (ConfigError naming TENXSTORE_KEYS, nothing written), says so in its
    health check, and still reads what is in clear and deletes."""
    async with backend_for(name, tmp_path) as backend:
        before = await backend.make(keys=None)
        await before.aput_state(cfg("clear"), {"note": "before encryption"})
        sealing = await backend.make(keys=RING)
        assert await sealing.aget_state(cfg("clear")) == {"note": "before encryption"}
        assert (await sealing.acheck()).sealed_since is None  # a read marks nothing
        await sealing.aput_checkpoint(cfg("t1"), {"note": MARKER}, [{"id": "m", "content": "m"}])
        health = await sealing.acheck()
        assert health.sealed_since is not None and health.ok, health.problems
        counted = await akey_usage(sealing)
        export = await sealing.aexport_thread(cfg("t1"))  # opened: plaintext in memory
        keyless = await backend.make(keys=None)  # a worker started without TENXSTORE_KEYS
        for write in await _keyless_writes(keyless, export):
            with pytest.raises(ConfigError, match="TENXSTORE_KEYS"):
                await write
        after = await akey_usage(sealing)
        assert (after.plaintext, after.sealed) == (counted.plaintext, counted.sealed)
        assert dict(after.plaintext_since_sealed) == {}
        health = await keyless.acheck()
        assert not health.ok and "TENXSTORE_KEYS" in " ".join(health.problems)
        assert await keyless.aget_state(cfg("clear")) == {"note": "before encryption"}
        with pytest.raises(DecryptionError):
            await keyless.aget_state(cfg("t1"))
        assert await keyless.aclean_thread(cfg("clear"))  # a delete stores nothing
        assert await sealing.aget_state(cfg("clear")) is None


@pytest.mark.parametrize("name", SQL_BACKENDS)
async def test_an_operator_marks_a_store_sealed_and_takes_it_back(
    name: str, tmp_path: Path
) -> None:
    """amark_sealed (tenxstore mark-sealed) needs no key and stops keyless writers
    before any keyed one has written; aclear_sealed refuses while a value is sealed."""
    async with backend_for(name, tmp_path) as backend:
        operator = await backend.make(keys=None)
        await operator.aput_state(cfg("clear"), {"note": "in clear"})
        since = await amark_sealed(operator)
        assert await amark_sealed(operator) == since  # kept
        worker = await backend.make(keys=None)
        with pytest.raises(ConfigError, match="TENXSTORE_KEYS"):
            await worker.aput_state(cfg("clear"), {"note": "more"})
        usage = await akey_usage(worker)
        assert usage.sealed_since == since and dict(usage.plaintext_by_table) == {"states": 1}
        await (await backend.make(keys=RING)).aput_state(cfg("sealed"), {"note": MARKER})
        with pytest.raises(ConfigError, match="1 value"):
            await aclear_sealed(worker)
        assert (await worker.acheck()).sealed_since == since  # nothing changed
        await worker.aclean_thread(cfg("sealed"))
        await aclear_sealed(worker)
        assert (await worker.acheck()).sealed_since is None
        fresh = await backend.make(keys=None)
        assert await fresh.aput_state(cfg("clear"), {"note": "more"}) == 2


async def test_plaintext_written_after_the_mark_is_found(tmp_path: Path) -> None:
    """A keyless process that first used the store before it was marked goes on
    writing (it read the mark at its first use): akey_usage counts the values in clear
    in rows made after the mark, by table, and doctor fails on them even with keys."""
    async with backend_for("sqlite", tmp_path) as backend:
        stale = await backend.make(keys=None)
        await stale.aput_state(cfg("old"), {"note": "before"})
        await (await backend.make(keys=RING)).aput_state(cfg("t1"), {"note": MARKER})
        await stale.aput_checkpoint(cfg("t2"), {"note": "late"}, [{"content": "late"}])
        usage = await akey_usage(await backend.make(keys=RING))
        assert dict(usage.plaintext_since_sealed) == {"states": 1, "messages": 1}
        assert usage.plaintext == 3


def test_doctor_without_keys_on_a_sealed_store_fails_and_names_the_plaintext_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """doctor said "healthy" on an encrypted store to an instance without a key ring
    when the rows it could see were in clear; now it exits 1, naming the plaintext by
    table. With the ring it is healthy, and says since when the store is sealed."""
    from tests.test_cli import fill, invoke

    args = ["--url", f"sqlite:///{tmp_path / 'doctor.db'}"]
    fill(args, threads=2, turns=2)  # in clear
    assert "healthy" in invoke("doctor", *args).output
    marked = invoke("mark-sealed", *args)
    assert marked.exit_code == 0 and "writes without TENXSTORE_KEYS are refused" in marked.output
    keyless = invoke("doctor", *args)
    assert keyless.exit_code == 1 and "healthy" not in keyless.output, keyless.output
    assert "TENXSTORE_KEYS" in keyless.output
    for table in ("threads", "states", "messages", "tool_executions"):
        assert f"{table} " in keyless.output.split("in clear in a store")[1], keyless.output
    refused = invoke("delete-user", "user-0", "--yes", *args)  # a delete: no key needed
    assert refused.exit_code == 0, refused.output
    monkeypatch.setenv("TENXSTORE_KEYS", f"k1:{KeyRing.generate_key()}")
    keyed = invoke("doctor", *args)
    assert keyed.exit_code == 0 and "healthy" in keyed.output, keyed.output
    assert "sealed    since" in keyed.output and "rotate-keys" in keyed.output
    cleared = invoke("mark-sealed", "--clear", *args)
    assert cleared.exit_code == 0, cleared.output
    monkeypatch.delenv("TENXSTORE_KEYS")
    assert invoke("doctor", *args).exit_code == 0


async def test_a_copy_of_a_sealed_store_is_sealed(tmp_path: Path) -> None:
    """The mark lives in the store's own row: a copy of the database (a file copied,
    a dump restored) holds the sealed values and the mark, so a keyless instance on
    the copy refuses to write too; the copy is another store all the same (its id)."""
    async with backend_for("sqlite", tmp_path) as backend:
        cp = await backend.make(keys=RING)
        await cp.aput_state(cfg(), {"note": MARKER})
        original = await cp.astore_id()
        assert backend.url is not None
        source = sqlite3.connect(backend.url.removeprefix("sqlite:///"))
        try:  # a consistent copy of the file, what is in its WAL included
            source.execute(f"VACUUM INTO '{tmp_path / 'copy.db'}'")
        finally:
            source.close()
        copy = tenxstore.CheckpointRepository(f"sqlite:///{tmp_path / 'copy.db'}")
        try:
            assert await copy.astore_id() != original
            with pytest.raises(ConfigError, match="TENXSTORE_KEYS"):
                await copy.aput_state(cfg("x"), {"note": "clear"})
            async with copy.engine.connect() as conn:
                rows = (await conn.execute(text("SELECT count(*) FROM states"))).scalar()
            assert rows == 1
        finally:
            await copy.aclose()


def test_rotate_keys_marks_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rotate-keys is an operator saying the store is sealed, even when nothing was
    left to seal again."""
    from tests.test_cli import invoke

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert invoke("upgrade", "--url", url).exit_code == 0
    monkeypatch.setenv("TENXSTORE_KEYS", f"k1:{KeyRing.generate_key()}")
    assert invoke("rotate-keys", "--url", url).exit_code == 0

    async def check() -> None:
        monkeypatch.delenv("TENXSTORE_KEYS")
        async with tenxstore.CheckpointRepository(url) as repo:
            assert (await repo.acheck()).sealed_since is not None
            with pytest.raises(ConfigError, match="TENXSTORE_KEYS"):
                await repo.aput_state(cfg(), {"n": 1})

    asyncio.run(check())
