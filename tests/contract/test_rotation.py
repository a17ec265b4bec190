"""Key rotation: every payload sealed again under the current key while writers run."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import tenxstore
from tenxstore import ConfigError, DecryptionError, KeyRing, StaleStateError
from tenxstore.langgraph import TenxCheckpointSaver
from tenxstore.rotation import arotate_keys, astale_rows
from tests.conftest import backend_for, cfg
from tests.contract.test_encryption import MARKER, chat, raw_cells, write_everything

OLD = KeyRing([("old", bytes(range(32)))])
NEW = KeyRing([("new", bytes(range(100, 132))), ("old", bytes(range(32)))])
ONLY_NEW = KeyRing([("new", bytes(range(100, 132)))])


def under(cells: dict[str, list[bytes]], mark: bytes) -> list[str]:
    return [table for table, found in cells.items() if any(mark in cell for cell in found)]


@pytest.mark.parametrize("name", ["sqlite", "postgresql"])
async def test_rotation_under_concurrent_writers_loses_nothing(name: str, tmp_path: Path) -> None:
    """Plaintext rows and rows under the old key are sealed again under the new one
    while writers commit states and messages to the same threads; afterwards the old
    key can go: a ring of the new key alone reads everything, every write is there."""
    async with backend_for(name, tmp_path) as backend:
        plain = await backend.make(enforce_user_isolation=False)
        await write_everything(plain, "plain")
        old = await backend.make(keys=OLD)
        threads = [f"w{i}" for i in range(4)]
        for thread in threads:
            await write_everything(old, thread)
        cp = await backend.make(keys=NEW, state_history_limit=5)
        rotating = asyncio.Event()
        rotated = asyncio.Event()
        during = [0]

        async def writer(thread: str) -> int:
            n = 0
            while not rotated.is_set() or n < 3:
                config = cfg(thread)
                await cp.aget_state(config)
                try:
                    await cp.aput_checkpoint(
                        config, {"note": MARKER, "n": n}, [{"id": f"x{n}", "content": MARKER}]
                    )
                except StaleStateError:  # another writer of the thread: read, go again
                    continue
                n += 1
                if rotating.is_set() and not rotated.is_set():
                    during[0] += 1
            return n

        async def rotate() -> Any:
            rotating.set()
            try:
                return await arotate_keys(cp, batch_size=3)
            finally:
                rotated.set()

        # two writers per thread, so some writes lose their compare-and-swap too
        *counts, result = await asyncio.gather(
            *(writer(t) for t in threads), *(writer(t) for t in threads), rotate()
        )
        assert result.done and result.key_id == "new" and result.passes >= 1
        assert sum(result.rotated.values()) > 0 and during[0] > 0
        # the old key removed: everything reads, nothing written was lost
        after = await backend.make(keys=ONLY_NEW)
        for i, thread in enumerate(threads):
            total = counts[i] + counts[i + len(threads)]
            state = await after.aget_state(cfg(thread))
            assert state is not None and state["n"] in (counts[i] - 1, counts[i + len(threads)] - 1)
            ids = {m["id"] for m in await after.aget_messages(cfg(thread))}
            assert {f"x{n}" for n in range(max(counts[i], counts[i + len(threads)]))} <= ids
            assert total >= 6
            info = await after.aget_thread(cfg(thread))
            assert info is not None and info.metadata == {"topic": MARKER}
            calls = await after.alist_tool_executions(cfg(thread))
            assert calls[0].result == {"hits": [MARKER]}
        assert (await after.aget_state(cfg("plain"))) == {"note": MARKER}
        saver = TenxCheckpointSaver(after).for_user("alice")
        for thread in ("plain", *threads):
            values = (await chat(saver).aget_state({"configurable": {"thread_id": thread}})).values
            assert values["messages"][-1].content == f"echo {MARKER}"
        cells = await raw_cells(backend, after)
        assert under(cells, MARKER.encode()) == []  # the plaintext rows too
        assert under(cells, b"!tx1:old:") == [] and under(cells, b"tx1\x03old") == []
        again = await arotate_keys(after)  # nothing left: a second run changes nothing
        assert again.done and sum(again.rotated.values()) == 0


async def test_rotation_refuses_what_it_cannot_open(tmp_path: Path) -> None:
    async with backend_for("sqlite", tmp_path) as backend:
        await (await backend.make(keys=OLD)).aput_state(cfg(), {"note": MARKER})
        with pytest.raises(DecryptionError, match="old"):
            await arotate_keys(await backend.make(keys=ONLY_NEW))
        with pytest.raises(ConfigError):
            await arotate_keys(await backend.make())
        with pytest.raises(ConfigError):
            await arotate_keys(await backend.make(keys=NEW), batch_size=0)
        result = await arotate_keys(await backend.make(keys=NEW))
        assert result.rotated["states"] == 1 and result.done
        assert await (await backend.make(keys=ONLY_NEW)).aget_state(cfg()) == {"note": MARKER}


def test_the_rotate_keys_command_seals_a_plaintext_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_cli import fill, invoke

    args = ["--url", f"sqlite:///{tmp_path / 'cli.db'}"]
    fill(args, threads=2, turns=2)  # in clear
    monkeypatch.delenv("TENXSTORE_KEYS", raising=False)
    refused = invoke("rotate-keys", *args)
    assert refused.exit_code == 1 and "TENXSTORE_KEYS" in refused.output
    key = KeyRing.generate_key()
    monkeypatch.setenv("TENXSTORE_KEYS", f"fresh:{key}")
    done = invoke("rotate-keys", *args, "--batch-size", "3")
    assert done.exit_code == 0, done.output
    assert "rotated to key fresh" in done.output and "old keys can be removed" in done.output
    again = invoke("rotate-keys", *args)
    assert again.exit_code == 0 and re.search(r"states\s*│\s*0", again.output)

    async def check() -> None:
        repo = tenxstore.CheckpointRepository(args[1])
        try:
            assert await astale_rows(repo) == 0
            state = await repo.aget_state({"thread_id": "thread-1", "user_id": "user-1"})
            assert state is not None and state["turn"] == 1
            async with repo.engine.connect() as conn:
                stored = (await conn.execute(text("SELECT state_data FROM states"))).scalars()
                assert all(s.startswith("!tx1:fresh:") for s in stored)
        finally:
            await repo.aclose()

    asyncio.run(check())


async def test_rotation_tells_key_ids_apart_by_case(tmp_path: Path) -> None:
    """A value sealed under key "KEY" is not under the current key "key": SQLite's LIKE
    ignores case, so the stale-row search compares the head exactly. A ring of ids
    equal but for case is refused outright (a database may compare without case)."""
    upper = KeyRing([("KEY", bytes(range(32)))])
    lower = KeyRing([("key", bytes(range(100, 132)))])
    with pytest.raises(ConfigError, match="only in case"):
        KeyRing([("key", bytes(range(100, 132))), ("KEY", bytes(range(32)))])
    async with backend_for("sqlite", tmp_path) as backend:
        await (await backend.make(keys=upper)).aput_checkpoint(
            cfg(), {"note": MARKER}, [{"id": "m1", "content": MARKER}]
        )
        cp = await backend.make(keys=lower)
        assert await astale_rows(cp) == 2  # the state and the message
        with pytest.raises(DecryptionError, match="'KEY'"):
            await arotate_keys(cp)  # it reads them, and cannot open them: not "done"
