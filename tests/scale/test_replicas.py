"""Read replicas on a real primary and standby (streaming replication, on loopback):
the reads that tolerate lag go to the standby while its lag is within bound, a run
never reads its own write as missing, and every read says where it was served from.

Lag is made real with ``recovery_min_apply_delay`` on the standby: it receives the
primary's WAL at once and replays each commit only after the delay.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tenxstore import CheckpointRepository, MemoryStore, ReadSource, read_source
from tenxstore.backends.replicas import REPLICA_TIMEOUT, SKIP_SECONDS
from tests.replication import PgPair, poll, started

pytestmark = pytest.mark.slow  # two PostgreSQL servers per module: run once in CI

DELAY = 1.0  # seconds: the standby replays each commit this long after it was made


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgPair]:
    with started(tmp_path_factory.mktemp("replicas"), synchronous=False) as pair:
        yield pair


def delay_replay(nodes: PgPair, seconds: float) -> None:
    """Make the standby replay each commit ``seconds`` after it was made (0: at once),
    and wait until it has taken the setting."""
    nodes.sql("b", f"ALTER SYSTEM SET recovery_min_apply_delay = '{int(seconds * 1000)}ms'")
    nodes.sql("b", "SELECT pg_reload_conf()")
    nodes.wait_sql(
        "b",
        "SELECT setting FROM pg_settings WHERE name = 'recovery_min_apply_delay'",
        str(int(seconds * 1000)),
        "the standby taking its replay delay",
    )


def replayed(nodes: PgPair) -> bool:
    """Whether the standby has replayed everything the primary flushed."""
    position = nodes.sql("a", "SELECT pg_current_wal_flush_lsn()").strip()
    seen = nodes.sql("b", f"SELECT pg_last_wal_replay_lsn() >= '{position}'::pg_lsn").strip()
    return seen == "t"


async def warm(repo: CheckpointRepository, nodes: PgPair) -> None:
    """Set up, and make the standby replay a transaction now (replay at once): its
    lag is then known, small, and within any bound the test sets."""
    delay_replay(nodes, 0)
    await repo.asetup()
    await repo.aput_state(config("warm-up"), {"n": 1})
    poll(lambda: replayed(nodes), "the standby replaying the warm-up")


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "user_id": "u"}}


def open_repository(nodes: PgPair, **options: Any) -> CheckpointRepository:
    return CheckpointRepository(
        nodes.url("a"), replica_urls=[nodes.url("b")], state_history_limit=100, **options
    )


async def test_reads_that_tolerate_lag_go_to_a_replica_and_say_so(nodes: PgPair) -> None:
    delay_replay(nodes, 0)
    repo = open_repository(nodes)
    try:
        await repo.asetup()
        mine = config("served")
        await repo.aput_checkpoint(mine, {"n": 1}, [{"role": "user", "content": "hi"}])
        poll(lambda: replayed(nodes), "the standby replaying the write")

        history = await repo.alist_states(mine)
        assert [s.version for s in history] == [1]
        source = read_source(mine)
        assert source is not None and source.replica == repo.backend.replicas.replicas[0].name
        assert 0.0 <= source.lag <= 5.0
        assert [m["content"] for m in await repo.aget_messages(mine)] == ["hi"]
        listed = {"configurable": {"user_id": "u"}}
        assert "served" in [t.thread_id for t in await repo.alist_threads(listed)]
        assert read_source(listed) is not None and not read_source(listed).primary
        export = await repo.aexport_thread(mine)
        assert export is not None and export.thread.version == 1
        assert [t.thread_id async for t in repo.aiter_threads()] == ["served"]

        # the reads a write compares against stay on the primary
        head_sql: list[str] = []
        replica = repo.backend.replicas.replicas[0].backend
        remove = replica.on_statement(head_sql.append)
        try:
            assert await repo.aget_state(mine) == {"n": 1}
            await repo.aput_checkpoint(mine, {"n": 2})
        finally:
            remove()
        assert head_sql == []
        health = await repo.acheck()
        assert health.ok, health.problems
        assert health.replicas[0].error is None and health.replicas[0].lag is not None
    finally:
        await repo.aclose()


async def test_a_run_never_reads_its_own_write_as_missing(nodes: PgPair) -> None:
    """Under real lag, each turn's history read right after its write includes the
    write (the standby has not replayed it: the primary answers); another process
    (here another repository) that reads the thread may miss it, and then says it was
    served by a lagging replica."""
    delay_replay(nodes, DELAY)
    repo = open_repository(nodes, max_replica_lag=30)
    other = open_repository(nodes, max_replica_lag=30)
    try:
        await repo.asetup()
        mine = config("lagging")
        missed_by_other = 0
        for turn in range(1, 9):
            message = {"role": "user", "content": f"turn {turn}"}
            version = await repo.aput_checkpoint(mine, {"turn": turn}, [message])
            history = await repo.alist_states(mine)
            assert history[0].version == version and history[0].state == {"turn": turn}
            messages = await repo.aget_messages(mine)
            assert messages[-1]["content"] == f"turn {turn}"
            assert read_source(mine) == ReadSource(None, 0.0)  # the standby is behind

            theirs = config("lagging")
            seen = await other.alist_states(theirs)
            said = read_source(theirs)
            assert said is not None
            if not seen or seen[0].version < version:
                missed_by_other += 1
                assert not said.primary and said.lag > 0  # it says it lags
        # the standby replays each commit a second late: the other's read was served
        # stale (and said so)
        assert missed_by_other >= 1
        poll(lambda: replayed(nodes), "the standby catching up", timeout=DELAY * 20 + 30)
        assert (await repo.alist_states(config("lagging")))[0].version == 8
    finally:
        await repo.aclose()
        await other.aclose()
        delay_replay(nodes, 0)


async def test_a_process_never_reads_its_own_writes_as_missing(nodes: PgPair) -> None:
    """Not only state writes: a new thread, a renamed one and a deleted one are read
    back as written, however far the standby lags (the reads go to the primary until a
    probe shows the standby holds them)."""
    repo = open_repository(nodes, max_replica_lag=30)
    try:
        await warm(repo, nodes)
        delay_replay(nodes, DELAY * 3)
        mine = config("renamed")
        mine["configurable"]["user_id"] = "ryw"
        listing = {"configurable": {"user_id": "ryw"}}
        await repo.aput_thread(mine, name="first")
        assert [(t.thread_id, t.name) for t in await repo.alist_threads(listing)] == [
            ("renamed", "first")
        ]
        await repo.aput_thread(mine, name="second")
        assert [t.name for t in await repo.alist_threads(listing)] == ["second"]
        await repo.aput_checkpoint(mine, {"n": 1}, [{"role": "user", "content": "hi"}])
        assert [m["content"] for m in await repo.aget_messages(mine)] == ["hi"]
        assert await repo.adelete(mine) is not None
        assert await repo.alist_states(mine) == []
        assert await repo.aget_messages(mine) == []
        assert await repo.alist_threads(listing) == []
        assert await repo.aexport_thread(mine) is None
        assert "renamed" not in [t.thread_id async for t in repo.aiter_threads()]
    finally:
        await repo.aclose()
        delay_replay(nodes, 0)


async def test_a_replica_past_its_bound_is_skipped(nodes: PgPair) -> None:
    """Another process's reads: from the standby only while it is within
    ``max_replica_lag`` (and then saying how far behind it may be); once the commit it
    has not replayed is older than that, from the primary, the write included."""
    repo = open_repository(nodes)
    other = open_repository(nodes, max_replica_lag=DELAY / 4)
    try:
        await warm(repo, nodes)
        delay_replay(nodes, 60)  # the next commit stays unreplayed for the whole test
        await repo.aput_checkpoint(config("bounded"), {"turn": 1})
        deadline = time.monotonic() + 30
        while True:
            theirs = config("bounded")
            asked = time.monotonic()
            history = await other.alist_states(theirs)
            took = time.monotonic() - asked
            said = read_source(theirs)
            assert said is not None
            if said.primary:
                assert [s.version for s in history] == [1]
                break
            # picked within its bound; the answer's bound adds the read's own time
            assert said.lag <= DELAY / 4 + took  # (the write may be missing from it)
            assert time.monotonic() < deadline, "the lagging standby was never skipped"
            await asyncio.sleep(0.02)  # polling for the bound to pass, not waiting
        assert other.backend.replicas.primary_reads >= 1
    finally:
        await repo.aclose()
        await other.aclose()
        delay_replay(nodes, 0)


async def test_a_replica_that_is_down_is_skipped_and_used_again(nodes: PgPair) -> None:
    repo = open_repository(nodes)
    try:
        await repo.asetup()
        mine = config("down")
        await repo.aput_checkpoint(mine, {"n": 1})
        poll(lambda: replayed(nodes), "the standby replaying the write")
        stranger = config("down")
        await repo.alist_states(stranger)  # a pooled connection to the standby, in use
        assert not read_source(stranger).primary
        nodes._stop_node("b")  # immediate: its pooled connection is dead
        try:
            for _ in range(3):
                assert [s.version for s in await repo.alist_states(config("down"))] == [1]
            replica = repo.backend.replicas.replicas[0]
            assert replica.skipped_until > time.monotonic()
            assert replica.why
            health = await repo.acheck()
            assert health.replicas[0].error is not None and not health.ok
        finally:
            nodes._start_node("b")
        nodes._wait_streaming("b")

        async def back() -> bool:
            stranger = config("down")
            await repo.alist_states(stranger)
            said = read_source(stranger)
            return said is not None and not said.primary

        deadline = time.monotonic() + SKIP_SECONDS + 30
        while not await back():
            assert time.monotonic() < deadline, "the replica was never used again"
            await asyncio.sleep(0.2)
    finally:
        await repo.aclose()


async def test_memory_search_and_listing_on_a_replica(nodes: PgPair) -> None:
    delay_replay(nodes, 0)
    store = MemoryStore(f"{nodes.url('a')}?replica=127.0.0.1:{nodes.ports[1]}")
    try:
        await store.asetup()
        await store.astore("u", "I like green tea in the morning", key="prefs")
        await store.astore("u", "My cat is called Miso", key="pets")
        poll(lambda: replayed(nodes), "the standby replaying the memories")
        replica = store.base.backend.replicas.replicas[0]
        before = replica.served
        hits = await store.asearch("u", "tea", mode="keyword")
        assert [h.memory.key for h in hits] == ["prefs"]
        assert sorted(m.key for m in await store.alist("u")) == ["pets", "prefs"]
        assert replica.served >= before + 2
    finally:
        await store.aclose()


async def test_a_memory_stored_or_forgotten_is_read_back_so(nodes: PgPair) -> None:
    """The memory store's listing and search after its own writes, under lag: what was
    stored is found, what was deleted is not."""
    store = MemoryStore(f"{nodes.url('a')}?replica=127.0.0.1:{nodes.ports[1]}&max_replica_lag=30")
    try:
        await warm(store.repository, nodes)
        delay_replay(nodes, DELAY * 3)
        await store.astore("ryw", "the user is allergic to peanuts", key="allergy")
        assert [m.key for m in await store.alist("ryw")] == ["allergy"]
        assert [h.memory.key for h in await store.asearch("ryw", "peanuts", mode="keyword")] == [
            "allergy"
        ]
        assert await store.adelete("ryw", "allergy")
        assert await store.alist("ryw") == []
        assert await store.asearch("ryw", "peanuts", mode="keyword") == []
    finally:
        await store.aclose()
        delay_replay(nodes, 0)


async def test_a_standby_that_stopped_streaming_is_skipped(nodes: PgPair) -> None:
    """A standby whose WAL receiver stopped (it follows no primary now: cut off, or a
    former primary started as a standby of nothing) serves nothing, however caught up
    its replay position looks."""
    conninfo = nodes.sql("b", "SHOW primary_conninfo").strip()
    repo = open_repository(nodes)
    try:
        await repo.asetup()
        nodes.sql("b", "ALTER SYSTEM SET primary_conninfo = ''")
        nodes.sql("b", "SELECT pg_reload_conf()")
        nodes.wait_sql("b", "SELECT count(*) FROM pg_stat_wal_receiver", "0", "no WAL receiver")
        listing = {"configurable": {"user_id": "nobody"}}
        assert await repo.alist_threads(listing) == []
        assert read_source(listing) == ReadSource(None, 0.0)
        health = await repo.acheck()
        assert "does not stream" in (health.replicas[0].error or "")
    finally:
        quoted = conninfo.replace("'", "''")
        nodes.sql("b", f"ALTER SYSTEM SET primary_conninfo = '{quoted}'")
        nodes.sql("b", "SELECT pg_reload_conf()")
        nodes._wait_streaming("b")
        await repo.aclose()


async def test_a_standby_that_hangs_is_skipped_within_a_second(nodes: PgPair) -> None:
    """Every process of the standby stopped (SIGSTOP: a hung machine): a read that
    tolerates lag is answered by the primary after the probe's bound, not never."""
    repo = open_repository(nodes)
    stopped: list[int] = []
    try:
        await repo.asetup()
        listing = {"configurable": {"user_id": "nobody"}}
        await repo.alist_threads(listing)  # the standby is known and pooled
        stopped = nodes.pause("b")
        for _ in range(3):
            started = time.monotonic()
            assert await asyncio.wait_for(repo.alist_threads(listing), 30) == []
            assert time.monotonic() - started < REPLICA_TIMEOUT + 5
        assert repo.backend.replicas.replicas[0].skipped_until > time.monotonic()
    finally:
        nodes.resume(stopped)
        await repo.aclose()
