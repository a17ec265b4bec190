"""The cache behind Redis Sentinel, on a real master, replica and three sentinels
(loopback): it serves through Sentinel, fails open during a failover (a coordinated
one and a crash) for at most its breaker window once the sentinels name the new
master, then serves from it; and a replica promoted without the last writes and
fences never serves an older state than the database holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tenxstore import CachedCheckpointer, CheckpointRepository, SqliteCheckpointer
from tests import services
from tests.cache.conftest import sql_statements
from tests.conftest import cfg
from tests.sentinel import REDIS_SERVER, SERVICE, WAIT, SentinelSet, poll

pytestmark = [pytest.mark.slow, pytest.mark.redis]  # five servers per test: once in CI

BACKOFF = 0.1  # the breaker's first window; it doubles on each failure in a row
TIMEOUT = 1.0  # the bound on a Redis call: generous for CI's two loaded cores


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[SentinelSet]:
    """Master ``a``, replica ``b``, three sentinels; stopped afterwards."""
    services.require_path("redis-server", REDIS_SERVER)
    started = SentinelSet(tmp_path / "redis")
    try:
        started.start()
        yield started
    finally:
        started.stop()


@pytest.fixture
async def cached(nodes: SentinelSet, tmp_path: Path) -> AsyncIterator[CachedCheckpointer]:
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'c.db'}")
    await repo.asetup()
    cp = CachedCheckpointer(
        repo,
        sentinels=nodes.sentinels,
        sentinel_service=SERVICE,
        key_prefix="sentinel",
        redis_timeout=TIMEOUT,
        redis_backoff=BACKOFF,
    )
    yield cp
    await cp.aclose()


async def hit(cp: Any, thread: str) -> tuple[Any, bool]:
    """(the state read through the cache, whether no SQL ran: a hit)."""
    with sql_statements(cp) as seen:
        state = await cp.aget_state_cache(cfg(thread))
    return state, seen == []


async def until_hit(cp: Any, thread: str, expected: Any, deadline: float) -> float:
    """Read until a hit; every read must answer ``expected`` (a miss is the database's
    answer, never an error). When the first hit came (``time.monotonic()``)."""
    while True:
        state, was_hit = await hit(cp, thread)
        assert state == expected
        if was_hit:
            return time.monotonic()
        assert time.monotonic() < deadline, "no cache hit before the deadline"
        await asyncio.sleep(0.02)  # polling for a hit, not waiting for one


async def until_answered(cp: Any, deadline: float) -> None:
    """Read a thread nobody wrote until Redis answers the read (none failed open)."""
    while True:
        assert await cp.aget_state_cache(cfg("nobody")) is None
        if cp._redis.status().failures == 0:
            return
        assert time.monotonic() < deadline, "Redis did not answer before the deadline"
        await asyncio.sleep(0.02)  # polling for an answer, not waiting for one


async def test_the_checkpointer_serves_through_sentinel(nodes: SentinelSet, tmp_path: Path) -> None:
    cp = SqliteCheckpointer(
        tmp_path / "p.db",
        sentinels=nodes.sentinels,
        sentinel_service=SERVICE,
        key_prefix="preset",
        redis_timeout=TIMEOUT,
    )
    try:
        await cp.asetup()
        await cp.aput_state(cfg("t1"), {"n": 1})
        assert await hit(cp, "t1") == ({"n": 1}, True)
        assert nodes.get("a", "preset:t1:alice") is not None  # on the master
        health = await cp.acheck()
        assert health.cache_error is None and SERVICE in (health.cache or "")
        assert f"master at 127.0.0.1:{nodes.ports['a']}" in (health.cache or "")
    finally:
        await cp.aclose()


@pytest.mark.parametrize("how", ["sentinel failover", "master killed"])
async def test_a_failover_fails_open_then_serves_from_the_new_master(
    nodes: SentinelSet, cached: CachedCheckpointer, how: str
) -> None:
    await cached.aput_state(cfg("t1"), {"n": 1})
    assert await hit(cached, "t1") == ({"n": 1}, True)
    if how == "master killed":
        nodes.kill("a")
    else:
        nodes.failover()
    # Calls go on while the sentinels elect: every one answers (the database when
    # Redis does not), none raises, none waits past the bound on a Redis call.
    named = None
    version = 1
    while named is None:
        started = time.monotonic()
        version = await cached.aput_state(cfg("t1"), {"n": version + 1})
        assert (await hit(cached, "t1"))[0] == {"n": version}
        assert time.monotonic() - started < 3 * TIMEOUT + 1
        if {nodes.named(port) for port in nodes.sentinel_ports} == {"b"}:
            named = nodes.wait_master("b")
    window = cached._redis.status().down_for  # type: ignore[union-attr]
    first = await until_hit(cached, "t1", {"n": version}, named + WAIT)
    # Back within the breaker window left open when the sentinels named it, plus a
    # refill (the first read on the new master may miss) and CI's slack.
    assert first - named < window + 4 * TIMEOUT, (first - named, window)
    # That hit may still be the old master's (it answers as a master until the sentinels
    # make it b's replica, and drop its clients): the cache goes on to b, and b serves.
    while nodes.get("b", "sentinel:t1:alice") is None:
        assert time.monotonic() < named + WAIT, "the new master never held the entry"
        await until_hit(cached, "t1", {"n": version}, named + WAIT)
        await asyncio.sleep(0.02)  # polling for the new master's entry, not waiting


async def test_a_replica_promoted_without_the_last_writes_never_serves_them(
    nodes: SentinelSet, cached: CachedCheckpointer
) -> None:
    await cached.aput_state(cfg("t1"), {"v": 1})
    await cached.aput_state(cfg("t2"), {"doomed": True})
    key1, key2 = "sentinel:t1:alice", "sentinel:t2:alice"

    master_a = str(nodes.info("a")["master_replid"]).encode()

    def replicated() -> bool:
        return (nodes.get("b", key1) or b"").startswith(
            b"m:" + master_a + b':{"__checkpoint_version__":1,'
        ) and (nodes.get("b", key2) is not None)

    poll(replicated, "b holding v1 of t1 and t2's entry")
    # b stops following a (it is a master of its own from here: the replication id it
    # gets is its promotion's), then a takes v2 of t1 and the fence of t2's delete.
    nodes.run("b", "REPLICAOF", "NO", "ONE")
    await cached.aput_state(cfg("t1"), {"v": 2})
    assert await cached.aclean_thread(cfg("t2"))
    assert (nodes.get("a", key2) or b"").startswith(b'{"__checkpoint_fence__":')
    stale = nodes.get("b", key1)  # a's entry still, named by a
    assert stale is not None and stale.startswith(
        b"m:" + master_a + b':{"__checkpoint_version__":1,'
    )
    assert nodes.get("b", key2) is not None  # b never got the fence
    nodes.kill("a")  # a dies with what b never got; the sentinels promote b
    named = nodes.wait_master("b")
    await until_answered(cached, named + WAIT)  # b answers the cache's calls now
    # Every read answers the database's head: v2 of t1, nothing of t2 — never b's v1.
    await until_hit(cached, "t1", {"v": 2}, named + WAIT)
    for _ in range(3):
        assert await cached.aget_state_cache(cfg("t2")) is None
    entry = nodes.get("b", key1)  # the refill, named by b (its promotion's id)
    master_b = str(nodes.info("b")["master_replid"]).encode()
    assert master_b != master_a
    assert entry is not None and entry.startswith(
        b"m:" + master_b + b':{"__checkpoint_version__":2,'
    )
    # the guard holds on the new master: an older version is refused
    assert await cached.aput_state_cache(cfg("t1"), {"v": "old"}, 1) is False
    assert await hit(cached, "t1") == ({"v": 2}, True)


async def test_a_langgraph_turn_through_sentinel(nodes: SentinelSet, tmp_path: Path) -> None:
    """A LangGraph graph's turn on a checkpointer whose cache is behind Sentinel."""
    services.require_modules("test", "langgraph")
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from tenxstore.langgraph import TenxCheckpointSaver

    class State(TypedDict):
        n: int

    cp = SqliteCheckpointer(
        tmp_path / "g.db", sentinels=nodes.sentinels, sentinel_service=SERVICE, key_prefix="lg"
    )
    try:
        await cp.asetup()
        builder = StateGraph(State)
        builder.add_node("step", lambda state: {"n": state["n"] + 1})
        builder.add_edge(START, "step")
        builder.add_edge("step", END)
        graph = builder.compile(checkpointer=TenxCheckpointSaver(cp))
        config = {"configurable": {"thread_id": "g1", "user_id": "alice"}}
        assert (await graph.ainvoke({"n": 1}, config))["n"] == 2
        assert (await graph.aget_state(config)).values == {"n": 2}
    finally:
        await cp.aclose()
