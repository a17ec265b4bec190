"""tests/replication.py's PgPair: a PostgreSQL 15 primary and standby that fail over
and rejoin, synchronous and asynchronous, two rounds each (a -> b -> a)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests import replication
from tests.replication import PgPair

pytestmark = pytest.mark.slow  # two PostgreSQL servers per test: run once in CI

TABLE = "CREATE TABLE notes (id bigserial PRIMARY KEY, note text NOT NULL)"


def _binaries() -> None:
    """PostgreSQL 15's programs: skip without them, but fail under CI."""
    if replication.available():
        return
    programs = ", ".join(replication.PROGRAMS)
    what = f"PostgreSQL 15's programs ({programs} in {replication.PG_BIN}, and runuser)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} are required in CI", pytrace=False)
    pytest.skip(f"{what} are not installed")


@pytest.fixture
def sync_pair(tmp_path: Path) -> Iterator[PgPair]:
    yield from _pair(tmp_path, synchronous=True)


@pytest.fixture
def async_pair(tmp_path: Path) -> Iterator[PgPair]:
    yield from _pair(tmp_path, synchronous=False)


def _pair(tmp_path: Path, *, synchronous: bool) -> Iterator[PgPair]:
    _binaries()
    pair = PgPair(tmp_path, synchronous=synchronous)
    try:
        started = time.monotonic()
        pair.start()
        print(f"\nstart ({'sync' if synchronous else 'async'}): {time.monotonic() - started:.2f} s")
        yield pair
    finally:
        pair.stop()


async def fetchval(url: str, query: str, *args: Any) -> Any:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


async def commit_note(pair: PgPair, note: str) -> str:
    """Commit a row on the primary; a WAL position its commit record lies past (read
    in the transaction, after the insert)."""
    conn = await asyncpg.connect(pair.url(pair.primary), timeout=10)
    try:
        async with conn.transaction():
            await conn.execute("INSERT INTO notes (note) VALUES ($1)", note)
            lsn: str = await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
        return lsn
    finally:
        await conn.close()


async def notes(url: str) -> set[str]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return {row["note"] for row in await conn.fetch("SELECT note FROM notes")}
    finally:
        await conn.close()


async def wait_for_note(url: str, note: str) -> None:
    """Until the node at ``url`` shows ``note`` (a standby replaying), 30 s at most."""
    deadline = time.monotonic() + replication.WAIT
    while True:
        try:
            if note in await notes(url):
                return
        except asyncpg.UndefinedTableError:  # not even the table yet
            pass
        assert time.monotonic() < deadline, f"{note!r} never reached {url}"
        await asyncio.sleep(0.05)  # polling the standby's replay


async def received(pair: PgPair, lsn: str) -> bool:
    """Whether the standby has received and flushed the WAL up to ``lsn``."""
    assert pair.standby is not None
    return bool(
        await fetchval(
            pair.url(pair.standby), "SELECT pg_last_wal_receive_lsn() >= $1::text::pg_lsn", lsn
        )
    )


async def check_new_primary(pair: PgPair, round_: int) -> None:
    """The promoted node takes writes, directly and through the multi-host URL."""
    await commit_note(pair, f"after failover {round_}")
    conn = await asyncpg.connect(pair.multi_host_url(), timeout=10)
    try:
        assert await conn.fetchval("SELECT NOT pg_is_in_recovery()")
        port = pair.ports[0] if pair.primary == "a" else pair.ports[1]
        assert await conn.fetchval("SELECT inet_server_port()") == port
    finally:
        await conn.close()


async def failover_round(pair: PgPair, round_: int, timings: dict[str, float]) -> None:
    old, new = pair.primary, pair.standby
    assert new is not None
    note = f"before failover {round_}"
    lsn = await commit_note(pair, note)
    if pair.synchronous:
        # The commit returned: the standby has flushed it already (synchronous_commit
        # =on waits for the standby's flush, not its replay), so a crash now loses
        # nothing: fail over at once.
        assert await received(pair, lsn)
    else:
        await wait_for_note(pair.url(new), note)  # asynchronous: let the standby catch up
    timings[f"failover {round_}"] = seconds = pair.failover()
    assert seconds < replication.WAIT
    assert (pair.primary, pair.standby) == (new, None)
    assert note in await notes(pair.url(new))
    await check_new_primary(pair, round_)

    started = time.monotonic()
    pair.rejoin()
    timings[f"rejoin {round_}"] = time.monotonic() - started
    assert (pair.primary, pair.standby) == (new, old)
    state = pair.sql(
        new,
        f"SELECT state, sync_state FROM pg_stat_replication WHERE application_name = '{old}'",
    )
    assert state == ("streaming|sync" if pair.synchronous else "streaming|async")
    # The rejoined node has the new timeline's writes, and follows new ones.
    note = f"after rejoin {round_}"
    lsn = await commit_note(pair, note)
    if pair.synchronous:
        assert await received(pair, lsn)
    await wait_for_note(pair.url(old), note)


async def two_rounds(pair: PgPair) -> dict[str, float]:
    timings: dict[str, float] = {}
    started = time.monotonic()
    await fetchval(pair.url("a"), TABLE)
    await failover_round(pair, 1, timings)  # a -> b
    assert pair.primary == "b"
    await failover_round(pair, 2, timings)  # b -> a
    assert pair.primary == "a"
    expected = {f"{when} {n}" for n in (1, 2) for when in ("before failover", "after rejoin")}
    expected |= {"after failover 1", "after failover 2"}
    assert await notes(pair.url("a")) == expected
    assert await notes(pair.url("b")) == expected
    timings["rounds"] = time.monotonic() - started
    print(", ".join(f"{what}: {seconds:.2f} s" for what, seconds in timings.items()))
    return timings


async def test_sync_pair_fails_over_and_rejoins_twice(sync_pair: PgPair) -> None:
    await two_rounds(sync_pair)


async def test_async_pair_fails_over_and_rejoins_twice(async_pair: PgPair) -> None:
    await two_rounds(async_pair)
