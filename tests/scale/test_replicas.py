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

from tenxstore import CheckpointRepository, MemoryStore, read_source
from tenxstore.backends.replicas import SKIP_SECONDS
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
    write (the standby has not replayed it: the primary answers); a config that never
    read the thread may miss it, and then says it was served by a lagging replica."""
    delay_replay(nodes, DELAY)
    repo = open_repository(nodes, max_replica_lag=30)
    try:
        await repo.asetup()
        mine = config("lagging")
        served = {"primary": 0, "replica": 0}
        missed_by_stranger = 0
        for turn in range(1, 9):
            message = {"role": "user", "content": f"turn {turn}"}
            version = await repo.aput_checkpoint(mine, {"turn": turn}, [message])
            history = await repo.alist_states(mine)
            assert history[0].version == version and history[0].state == {"turn": turn}
            messages = await repo.aget_messages(mine)
            assert messages[-1]["content"] == f"turn {turn}"
            source = read_source(mine)
            assert source is not None
            served["primary" if source.primary else "replica"] += 1

            stranger = config("lagging")  # another process: it recorded no version
            seen = await repo.alist_states(stranger)
            said = read_source(stranger)
            assert said is not None
            if not seen or seen[0].version < version:
                missed_by_stranger += 1
                assert not said.primary and said.lag > 0  # it says it lags
        # the standby replays each commit a second late: the turns' own reads went to
        # the primary, and a stranger's read was served stale (and said so)
        assert served["primary"] >= 1
        assert missed_by_stranger >= 1
        poll(lambda: replayed(nodes), "the standby catching up", timeout=DELAY * 20 + 30)
        stranger = config("lagging")
        assert (await repo.alist_states(stranger))[0].version == 8
    finally:
        await repo.aclose()
        delay_replay(nodes, 0)


async def test_a_replica_past_its_bound_is_skipped(nodes: PgPair) -> None:
    """With ``max_replica_lag`` below the standby's lag, every read goes to the
    primary once the lag is measured, and a fresh read always includes the write."""
    delay_replay(nodes, DELAY)
    repo = open_repository(nodes, max_replica_lag=DELAY / 4)
    try:
        await repo.asetup()
        mine = config("bounded")
        for turn in range(1, 6):
            await repo.aput_checkpoint(mine, {"turn": turn})
            stranger = config("bounded")
            history = await repo.alist_states(stranger)
            said = read_source(stranger)
            assert said is not None
            if said.primary:
                assert history[0].version == turn
            else:  # within its bound: at most DELAY / 4 behind
                assert said.lag <= DELAY / 4
        assert repo.backend.replicas.primary_reads >= 3
    finally:
        await repo.aclose()
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
