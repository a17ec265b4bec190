"""Key rotation: every payload sealed again under the current key while writers run."""

from __future__ import annotations

import asyncio
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import tenxstore
from tenxstore import ConfigError, DecryptionError, KeyRing, StaleStateError
from tenxstore.keyusage import akey_usage
from tenxstore.langgraph import TenxCheckpointSaver
from tenxstore.rotation import MAX_PASSES, arotate_keys, astale_rows
from tests.conftest import SQL_BACKENDS, backend_for, cfg
from tests.contract.test_encryption import MARKER, chat, raw_cells, write_everything

OLD = KeyRing([("old", bytes(range(32)))])
NEW = KeyRing([("new", bytes(range(100, 132))), ("old", bytes(range(32)))])
ONLY_NEW = KeyRing([("new", bytes(range(100, 132)))])
# The documented procedure's rings: step 1 adds "new" to every ring, opening only;
# step 2 makes it the sealing key everywhere.
STEP_1 = KeyRing([("old", bytes(range(32))), ("new", bytes(range(100, 132)))])
STEP_2 = KeyRing([("old", bytes(range(32))), ("new", bytes(range(100, 132)))], sealing="new")


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
        for version in (b"tx1", b"tx2"):  # nothing under old, in either format
            assert under(cells, b"!" + version + b":old:") == []
            assert under(cells, version + b"\x03old") == []
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
    assert "rotated to key fresh" in done.output and "0 rows not under fresh" in done.output
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
                assert all(s.startswith("!tx2:fresh:") for s in stored)
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


@pytest.mark.parametrize("name", SQL_BACKENDS)
async def test_rotation_is_not_done_while_an_instance_still_seals_under_the_old_key(
    name: str, tmp_path: Path
) -> None:
    """A rolling deploy caught between steps 2 and 3: one instance still seals under
    "old" while the rotation runs under "new". Its writes land between the rotation's
    batches (its progress hook writes them: no sleep, no luck), in tables a pass has
    walked already. The rotation must not say "done" while any row is under "old";
    once that instance seals under "new" too, the rotation run again is done, and a
    ring without "old" reads every row."""
    async with backend_for(name, tmp_path) as backend:
        lagging = await backend.make(keys=STEP_1)  # not yet at step 2
        for thread in ("a", "b"):
            await write_everything(lagging, thread)
        updated = await backend.make(keys=STEP_2)
        # step 1 first: an instance not yet at step 2 reads what updated ones seal
        await updated.aput_state(cfg("fresh"), {"note": MARKER})
        assert await lagging.aget_state(cfg("fresh")) == {"note": MARKER}
        written: list[int] = []

        async def lagging_write(table: str, so_far: int) -> None:
            n = len(written)
            written.append(n)
            config = cfg(f"lag-{n % 3}")
            await lagging.aget_state(config)
            await lagging.aput_checkpoint(config, {"n": n}, [{"id": f"m{n}", "content": MARKER}])

        counts: list[int] = []
        # each batch of 4 rows brings 2 more under "old": the rows grow by half a pass
        result = await arotate_keys(
            updated, batch_size=4, progress=lagging_write, counted=counts.append
        )
        left = await astale_rows(updated)
        assert left > 0 and result.remaining == left  # the final count is the truth
        assert not result.done and result.passes == MAX_PASSES
        assert len(counts) == MAX_PASSES + 1 and all(counts)
        assert (await akey_usage(updated)).by_key["old"] > 0
        # the lagging instance is updated (step 2 done everywhere); rotate again
        again = await arotate_keys(updated, batch_size=2)
        assert again.done and again.remaining == 0 and again.passes == 1
        assert await astale_rows(updated) == 0
        assert (await akey_usage(updated)).by_key["old"] == 0
        after = await backend.make(keys=ONLY_NEW)  # step 5: "old" removed
        for n in range(len(written)):
            ids = {m["id"] for m in await after.aget_messages(cfg(f"lag-{n % 3}"))}
            assert f"m{n}" in ids
        for thread in range(3):
            state = await after.aget_state(cfg(f"lag-{thread}"))
            assert state is not None and state["n"] % 3 == thread
        assert (await after.aget_state(cfg("a"))) == {"note": MARKER}
        cells = await raw_cells(backend, after)
        for version in (b"tx1", b"tx2"):  # nothing under old, in either format
            assert under(cells, b"!" + version + b":old:") == []
            assert under(cells, version + b"\x03old") == []


