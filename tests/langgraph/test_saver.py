"""TenxCheckpointSaver beyond LangGraph's suite: one writer per parent, bounded history,
isolation, and a real StateGraph resumed after a crash."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph", reason="the bench extra is not installed")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph

from tenxstore import StaleStateError, ThreadOwnershipError
from tenxstore.langgraph import TenxCheckpointSaver
from tests.conftest import Backend


def root(thread: str, checkpoint_id: str | None = None, **extra: Any) -> dict[str, Any]:
    configurable = {"thread_id": thread, "checkpoint_ns": "", **extra}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


async def put(saver: TenxCheckpointSaver, config: dict[str, Any], step: int) -> dict[str, Any]:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"step": step}
    checkpoint["channel_versions"] = {"step": saver.get_next_version(None, None)}
    return await saver.aput(config, checkpoint, {"source": "loop", "step": step}, {})


async def test_two_writers_from_one_parent_cannot_both_commit(backend: Backend) -> None:
    saver = TenxCheckpointSaver(await backend.make(enforce_user_isolation=False))
    first = await put(saver, root("t"), 0)
    parent = first["configurable"]["checkpoint_id"]

    async def writer(step: int) -> dict[str, Any] | StaleStateError:
        try:
            return await put(saver, root("t", parent), step)
        except StaleStateError as exc:
            return exc

    outcomes = await asyncio.gather(*(writer(step) for step in (1, 2, 3)))
    winners = [o for o in outcomes if not isinstance(o, StaleStateError)]
    losers = [o for o in outcomes if isinstance(o, StaleStateError)]
    assert len(winners) == 1 and len(losers) == 2
    assert all(e.expected_version == parent for e in losers)
    assert all(e.actual_version == winners[0]["configurable"]["checkpoint_id"] for e in losers)
    history = [t async for t in saver.alist(root("t"))]
    assert len(history) == 2  # no fork: the first checkpoint and the one winner
    latest = await saver.aget_tuple(root("t"))
    assert latest is not None and latest.parent_config is not None
    assert latest.parent_config["configurable"]["checkpoint_id"] == parent


async def test_history_is_bounded(backend: Backend) -> None:
    saver = TenxCheckpointSaver(await backend.make(enforce_user_isolation=False), history_limit=3)
    config = root("bounded")
    for step in range(6):
        stored = await put(saver, config, step)
        await saver.aput_writes(stored, [("ch", step)], f"task-{step}")
        config = root("bounded", stored["configurable"]["checkpoint_id"])
    kept = [t async for t in saver.alist(root("bounded"))]
    assert [t.metadata["step"] for t in kept] == [5, 4, 3]
    assert [w[2] for w in kept[0].pending_writes] == [5]


async def test_user_isolation_applies(backend: Backend) -> None:
    saver = TenxCheckpointSaver(await backend.make())
    await put(saver, root("private", user_id="alice"), 0)
    assert await saver.aget_tuple(root("private", user_id="alice")) is not None
    assert await saver.aget_tuple(root("private", user_id="mallory")) is None
    assert [t async for t in saver.alist(root("private", user_id="mallory"))] == []
    with pytest.raises(ThreadOwnershipError):
        await put(saver, root("private", user_id="mallory"), 1)


class Steps(TypedDict):
    steps: Annotated[list[str], operator.add]


async def test_a_graph_resumes_after_a_crash(backend: Backend) -> None:
    ran: list[str] = []

    def plan(state: Steps) -> dict[str, list[str]]:
        ran.append("plan")
        return {"steps": ["plan"]}

    def act(state: Steps) -> dict[str, list[str]]:
        ran.append("act")
        if ran.count("act") == 1:
            raise RuntimeError("the worker died")
        return {"steps": ["act"]}

    saver = TenxCheckpointSaver(await backend.make(enforce_user_isolation=False))
    graph = (
        StateGraph(Steps)
        .add_node("plan", plan)
        .add_node("act", act)
        .add_edge(START, "plan")
        .add_edge("plan", "act")
        .add_edge("act", END)
        .compile(checkpointer=saver)
    )
    config = {"configurable": {"thread_id": "graph"}}
    with pytest.raises(RuntimeError):
        await graph.ainvoke({"steps": []}, config)
    result = await graph.ainvoke(None, config)  # resume from the last checkpoint
    assert result == {"steps": ["plan", "act"]}
    assert ran == ["plan", "act", "act"]  # plan was not run again
