"""The synchronous API (``tenxstore.twins``): every async method's twin works from a
plain program, from 16 threads on one checkpointer, after ``fork``, and refuses to
block a running event loop (naming the async method to await)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tenxstore import (
    CachedCheckpointer,
    CheckpointRepository,
    SqliteCheckpointer,
    StaleStateError,
    ToolExecutionInProgress,
)
from tests import services


def cfg(thread: str = "t1", user: str = "alice") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "user_id": user}}


def test_the_twins_from_a_plain_program(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "sync.db") as cp:
        cp.setup()
        config = cfg()
        assert cp.get_state(config) is None
        assert cp.put_checkpoint(config, {"n": 1}, [{"role": "user", "content": "hi"}]) == 1
        assert cp.commit(config, {"n": 2}).version == 2
        assert [s.version for s in cp.list_states(config)] == [2, 1]
        assert [m["content"] for m in cp.get_messages(config)] == ["hi"]
        assert cp.put_thread(config, name="first").name == "first"
        assert [t.thread_id for t in cp.iter_threads(batch=1)] == ["t1"]
        assert [t.thread_id for t in cp.list_threads(cfg())] == ["t1"]
        ran: list[int] = []

        def tool(x: int) -> int:
            ran.append(x)
            return x * 2

        for _ in range(2):  # the second call replays the recorded result
            assert cp.run_tool_once(config, "call-1", "double", {"x": 21}, tool) == 42
        assert ran == [21]
        assert cp.get_tool_execution(config, "call-1").status == "succeeded"
        export = cp.export_thread(config)
        assert export is not None and cp.import_thread(export) == "unchanged"
        assert cp.stats().threads == 1 and cp.check().ok
        assert cp.delete_user("alice").threads == 1
        assert cp.get_state(config) is None
        assert cp.store_id()


async def test_a_twin_inside_a_running_loop_names_the_async_method(tmp_path: Path) -> None:
    cp = SqliteCheckpointer(tmp_path / "loop.db")
    cp.setup()  # works here: a private loop of its own
    try:
        with pytest.raises(RuntimeError, match="aget_state"):
            cp.get_state(cfg())
        with pytest.raises(RuntimeError, match="aiter_threads"):
            list(cp.iter_threads())
        assert await cp.aget_state(cfg()) is None
    finally:
        await cp.aclose()


def test_sixteen_threads_on_one_checkpointer(pg_url: str, pg_schema: str) -> None:
    """Each thread writes its own conversation and all of them one shared thread (the
    compare-and-swap retried): nothing lost, one pool serving them all."""
    with CheckpointRepository(pg_url, schema=pg_schema) as repo:
        repo.setup()

        def work(me: int) -> int:
            for step in range(1, 6):
                assert repo.put_checkpoint(cfg(f"own-{me}"), {"step": step}) == step
            while True:
                shared = cfg("shared")
                state = repo.get_state(shared) or {"writers": []}
                try:
                    return repo.put_state(shared, {"writers": [*state["writers"], me]})
                except StaleStateError:
                    continue

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            versions = sorted(pool.map(work, range(16)))
        assert versions == list(range(1, 17))
        assert sorted(repo.get_state(cfg("shared"))["writers"]) == list(range(16))
        assert all(repo.get_state(cfg(f"own-{me}")) == {"step": 5} for me in range(16))


def _child(me: int) -> int:
    """In a forked child: the parent's checkpointer, used at once."""
    return _FORKED.put_state(cfg(f"child-{me}"), {"pid": os.getpid()})


_FORKED: Any = None


@pytest.mark.skipif(sys.platform != "linux", reason="fork is the Linux default being tested")
def test_after_fork_each_child_has_its_own_connections(pg_url: str, pg_schema: str) -> None:
    global _FORKED
    repo = CheckpointRepository(pg_url, schema=pg_schema)
    repo.setup()
    _FORKED = repo
    try:
        assert repo.put_state(cfg("parent"), {"n": 1}) == 1  # the parent's pool is open
        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map(_child, range(4))
        assert results == [1, 1, 1, 1]
        # the parent's own connections were left alone by the children
        assert repo.put_state(cfg("parent"), {"n": 2}) == 2
        pids = {repo.get_state(cfg(f"child-{me}"))["pid"] for me in range(4)}
        assert os.getpid() not in pids
    finally:
        _FORKED = None
        repo.close()


def test_the_cached_twins_and_a_tool_claimed_elsewhere(tmp_path: Path) -> None:
    services.redis_url()  # asked for under CI: reachable, or the test fails
    inner = CheckpointRepository(f"sqlite:///{tmp_path / 'c.db'}")
    with CachedCheckpointer(inner, redis_url=services.redis_url(), key_prefix="sync") as cp:
        cp.setup()
        config = cfg()
        cp.put_state(config, {"n": 1})
        assert cp.get_state_cache(config) == {"n": 1}
        assert cp.put_state_cache(config, {"n": 0}, 0) is False
        cp.begin_tool_execution(config, "call-2", "slow", {})
        with pytest.raises(ToolExecutionInProgress):
            cp.run_tool_once(config, "call-2", "slow", {}, lambda: 1)
        assert cp.delete(config) is not None
