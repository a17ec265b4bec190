"""Mem0Store as TenxStore's backing store: a LangGraph graph's long-term memory in
Mem0 (offline: local Qdrant, the test embedding, no LLM, no socket), per user across
threads; the ops as LangGraph's InMemoryStore gives them (scores and query order
aside); TTLs refreshed on read; and what it does not support, refused by name."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest

os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

from tenxstore import ConfigError
from tenxstore.langgraph import MemoryConfig, TenxStore
from tenxstore.memory.mem0 import Mem0Store, local_mem0
from tests import services
from tests.memory.embeddings import HashingEmbedding


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any socket connection fails the test (SQLite and local Qdrant need none); and
    mem0 is required (the ``mem0`` extra: a failure under CI, else a skip)."""
    services.require_modules("mem0", "mem0")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a network connection was attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


@pytest.fixture
async def mem0_store(tmp_path: Path) -> AsyncIterator[Mem0Store]:
    memory = local_mem0(tmp_path / "qdrant", embedding=HashingEmbedding())
    store = Mem0Store(memory, infer=False)
    yield store
    assert memory.llm.calls == 0
    await store.aclose()


class Turn(TypedDict, total=False):
    said: str
    heard: str


def remember(state: Turn, *, store: BaseStore) -> Turn:
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


def graph_of(node: Any, store: Any) -> Any:
    return (
        StateGraph(Turn)
        .add_node("remember", node)
        .add_edge(START, "remember")
        .add_edge("remember", END)
        .compile(checkpointer=InMemorySaver(), store=store)
    )


def run(thread: str, user: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "user_id": user}}


async def test_a_sync_graph_remembers_per_user_across_threads(mem0_store: Mem0Store) -> None:
    graph = graph_of(remember, TenxStore(mem0_store))

    def turns() -> list[str]:
        graph.invoke({"said": "remember pizza"}, run("t1", "alice"))
        graph.invoke({"said": "remember sushi"}, run("t2", "bob"))
        graph.invoke({"said": "remember pasta"}, run("t3", "alice"))  # the same item again
        return [
            graph.invoke({"said": "what?"}, run("t4", "alice"))["heard"],
            graph.invoke({"said": "what?"}, run("t5", "bob"))["heard"],
            graph.invoke({"said": "what?"}, run("t6", "carol"))["heard"],
        ]

    assert await asyncio.to_thread(turns) == ["pasta (1)", "sushi (1)", "nothing"]
    item = await mem0_store.aget("alice", "food", namespace=("prefs",))
    assert item is not None and item.version == 2


async def test_an_async_graph_remembers_per_user(mem0_store: Mem0Store) -> None:
    graph = graph_of(aremember, TenxStore(mem0_store))
    await graph.ainvoke({"said": "remember ramen"}, run("t1", "alice"))
    alice = await graph.ainvoke({"said": "what?"}, run("t2", "alice"))
    bob = await graph.ainvoke({"said": "what?"}, run("t3", "bob"))
    assert (alice["heard"], bob["heard"]) == ("ramen", "nothing")


async def test_the_ops_give_what_langgraphs_in_memory_store_gives(
    mem0_store: Mem0Store,
) -> None:
    ours = TenxStore(mem0_store, user_id="alice")
    theirs = InMemoryStore()
    for store in (ours, theirs):
        await store.aput(("docs", "a"), "1", {"text": "green tea", "n": 1})
        await store.aput(("docs", "a"), "2", {"text": "black coffee", "n": 2})
        await store.aput(("docs", "b"), "3", {"text": "green smoothie", "n": 3})
        await store.aput(("notes",), "4", {"text": "call mom"})
        await store.aput(("notes",), "5", {"text": "buy milk"})
        await store.aput(("docs", "a"), "2", {"text": "black coffee, no sugar", "n": 2})
        await store.adelete(("notes",), "4")

    async def seen(store: Any) -> Any:
        got = await store.aget(("docs", "a"), "2")
        listed = await store.asearch(("docs",), limit=10)
        filtered = await store.asearch(("docs",), filter={"n": {"$gte": 2}}, limit=10)
        queried = await store.asearch(("docs",), query="green", limit=10)
        return (
            (got.key, got.namespace, got.value),
            {(i.namespace, i.key) for i in listed},
            {i.key for i in filtered},
            {i.key for i in queried},
            await store.alist_namespaces(),
            await store.alist_namespaces(prefix=("docs",), max_depth=1),
            await store.aget(("notes",), "4"),
        )

    assert await seen(ours) == await seen(theirs)
    queried = await ours.asearch(("docs",), query="green tea", limit=2)
    assert queried[0].key == "1" and all(0 <= (i.score or 0) <= 1 for i in queried)


async def test_a_ttl_is_refreshed_on_read_without_a_new_version(mem0_store: Mem0Store) -> None:
    store = TenxStore(mem0_store, user_id="alice", ttl={"default_ttl": 1.0})
    await store.aput(("prefs",), "k", {"v": 1})
    before = await mem0_store.aget("alice", "k", namespace=("prefs",))
    assert before is not None and before.expires_at is not None
    await asyncio.sleep(0.05)
    assert await store.aget(("prefs",), "k", refresh_ttl=True) is not None
    after = await mem0_store.aget("alice", "k", namespace=("prefs",))
    assert after is not None and after.expires_at is not None
    assert after.expires_at > before.expires_at
    assert (after.version, after.updated_at) == (before.version, before.updated_at)


async def test_memory_config_retrieves_from_mem0(mem0_store: Mem0Store) -> None:
    await mem0_store.astore("alice", "I am vegetarian", key="diet")
    memory = MemoryConfig(mem0_store)
    config = run("t1", "alice")
    hits = await memory.aretrieve("any vegetarian dishes?", config)
    assert [h.memory.key for h in hits] == ["diet"]
    assert await memory.aretrieve("any vegetarian dishes?", run("t2", "bob")) == []


async def test_what_mem0_cannot_do_is_refused_by_name(mem0_store: Mem0Store) -> None:
    with pytest.raises(ConfigError, match="no index"):
        TenxStore(mem0_store, index={"embed": HashingEmbedding(), "dims": 256})
    store = TenxStore(mem0_store, user_id="alice")
    with pytest.raises(ConfigError, match="re-embed"):
        await store.areembed()
    with pytest.raises(ConfigError, match="sweep"):
        await store.asweep_ttl()
    timed = TenxStore(mem0_store, user_id="alice", ttl={"default_ttl": 1.0})
    with pytest.raises(ConfigError, match="no TTL sweeper"):
        timed.start_ttl_sweeper(1)  # not a thread that fails at every interval
    assert timed.stop_ttl_sweeper()  # none was started
