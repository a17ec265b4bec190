"""A hostile review of the LangGraph head cache (tenxstore.cache_langgraph): real Redis,
real databases, real LangGraph graphs. Gates only delay a real call (the library's code
runs as it is); the tests that fail show a finding."""

from __future__ import annotations

import asyncio
import contextlib
import operator
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from redis.asyncio import Redis

import tenxstore
from tenxstore import AuthPolicy
from tenxstore.cache_keys import segment
from tenxstore.langgraph import TenxCheckpointSaver, aimport_langgraph
from tests import services
from tests.cache.conftest import sql_statements
from tests.conftest import Backend, backend_for
from tests.langgraph.test_graphs import chat_graph, run
from tests.langgraph.test_import_langgraph import lg_source


@pytest.fixture(params=["sqlite+redis", "postgresql+redis"])
async def cached(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with backend_for(request.param, tmp_path) as b:
        yield b


@pytest.fixture
async def sqlite_cached(tmp_path: Path) -> AsyncIterator[Backend]:
    async with backend_for("sqlite+redis", tmp_path) as b:
        yield b


def uncached(saver: TenxCheckpointSaver, user: str = "alice") -> TenxCheckpointSaver:
    return TenxCheckpointSaver(saver.checkpointer.inner).for_user(user)


async def turns(graph: Any, thread: str, n: int) -> None:
    for i in range(n):
        await graph.ainvoke({"turns": [f"turn {i}"]}, run(thread))


def epoch_key(cp: Any, thread: str) -> str:
    return f"{cp.langgraph_cache._known_prefix}:lg:{{{segment(thread)}}}"


def gate_refill(cp: Any) -> tuple[asyncio.Event, asyncio.Event, Any]:
    """The reader's refill waits for ``gate`` after its database read (``reached``)."""
    lg = cp.langgraph_cache
    real = lg.refill
    reached, gate = asyncio.Event(), asyncio.Event()

    async def gated(*args: Any) -> None:
        reached.set()
        await gate.wait()
        await real(*args)

    lg.refill = gated
    return reached, gate, real


# -- 1. the importer's replace leaves the old head in Redis ---------------------------


async def test_import_replace_does_not_serve_the_replaced_head(
    cached: Backend, tmp_path: Path
) -> None:
    async with lg_source("sqlite", tmp_path) as source:
        async with source.saver() as lg:
            graph = chat_graph(lg)
            for i in range(3):
                await graph.ainvoke({"turns": [f"imported {i}"]}, run("imp"))
        cp = await cached.make()
        saver = TenxCheckpointSaver(cp).for_user("alice")
        await turns(chat_graph(saver), "imp", 1)
        old = await saver.aget_tuple(run("imp"))  # the head, cached
        assert old is not None
        done = await aimport_langgraph(source.url, cp, user_id="alice", on_conflict="replace")
        assert done.outcomes["replaced"] == 1
        db = await uncached(saver).aget_tuple(run("imp"))
        assert db is not None and db.checkpoint["id"] != old.checkpoint["id"]
        served = await saver.aget_tuple(run("imp"))
        assert served is not None
        assert served.checkpoint["id"] == db.checkpoint["id"], "the replaced head was served"


# -- 2. an epoch evicted (or flushed) lets a refill with no lease land an older head --


async def test_a_lease_less_refill_lands_an_older_head_after_the_epoch_is_evicted(
    cached: Backend,
) -> None:
    w_cp, r_cp = await cached.make(), await cached.make()
    writer = TenxCheckpointSaver(w_cp).for_user("alice")
    reader = TenxCheckpointSaver(r_cp).for_user("alice")
    graph = chat_graph(writer)
    await turns(graph, "ev", 1)
    client = Redis.from_url(cached.redis_url or "")
    try:
        await client.delete(epoch_key(w_cp, "ev"))  # no epoch: evicted / expired / flushed
        reached, gate, real = gate_refill(r_cp)
        task = asyncio.create_task(reader.aget_tuple(run("ev")))  # lease "", reads c1
        await reached.wait()
        await turns(graph, "ev", 1)  # newer heads committed and returned
        newest = await uncached(writer).aget_tuple(run("ev"))
        assert newest is not None
        await client.delete(epoch_key(w_cp, "ev"))  # maxmemory eviction of one key
        gate.set()
        await task
        r_cp.langgraph_cache.refill = real
        served = await reader.aget_tuple(run("ev"))
        assert served is not None
        assert served.checkpoint["id"] == newest.checkpoint["id"], "an older head was served"
    finally:
        await client.aclose()


async def test_an_in_flight_refill_under_a_lease_never_lands_after_a_put(
    cached: Backend,
) -> None:
    """Held: the lease is compared in full; a put moves it."""
    w_cp, r_cp = await cached.make(), await cached.make()
    writer = TenxCheckpointSaver(w_cp).for_user("alice")
    reader = TenxCheckpointSaver(r_cp).for_user("alice")
    graph = chat_graph(writer)
    await turns(graph, "lease", 1)
    reached, gate, real = gate_refill(r_cp)
    client = Redis.from_url(cached.redis_url or "")
    try:
        # an entry that is a miss (tombstone of the head): the reader gets a lease
        head = await writer.aget_tuple(run("lease"))
        assert head is not None
        await writer.aput_writes(head.config, [("turns", ["w"])], "t1")
        task = asyncio.create_task(reader.aget_tuple(run("lease")))
        await reached.wait()
        await turns(graph, "lease", 1)
        newest = await uncached(writer).aget_tuple(run("lease"))
        gate.set()
        await task
        r_cp.langgraph_cache.refill = real
        served = await reader.aget_tuple(run("lease"))
        assert served == newest
    finally:
        await client.aclose()


# -- 3. a cancelled put (after its commit) leaves other processes on the old head -----


async def test_a_cancelled_put_after_commit_is_not_served_stale_by_another_process(
    cached: Backend,
) -> None:
    w_cp, r_cp = await cached.make(), await cached.make()
    writer = TenxCheckpointSaver(w_cp).for_user("alice")
    reader = TenxCheckpointSaver(r_cp).for_user("alice")
    await turns(chat_graph(writer), "cx", 1)
    head = await reader.aget_tuple(run("cx"))  # cached for every process
    assert head is not None
    assert await reader.aget_tuple(run("cx")) == head
    hits = r_cp.langgraph_cache.stats.hits
    assert hits >= 1

    rc = w_cp.langgraph_cache._redis  # the Redis step after the commit is slow
    real_call = rc.call
    reached = asyncio.Event()

    async def slow(what: str, make: Any) -> Any:
        if what == "langgraph.advance":
            reached.set()
            await asyncio.Event().wait()
        return await real_call(what, make)

    rc.call = slow
    new = empty_checkpoint()
    task = asyncio.create_task(writer.aput(head.config, new, {"step": 5}, {}))
    await reached.wait()  # the put committed; its Redis step is under way
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    rc.call = real_call
    db = await uncached(writer).aget_tuple(run("cx"))
    assert db is not None and db.checkpoint["id"] == new["id"]  # it did commit
    await asyncio.sleep(0.5)  # Redis answers all along; the writer's process is idle
    served = await reader.aget_tuple(run("cx"))
    assert served is not None
    assert served.checkpoint["id"] == new["id"], "the head before the committed put"


async def test_a_cancelled_put_is_a_miss_in_its_own_process(sqlite_cached: Backend) -> None:
    """Held: the writer's own process skips Redis for the thread, then sends the epoch."""
    cp = await sqlite_cached.make()
    writer = TenxCheckpointSaver(cp).for_user("alice")
    await turns(chat_graph(writer), "own", 1)
    head = await writer.aget_tuple(run("own"))
    assert head is not None
    rc = cp.langgraph_cache._redis
    real_call = rc.call
    reached = asyncio.Event()

    async def slow(what: str, make: Any) -> Any:
        if what == "langgraph.advance":
            reached.set()
            await asyncio.Event().wait()
        return await real_call(what, make)

    rc.call = slow
    new = empty_checkpoint()
    task = asyncio.create_task(writer.aput(head.config, new, {"step": 5}, {}))
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    rc.call = real_call
    served = await writer.aget_tuple(run("own"))
    assert served is not None and served.checkpoint["id"] == new["id"]


# -- 4. the head a put caches equals the database's, with channels it did not change ---


class Two(TypedDict):
    topic: str
    turns: Annotated[list[str], operator.add]
    count: int


def two_channel_graph(saver: Any) -> Any:
    def first(state: Two) -> dict[str, Any]:
        return {"turns": [f"reply {len(state['turns'])}"]}

    def second(state: Two) -> dict[str, Any]:
        return {"count": state.get("count", 0) + 1}

    return (
        StateGraph(Two)
        .add_node("first", first)
        .add_node("second", second)
        .add_edge(START, "first")
        .add_edge("first", "second")
        .add_edge("second", END)
        .compile(checkpointer=saver)
    )


async def test_a_put_cached_head_equals_the_database_with_unchanged_channels(
    cached: Backend,
) -> None:
    cp = await cached.make()
    saver = TenxCheckpointSaver(cp).for_user("alice")
    graph = two_channel_graph(saver)
    await graph.ainvoke({"topic": "t" * 50, "turns": ["hi"]}, run("two"))
    await graph.ainvoke({"turns": ["again"]}, run("two"))
    with sql_statements(cp) as seen:
        hit = await saver.aget_tuple(run("two"))
    assert seen == []  # from the put's entry
    assert hit == await uncached(saver).aget_tuple(run("two"))
    state = await graph.aget_state(run("two"))
    assert state.values["topic"] == "t" * 50 and state.values["count"] == 2


# -- 5. isolation: another user's head; the unscoped reader --------------------------


async def test_isolation_and_the_unscoped_reader(cached: Backend) -> None:
    cp = await cached.make()
    alice = TenxCheckpointSaver(cp).for_user("alice")
    bob = TenxCheckpointSaver(cp).for_user("bob")
    op = TenxCheckpointSaver(cp, auth_policy=AuthPolicy(enforce_user_isolation=False))
    graph = chat_graph(alice)
    await turns(graph, "iso", 1)
    assert await alice.aget_tuple(run("iso")) is not None
    for _ in range(2):
        with contextlib.suppress(tenxstore.ThreadOwnershipError):
            assert await bob.aget_tuple(run("iso")) is None
    first = await op.aget_tuple(run("iso"))
    assert first is not None and await op.aget_tuple(run("iso")) == first  # `*` cached
    await turns(graph, "iso", 1)
    head = await alice.aget_tuple(run("iso"))
    assert head is not None
    assert (await op.aget_tuple(run("iso"))).checkpoint["id"] == head.checkpoint["id"]
    await alice.aput_writes(head.config, [("turns", ["pending"])], "task-x")
    seen = await op.aget_tuple(run("iso"))
    assert seen is not None and seen.pending_writes == [("task-x", "turns", ["pending"])]
    assert (await alice.aget_tuple(run("iso"))).pending_writes == seen.pending_writes


# -- 6. time travel never from the cache ----------------------------------------------


async def test_time_travel_reads_the_database(sqlite_cached: Backend) -> None:
    cp = await sqlite_cached.make()
    saver = TenxCheckpointSaver(cp).for_user("alice")
    await turns(chat_graph(saver), "tt", 2)
    head = await saver.aget_tuple(run("tt"))
    assert head is not None
    with sql_statements(cp) as seen:
        again = await saver.aget_tuple(head.config)  # the head's own id: still the DB
    assert seen and again == await uncached(saver).aget_tuple(head.config)


# -- 7. sealing: nothing in clear under a key ring ------------------------------------


async def test_nothing_in_clear_under_a_key_ring(tmp_path: Path) -> None:
    async with backend_for("sqlite+redis+encrypted", tmp_path) as b:
        cp = await b.make()
        saver = TenxCheckpointSaver(cp).for_user("alice")
        graph = chat_graph(saver)
        marker = "PLAINTEXT-MARKER"
        await graph.ainvoke({"turns": [marker]}, run("sec"))
        head = await saver.aget_tuple(run("sec"))
        assert head is not None
        await saver.aput_writes(head.config, [("turns", [marker + "-w"])], "task-s")
        await saver.aget_tuple(run("sec"))  # a refill
        cfg = {"configurable": {"thread_id": "sec", "checkpoint_ns": "sub:1"}}
        await saver.aput(
            {"configurable": {**cfg["configurable"], "checkpoint_id": ""}},
            empty_checkpoint(),
            {"source": marker + "-meta", "step": 1},
            {},
        )
        await saver.aget_tuple(cfg)
        client = Redis.from_url(b.redis_url or "")
        try:
            keys = [k async for k in client.scan_iter(match=f"{cp.key_prefix}:lg:*")]
            assert len(keys) >= 2
            for key in keys:
                value = await client.get(key) or b""
                assert marker.encode() not in value, key
        finally:
            await client.aclose()


# -- 8. surrogates in a thread id / a namespace -----------------------------------------


async def test_surrogates_are_answered_as_without_the_cache(sqlite_cached: Backend) -> None:
    cp = await sqlite_cached.make()
    saver = TenxCheckpointSaver(cp).for_user("alice")
    plain = uncached(saver)
    for config in (
        run("bad\ud800id"),
        {"configurable": {"thread_id": "ok", "checkpoint_ns": "ns\udfff"}},
    ):
        try:
            expected: Any = await plain.aget_tuple(config)
        except Exception as exc:
            expected = type(exc)
        try:
            got: Any = await saver.aget_tuple(config)
        except Exception as exc:
            got = type(exc)
        assert got == expected, config


# -- 9. one checkpointer, two event loops ----------------------------------------------


def test_a_checkpointer_reused_across_event_loops(tmp_path: Path) -> None:
    cp = tenxstore.SqliteCheckpointer(
        tmp_path / "loops.db", redis_url=services.redis_url(), key_prefix="review-loops"
    )
    saver = TenxCheckpointSaver(cp).for_user("alice")

    async def first() -> Any:
        await cp.asetup()
        await turns(chat_graph(saver), "loops", 2)
        return await saver.aget_tuple(run("loops"))

    async def second() -> Any:
        await turns(chat_graph(saver), "loops", 1)
        return await saver.aget_tuple(run("loops")), await uncached(saver).aget_tuple(run("loops"))

    async def cleanup() -> None:
        client = Redis.from_url(services.redis_url())
        try:
            keys = [k async for k in client.scan_iter(match="review-loops:*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()
        await cp.aclose()

    try:
        before = asyncio.run(first())
        served, db = asyncio.run(second())
        assert served == db and served.checkpoint["id"] != before.checkpoint["id"]
        assert len(served.checkpoint["channel_values"]["turns"]) == 6
    finally:
        asyncio.run(cleanup())


# -- 10. delete_for_runs / adelete_user against an in-flight refill ---------------------


async def test_no_resurrection_by_an_in_flight_refill_after_delete_user(
    cached: Backend,
) -> None:
    w_cp, r_cp = await cached.make(), await cached.make()
    writer = TenxCheckpointSaver(w_cp).for_user("alice")
    reader = TenxCheckpointSaver(r_cp).for_user("alice")
    await turns(chat_graph(writer), "du", 1)
    reached, gate, real = gate_refill(r_cp)
    client = Redis.from_url(cached.redis_url or "")
    try:
        await client.delete(epoch_key(w_cp, "du"))  # a cold thread: no epoch
        task = asyncio.create_task(reader.aget_tuple(run("du")))
        await reached.wait()
        await w_cp.adelete_user("alice")
        gate.set()
        assert await task is not None  # read before the delete
        r_cp.langgraph_cache.refill = real
        assert await reader.aget_tuple(run("du")) is None
    finally:
        await client.aclose()


# -- 11. checkpoint_ns None (not validated by aget_tuple): key "None" -----------------


async def test_a_none_namespace_is_answered_as_without_the_cache(cached: Backend) -> None:
    cp = await cached.make()
    saver = TenxCheckpointSaver(cp).for_user("alice")
    await turns(chat_graph(saver), "nn", 1)
    config = {"configurable": {"thread_id": "nn", "checkpoint_ns": None}}
    try:
        expected = await uncached(saver).aget_tuple(config)
    except Exception as exc:
        pytest.skip(f"the saver refuses checkpoint_ns None: {exc!r}")
    assert await saver.aget_tuple(config) == expected  # a refill, under key "None"
    head = await saver.aget_tuple(run("nn"))
    assert head is not None
    await saver.aput_writes(head.config, [("turns", ["pending"])], "task-n")
    assert await saver.aget_tuple(config) == await uncached(saver).aget_tuple(config)
