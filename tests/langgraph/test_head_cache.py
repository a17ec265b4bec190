"""The Redis head cache of LangGraph graphs (tenxstore.cache_langgraph), on the cached
presets: hits without SQL, no older head after a newer commit, nothing resurrected after
a delete, a prune, a copy or delete_for_runs, and no answer changed by Redis going away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from redis.asyncio import Redis

import tenxstore
from tenxstore.langgraph import TenxCheckpointSaver
from tests import services
from tests.cache.conftest import sql_statements
from tests.conftest import Backend, _with_encryption, backend_for
from tests.langgraph.test_graphs import chat_graph, run


@pytest.fixture(params=_with_encryption(["sqlite+redis", "postgresql+redis"]))
async def cached(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with backend_for(request.param, tmp_path) as b:
        yield b


def uncached(saver: TenxCheckpointSaver) -> TenxCheckpointSaver:
    """The same saver on the repository behind the cache: the database's answers."""
    return TenxCheckpointSaver(saver.checkpointer.inner).for_user("alice")


async def turns(graph: Any, thread: str, n: int) -> None:
    for i in range(n):
        await graph.ainvoke({"turns": [f"turn {i}"]}, run(thread))


async def test_a_head_is_served_from_redis_without_sql(cached: Backend) -> None:
    cp = await cached.make()
    saver = TenxCheckpointSaver(cp).for_user("alice")
    await turns(chat_graph(saver), "t", 3)
    with sql_statements(cp) as seen:
        hit = await saver.aget_tuple(run("t"))
    assert seen == []
    assert hit == await uncached(saver).aget_tuple(run("t"))
    assert cp.langgraph_cache.stats.hits >= 3  # every turn's first read too
    client = Redis.from_url(cached.redis_url or "")
    try:
        keys = [k async for k in client.scan_iter(match=f"{cp.key_prefix}:lg:*")]
        assert keys
        if cached.keys is not None:  # sealed: no value in clear
            for key in keys:
                assert b"turn 0" not in (await client.get(key) or b"")
    finally:
        await client.aclose()
    older = (await saver.aget_tuple(run("t"))).parent_config  # time travel: the database
    with sql_statements(cp) as seen:
        back = await saver.aget_tuple(older)
    assert seen and back == await uncached(saver).aget_tuple(older)


async def test_pending_writes_and_an_interrupt_change_the_head(cached: Backend) -> None:
    cp = await cached.make()
    saver = TenxCheckpointSaver(cp).for_user("alice")
    config = {"configurable": {"thread_id": "w"}}
    await turns(chat_graph(saver), "w", 1)
    head = await saver.aget_tuple(config)
    assert head is not None
    await saver.aput_writes(head.config, [("turns", ["pending"])], "task-1")
    again = await saver.aget_tuple(config)
    assert again == await uncached(saver).aget_tuple(config)
    assert again is not None and again.pending_writes == [("task-1", "turns", ["pending"])]


async def test_a_reader_never_sees_an_older_head_after_a_newer_commit(cached: Backend) -> None:
    """Two stores on one database and one Redis (two processes): one writes turns, the
    other reads the head as fast as it can, beside it."""
    writer_cp, reader_cp = await cached.make(), await cached.make()
    writer = TenxCheckpointSaver(writer_cp).for_user("alice")
    reader = TenxCheckpointSaver(reader_cp).for_user("alice")
    graph = chat_graph(writer)
    committed: list[str] = []  # heads whose turn returned, in order
    done = asyncio.Event()

    async def write() -> None:
        try:
            for i in range(12):
                await graph.ainvoke({"turns": [f"turn {i}"]}, run("race"))
                head = await uncached(writer).aget_tuple(run("race"))
                assert head is not None
                committed.append(head.checkpoint["id"])
        finally:
            done.set()

    async def read() -> int:
        reads = 0
        while not done.is_set():
            floor = committed[-1] if committed else ""
            found = await reader.aget_tuple(run("race"))
            reads += 1
            if found is not None:
                assert found.checkpoint["id"] >= floor, "an older head after a newer commit"
            await asyncio.sleep(0)
        return reads

    _, reads = await asyncio.gather(write(), read())
    assert reads > 12
    final = await reader.aget_tuple(run("race"))
    assert final is not None and final.checkpoint["id"] == committed[-1]
    assert final == await uncached(reader).aget_tuple(run("race"))


