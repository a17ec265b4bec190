"""Graphs whose nodes use ``store``: what one thread learns another thread of the same
user reads, sync (invoke) and async, on every database; two users with the same
namespaces never meet; a run that names no user is refused."""

from __future__ import annotations

import asyncio
import sys
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore

from tenxstore import ConfigError, MemoryStore
from tenxstore.langgraph import TenxCheckpointSaver, TenxStore
from tests.conftest import Backend


class Turn(TypedDict, total=False):
    said: str
    heard: str


def remember(state: Turn, *, store: BaseStore) -> Turn:
    """``remember X`` stores X; anything else reads what was remembered."""
    said = state["said"]
    if said.startswith("remember "):
        store.put(("prefs",), "food", {"likes": said.removeprefix("remember ")})
        return {"heard": "noted"}
    item = store.get(("prefs",), "food")
    hits = store.search(("prefs",), query="likes")
    return {"heard": f"{item.value['likes']} ({len(hits)})" if item else "nothing"}


async def aremember(state: Turn, *, store: BaseStore) -> Turn:
    said = state["said"]
    if said.startswith("remember "):
        await store.aput(("prefs",), "food", {"likes": said.removeprefix("remember ")})
        return {"heard": "noted"}
    item = await store.aget(("prefs",), "food")
    return {"heard": item.value["likes"] if item else "nothing"}


def graph_of(node: Any, cp: Any) -> Any:
    return (
        StateGraph(Turn)
        .add_node("remember", node)
        .add_edge(START, "remember")
        .add_edge("remember", END)
        .compile(checkpointer=TenxCheckpointSaver(cp), store=TenxStore(MemoryStore(cp)))
    )


def run(thread: str, user: str | None) -> dict[str, Any]:
    configurable = {"thread_id": thread}
    if user is not None:
        configurable["user_id"] = user
    return {"configurable": configurable}


async def test_a_sync_graph_remembers_per_user_across_threads(store_backend: Backend) -> None:
    graph = graph_of(remember, await store_backend.make())

    def turns() -> list[str]:
        graph.invoke({"said": "remember pizza"}, run("t1", "alice"))
        graph.invoke({"said": "remember sushi"}, run("t2", "bob"))  # the same namespace
        return [
            graph.invoke({"said": "what?"}, run("t3", "alice"))["heard"],
            graph.invoke({"said": "what?"}, run("t4", "bob"))["heard"],
            graph.invoke({"said": "what?"}, run("t5", "carol"))["heard"],
        ]

    # sync graphs run in a worker thread (the saver's sync API refuses a running loop)
    assert await asyncio.to_thread(turns) == ["pizza (1)", "sushi (1)", "nothing"]

    # a run that names no user: the node's first store call is refused, saying how
    bare = (
        StateGraph(Turn)
        .add_node("remember", remember)
        .add_edge(START, "remember")
        .add_edge("remember", END)
        .compile(store=TenxStore(MemoryStore(store_backend.made[-1])))
    )
    with pytest.raises(ConfigError, match="TenxStore has no user"):
        await asyncio.to_thread(bare.invoke, {"said": "what?"})


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="LangGraph passes the run's config to async nodes on 3.11+"
)
async def test_an_async_graph_remembers_per_user_across_threads(store_backend: Backend) -> None:
    graph = graph_of(aremember, await store_backend.make())
    await asyncio.gather(
        graph.ainvoke({"said": "remember tea"}, run("t1", "alice")),
        graph.ainvoke({"said": "remember coffee"}, run("t2", "bob")),
    )
    heard = await asyncio.gather(
        *(graph.ainvoke({"said": "?"}, run(f"n{u}", u)) for u in ("alice", "bob", "carol"))
    )
    assert [h["heard"] for h in heard] == ["tea", "coffee", "nothing"]
    # the user can come from the run's context too
    bare = (
        StateGraph(Turn)
        .add_node("remember", aremember)
        .add_edge(START, "remember")
        .add_edge("remember", END)
        .compile(store=TenxStore(MemoryStore(store_backend.made[-1])))
    )
    found = await bare.ainvoke({"said": "?"}, context={"user_id": "bob"})
    assert found["heard"] == "coffee"


async def test_a_store_bound_to_a_user_refuses_another_users_run(store_backend: Backend) -> None:
    cp = await store_backend.make()
    graph = (
        StateGraph(Turn)
        .add_node("remember", aremember)
        .add_edge(START, "remember")
        .add_edge("remember", END)
        .compile(
            checkpointer=TenxCheckpointSaver(cp),
            store=TenxStore(MemoryStore(cp), user_id="alice"),
        )
    )
    await graph.ainvoke({"said": "remember figs"}, run("t1", "alice"))
    assert (await graph.ainvoke({"said": "?"}, run("t2", "alice")))["heard"] == "figs"
    if sys.version_info >= (3, 11):  # the node sees bob's run config only there
        with pytest.raises(ConfigError, match="acts for user 'alice'"):
            await graph.ainvoke({"said": "?"}, run("t3", "bob"))
