"""What the values are sealed under: counted exactly, missing keys named, each key of
the ring tried on a few of its values (``tenxstore doctor``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tenxstore
from tenxstore import KeyRing
from tenxstore.keyusage import akey_usage
from tenxstore.rotation import arotate_keys, astale_rows
from tests.conftest import backend_for, cfg
from tests.contract.test_encryption import MARKER, tamper, write_everything

A, B, C = (bytes(range(n, n + 32)) for n in (0, 100, 200))
OLD = KeyRing([("old", A)])
NEW = KeyRing([("new", B), ("old", A)])
ONLY_NEW = KeyRing([("new", B)])

DATABASES = ["sqlite", "postgresql", "mariadb"]


@pytest.mark.parametrize("name", DATABASES)
async def test_every_value_is_counted_by_what_it_is_sealed_under(name: str, tmp_path: Path) -> None:
    """Values in clear, under each key of the ring, under a key it lacks (named, and
    counted per key); after a rotation, every one under the current key."""
    async with backend_for(name, tmp_path) as backend:
        await write_everything(await backend.make(), "plain")
        clear = await akey_usage(await backend.make())
        assert clear.plaintext > 10 and clear.sealed == 0 and dict(clear.by_key) == {}
        await write_everything(await backend.make(keys=OLD), "sealed")
        usage = await akey_usage(await backend.make(keys=NEW))
        assert usage.plaintext == clear.plaintext and usage.by_key["new"] == 0
        sealed = usage.by_key["old"]
        assert sealed > 10 and usage.unreadable == 0 and dict(usage.unknown) == {}
        assert usage.tried["old"] > 0 and dict(usage.unopened) == {"new": 0, "old": 0}
        # rows, each with one value or more of them
        assert 0 < await astale_rows(await backend.make(keys=NEW)) <= clear.plaintext + sealed
        for ring in (ONLY_NEW, None):
            lacking = await akey_usage(await backend.make(keys=ring))
            assert dict(lacking.unknown) == {"old": sealed} and lacking.unnamed == 0
            assert lacking.plaintext == clear.plaintext
        assert (await arotate_keys(await backend.make(keys=NEW))).done
        after = await akey_usage(await backend.make(keys=ONLY_NEW))
        assert dict(after.by_key) == {"new": clear.plaintext + sealed}
        assert (after.plaintext, after.unreadable, after.unopened["new"]) == (0, 0, 0)
        with pytest.raises(TypeError):
            after.by_key["new"] = 0  # type: ignore[index]  # a frozen value, all through


@pytest.mark.parametrize("name", DATABASES)
async def test_key_ids_are_told_apart_exactly(name: str, tmp_path: Path) -> None:
    """ "k1" begins "k10", and "K1" is "k1" ignoring case (SQLite's LIKE, a case-blind
    collation): each value is counted under its own key, every missing key is named."""
    rings = {kid: KeyRing([(kid, key)]) for kid, key in (("k1", A), ("k10", B), ("K1", C))}
    async with backend_for(name, tmp_path) as backend:
        for kid, ring in rings.items():
            await (await backend.make(keys=ring)).aput_state(cfg(kid), {"note": MARKER})
        usage = await akey_usage(await backend.make(keys=KeyRing([("k1", A), ("k10", B)])))
        assert dict(usage.by_key) == {"k1": 1, "k10": 1}
        assert dict(usage.unknown) == {"K1": 1}
        assert dict(usage.unopened) == {"k1": 0, "k10": 0}
        none = await akey_usage(await backend.make(keys=None))
        assert dict(none.unknown) == {"K1": 1, "k1": 1, "k10": 1}


async def test_a_key_of_the_right_id_and_the_wrong_bytes_opens_nothing(tmp_path: Path) -> None:
    """The header names the key by id only: a ring with another key under that id (a
    staging key, one generated again) is found by opening values, and so are values
    damaged (a damaged envelope that names no key is counted apart)."""
    async with backend_for("sqlite", tmp_path) as backend:
        sealer = await backend.make(keys=KeyRing([("k1", A)]))
        for thread in ("a", "b", "c"):
            await sealer.aput_state(cfg(thread), {"note": MARKER})
        wrong = await akey_usage(await backend.make(keys=KeyRing([("k1", B)])))
        assert wrong.by_key["k1"] == 3 and wrong.unopened["k1"] == wrong.tried["k1"] == 3
        await tamper(
            sealer,
            "UPDATE states SET state_data = substr(state_data, 1, 40) || "
            "CASE substr(state_data, 41, 1) WHEN 'A' THEN 'B' ELSE 'A' END || "
            "substr(state_data, 42) WHERE thread_id = 'a'",
        )
        await tamper(sealer, "UPDATE states SET state_data = '!tx1:' WHERE thread_id = 'b'")
        right = await akey_usage(sealer)
        assert (right.by_key["k1"], right.unnamed, right.unreadable) == (2, 1, 1)
        assert (right.tried["k1"], right.unopened["k1"]) == (2, 1)


def test_doctor_says_what_values_are_sealed_under(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values no key of TENXSTORE_KEYS opens (no ring at all, or a ring without their
    key, or with another key under their key's id), and plaintext under a strict ring,
    are problems; values a rotation would seal again are said, and are not; what is
    printed never repeats a stored value."""
    from tests.test_cli import fill, invoke

    args = ["--url", f"sqlite:///{tmp_path / 'doctor.db'}"]
    old, new = KeyRing.generate_key(), KeyRing.generate_key()
    monkeypatch.delenv("TENXSTORE_KEYS", raising=False)
    fill(args, threads=1, turns=2)  # in clear
    clear = invoke("doctor", *args)
    assert clear.exit_code == 0 and "in clear" in clear.output, clear.output
    monkeypatch.setenv("TENXSTORE_KEYS", f"old:{old}")
    fill(args, threads=2, turns=2)  # thread-1 sealed under "old" (thread-0 written again)
    monkeypatch.setenv("TENXSTORE_KEYS", f"new:{new},old:{old}")
    mixed = invoke("doctor", *args)
    assert mixed.exit_code == 0 and "healthy" in mixed.output, mixed.output
    assert "not under new" in mixed.output and "rotate-keys" in mixed.output
    for env in ({"TENXSTORE_KEYS": f"new:{new}"}, {}):
        monkeypatch.delenv("TENXSTORE_KEYS")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        lacking = invoke("doctor", *args)
        assert lacking.exit_code == 1 and "'old'" in lacking.output, lacking.output
        assert "DecryptionError" in lacking.output
    monkeypatch.setenv("TENXSTORE_KEYS", f"new:{new},old:{KeyRing.generate_key()}")
    impostor = invoke("doctor", *args)
    assert impostor.exit_code == 1 and "not the key that sealed them" in impostor.output
    monkeypatch.setenv("TENXSTORE_KEYS", f"new:{new},old:{old}")
    monkeypatch.setenv("TENXSTORE_REQUIRE_SEALED", "1")
    strict = invoke("doctor", *args)
    assert strict.exit_code == 1 and "requires sealed values" in strict.output, strict.output
    monkeypatch.delenv("TENXSTORE_REQUIRE_SEALED")
    assert invoke("rotate-keys", *args).exit_code == 0
    monkeypatch.setenv("TENXSTORE_KEYS", f"new:{new}")
    monkeypatch.setenv("TENXSTORE_REQUIRE_SEALED", "1")
    done = invoke("doctor", *args)
    assert done.exit_code == 0 and "healthy" in done.output, done.output
    assert "0 in clear" in done.output and "not under" not in done.output

    async def damage() -> None:  # a stored text where a key id should be, and markup
        repo = tenxstore.CheckpointRepository(args[1])
        try:
            await tamper(
                repo,
                "UPDATE states SET state_data = '!tx1:password=hunter2 [/]\\:x' "
                "WHERE thread_id = 'thread-0'",
            )
        finally:
            await repo.aclose()

    asyncio.run(damage())
    damaged = invoke("doctor", *args)
    assert damaged.exit_code == 1 and "name no key" in damaged.output, damaged.output
    assert "hunter2" not in damaged.output