async def test_nothing_comes_back_after_delete_prune_copy_or_delete_for_runs(
    cached: Backend,
) -> None:
    cp = await cached.make()
    saver = TenxCheckpointSaver(cp, history_limit=None).for_user("alice")
    graph = chat_graph(saver)
    db = uncached(saver)

    async def same(thread: str) -> None:
        assert await saver.aget_tuple(run(thread)) == await db.aget_tuple(run(thread))

    await turns(graph, "d", 2)
    await saver.aget_tuple(run("d"))  # cached
    await saver.adelete_thread("d")
    assert await saver.aget_tuple(run("d")) is None

    # delete_for_runs takes the newest checkpoints away: the head goes back
    await turns(graph, "r", 1)
    before = await saver.aget_tuple(run("r"))
    assert before is not None
    await saver.aput(before.config, empty_checkpoint(), {"run_id": "doomed", "step": 9}, {})
    await same("r")
    await saver.adelete_for_runs(["doomed"])
    await same("r")
    found = await saver.aget_tuple(run("r"))
    assert found is not None and found.checkpoint["id"] == before.checkpoint["id"]

    # copy over a target whose head was cached
    await turns(graph, "src", 3)
    await turns(graph, "dst", 1)
    await same("dst")
    await saver.acopy_thread("src", "dst")
    await same("dst")
    copied = await saver.aget_tuple(run("dst"))
    assert copied is not None and len(copied.checkpoint["channel_values"]["turns"]) == 6

    # prune: delete strategy
    await same("src")
    await saver.aprune(["src"], strategy="delete")
    assert await saver.aget_tuple(run("src")) is None


async def test_a_huge_head_is_not_cached_and_counted(cached: Backend) -> None:
    cp = await cached.make()
    cp.langgraph_cache.max_bytes = 200
    saver = TenxCheckpointSaver(cp).for_user("alice")
    await turns(chat_graph(saver), "big", 2)
    with sql_statements(cp) as seen:
        found = await saver.aget_tuple(run("big"))
    assert seen and found == await uncached(saver).aget_tuple(run("big"))
    assert cp.langgraph_cache.stats.oversized > 0


async def test_redis_flushed_mid_run_changes_no_answer(cached: Backend) -> None:
    cp = await cached.make()
    saver = TenxCheckpointSaver(cp).for_user("alice")
    graph = chat_graph(saver)
    client = Redis.from_url(cached.redis_url or "")
    try:
        for i in range(4):
            await graph.ainvoke({"turns": [f"turn {i}"]}, run("f"))
            keys = [k async for k in client.scan_iter(match=f"{cp.key_prefix}:lg:*")]
            if i % 2 == 0 and keys:
                await client.delete(*keys)  # flushed (only this test's keys)
            assert await saver.aget_tuple(run("f")) == await uncached(saver).aget_tuple(run("f"))
    finally:
        await client.aclose()
    state = await graph.aget_state(run("f"))
    assert state.values["turns"][-1] == "reply 7"


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_redis_down_changes_no_answer(kind: str, tmp_path: Path) -> None:
    """A Redis nobody listens on: every call fails open to the database."""
    port = services.free_port()
    if kind == "sqlite":
        cp: Any = tenxstore.SqliteCheckpointer(
            tmp_path / "down.db", redis_url=f"redis://127.0.0.1:{port}/0"
        )
    else:
        async with backend_for("postgresql", tmp_path) as b:
            await run_down(
                tenxstore.PgCheckpointer(
                    postgres_dsn=b.url,
                    schema=b.schema,
                    redis_url=f"redis://127.0.0.1:{port}/0",
                )
            )
        return
    await run_down(cp)


async def run_down(cp: Any) -> None:
    await cp.asetup()
    try:
        saver = TenxCheckpointSaver(cp).for_user("alice")
        await turns(chat_graph(saver), "down", 3)
        found = await saver.aget_tuple(run("down"))
        assert found == await uncached(saver).aget_tuple(run("down"))
        assert found is not None and found.checkpoint["channel_values"]["turns"][-1] == "reply 5"
        assert cp.langgraph_cache.stats.hits == 0 and cp.langgraph_cache.stats.fail_open > 0
    finally:
        await cp.aclose()