def test_the_rotate_keys_command_never_says_done_nor_overruns_its_total(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While an instance still seals under the old key, rotate-keys exits 1 and never
    says the old key can go; its progress bar's count never passes its total (it
    reached 2,280/1,493: the total was counted once, before rows written meanwhile)."""
    from tenxstore.cli import ops as cli_ops
    from tests.test_cli import fill, invoke

    url = f"sqlite:///{tmp_path / 'rolling.db'}"
    keys = {k: KeyRing.generate_key() for k in ("old", "new")}
    monkeypatch.setenv("TENXSTORE_KEYS", f"old:{keys['old']},new:{keys['new']}")
    fill(["--url", url], threads=3, turns=3)  # sealed under "old", the first key
    rotate = cli_ops.arotate_keys

    async def with_a_lagging_instance(repo: Any, **options: Any) -> Any:
        lagging = tenxstore.CheckpointRepository(
            url, keys=KeyRing.from_env({"TENXSTORE_KEYS": f"old:{keys['old']},new:{keys['new']}"})
        )
        shown = options["progress"]

        async def progress(table: str, so_far: int) -> None:
            shown(table, so_far)
            config = {"thread_id": f"lag-{so_far}", "user_id": "u"}
            await lagging.aput_checkpoint(config, {"n": so_far}, [{"content": MARKER}])

        try:
            return await rotate(repo, **{**options, "progress": progress})
        finally:
            await lagging.aclose()

    monkeypatch.setattr(cli_ops, "arotate_keys", with_a_lagging_instance)
    monkeypatch.setenv("TENXSTORE_SEALING_KEY", "new")
    stopped = invoke("rotate-keys", "--url", url, "--batch-size", "2")
    assert stopped.exit_code == 1, stopped.output
    assert "still not under key new" in stopped.output and "can be removed" not in stopped.output
    shown = [(int(a), b) for a, b in re.findall(r"(\d+)/(\d+|\?)", stopped.output)]
    assert shown and all(b == "?" or a <= int(b) for a, b in shown), stopped.output
    monkeypatch.setattr(cli_ops, "arotate_keys", rotate)  # every instance seals under new
    done = invoke("rotate-keys", "--url", url, "--batch-size", "2")
    assert done.exit_code == 0, done.output
    assert "0 rows not under new" in done.output and "(old) can be removed" in done.output
    shown = [(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+)", done.output)]
    assert shown and all(a <= b for a, b in shown), done.output


def test_a_ring_seals_under_the_key_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """sealing= (or TENXSTORE_SEALING_KEY) names the key that seals, the first by
    default; a sealing key the ring lacks, or spelled in another case, is refused at
    construction; the choice survives pickling; no key is ever shown."""
    a, b = KeyRing.generate_key(), KeyRing.generate_key()
    assert KeyRing([("k1", a), ("k2", b)]).current == "k1"  # as before: the first
    ring = KeyRing([("k1", a), ("k2", b)], sealing="k2")
    assert ring.current == "k2" and ring.key_ids == ("k2", "k1")
    assert ring.seal("{}", "t", "states.state_data").startswith("!tx2:k2:")
    assert KeyRing([("k1", a), ("k2", b)]).open(ring.seal("{}", "t", "c"), "t", "c") == "{}"
    clone = pickle.loads(pickle.dumps(ring))
    assert clone.current == "k2" and repr(clone) == repr(ring) and a not in repr(ring)
    for wrong, says in (("K2", "differs from it in case"), ("k3", "'k3'"), (b, "not shown")):
        with pytest.raises(ConfigError, match=says) as err:
            KeyRing([("k1", a), ("k2", b)], sealing=wrong)
        assert a not in str(err.value) and b not in str(err.value)
    env = {"TENXSTORE_KEYS": f"k1:{a},k2:{b}", "TENXSTORE_SEALING_KEY": "k2"}
    from_env = KeyRing.from_env(env)
    assert from_env is not None and from_env.current == "k2"
    with pytest.raises(ConfigError, match="TENXSTORE_SEALING_KEY"):
        KeyRing.from_env({**env, "TENXSTORE_SEALING_KEY": "k9"})
    with pytest.raises(ConfigError, match="TENXSTORE_KEYS gives no key"):
        KeyRing.from_env({"TENXSTORE_SEALING_KEY": "k2"})
    monkeypatch.setenv("TENXSTORE_KEYS", f"k1:{a},k2:{b}")
    monkeypatch.setenv("TENXSTORE_SEALING_KEY", "k2")
    repo = tenxstore.CheckpointRepository("sqlite+aiosqlite:///:memory:")
    assert repo.keys is not None and repo.keys.current == "k2"