async def test_past_max_named_missing_keys_are_counted_unnamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values under more keys than the ring lacks and :data:`MAX_NAMED` names: the first
    ones (by id) are named with their counts, the rest counted ``unnamed``; nothing is
    lost from the total, and doctor says why."""
    from tenxstore.keyusage import MAX_NAMED
    from tests.test_cli import invoke

    path = tmp_path / "many.db"
    ids = [f"k{n:02d}" for n in range(MAX_NAMED + 2)]
    for n, kid in enumerate(ids):
        cp = tenxstore.CheckpointRepository(
            f"sqlite+aiosqlite:///{path}", keys=KeyRing([(kid, bytes([n]) * 32)])
        )
        try:
            await cp.asetup()
            await cp.aput_state({"thread_id": f"t-{kid}", "user_id": "u"}, {"n": n})
        finally:
            await cp.aclose()
    cp = tenxstore.CheckpointRepository(f"sqlite+aiosqlite:///{path}", keys=ONLY_NEW)
    try:
        usage = await akey_usage(cp)
    finally:
        await cp.aclose()
    each = usage.unknown[ids[0]]  # a thread's values: its state, its row's metadata...
    assert list(usage.unknown) == ids[:MAX_NAMED] and set(usage.unknown.values()) == {each}
    assert usage.unnamed == 2 * each and usage.unreadable == usage.sealed == len(ids) * each
    assert dict(usage.by_key) == {"new": 0} and usage.plaintext == 0
    monkeypatch.delenv("TENXSTORE_KEYS", raising=False)  # doctor without a ring
    report = await asyncio.to_thread(invoke, "doctor", "--url", f"sqlite:///{path}")
    assert report.exit_code == 1 and f"past the first {MAX_NAMED}" in report.output
