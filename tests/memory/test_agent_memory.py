"""The documents' agent memory: MemoryConfig's defaults, post-load retrieval, the memory
tools (the run's user's, and the agent's shared ones), and an agent that learns a
preference in one thread and uses it in another, per user, on every database."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from typing_extensions import TypedDict

from tenxstore import ConfigError, MemoryStore
from tenxstore.langgraph import MemoryConfig, TenxCheckpointSaver, TenxStore, memory_tools
from tenxstore.langgraph.memory import query_of
from tests.conftest import Backend


def of(user: str, **configurable: Any) -> dict[str, Any]:
    return {"configurable": {"user_id": user, **configurable}}


def test_the_documents_defaults_and_the_inputs_it_reads(tmp_path: Any) -> None:
    memories = MemoryStore(f"sqlite:///{tmp_path / 'm.db'}")
    memory = MemoryConfig(memories)  # a MemoryStore is enough
    assert (memory.limit, memory.score_threshold) == (5, 0.0)
    assert (memory.user_scoped_tool, memory.agent_scoped_tool) == (True, False)
    assert [t.name for t in memory.tools()] == ["save_memory", "search_memory", "delete_memory"]
    both = memory_tools(TenxStore(memories), agent_scoped_tool=True, agent_id="helper")
    assert [t.name for t in both][3:] == ["save_agent_memory", "search_agent_memory"]
    assert memory_tools(MemoryConfig(memories, user_scoped_tool=False)) == []
    assert "config" not in memory.tools()[0].tool_call_schema.model_json_schema()["properties"]
    for bad in ({"limit": -1}, {"score_threshold": 2}, {"user_scoped_tool": 1}, {"agent_id": ""}):
        with pytest.raises(ConfigError):
            MemoryConfig(memories, **bad)
    with pytest.raises(ConfigError):
        MemoryConfig(object())  # type: ignore[arg-type]
    # the query is the last user message
    chat = [HumanMessage("first"), AIMessage("reply"), HumanMessage("seat on the flight?")]
    assert query_of({"messages": chat}) == query_of(chat) == "seat on the flight?"
    assert query_of([("user", "a tuple"), ("assistant", "no")]) == "a tuple"
    assert query_of([{"role": "user", "content": [{"type": "text", "text": "blocks"}]}]) == "blocks"
    assert query_of("plain") == "plain"
    with pytest.raises(ConfigError):
        query_of(42)
    memories.close()


async def test_retrieval_is_the_users_best_matches(lg_memories: MemoryStore) -> None:
    for n in range(7):
        await lg_memories.astore("alice", f"flight note {n}" + " flight" * n, key=f"f{n}")
    await lg_memories.astore("alice", "nothing relevant", key="other")
    await lg_memories.astore("bob", "flight flight flight flight flight flight flight flight")
    memory = MemoryConfig(TenxStore(lg_memories))
    hits = await memory.aretrieve({"messages": [("user", "my flight?")]}, of("alice"))
    assert len(hits) == 5 and {h.memory.user_id for h in hits} == {"alice"}
    assert [h.memory.key for h in hits] == ["f6", "f5", "f4", "f3", "f2"]  # best first
    picky = MemoryConfig(lg_memories, score_threshold=0.9, limit=3)
    assert all(h.score >= 0.9 for h in await picky.aretrieve("flight", of("alice")))
    assert await memory.aretrieve("?!", of("alice")) == []  # no word: nothing
    text = await memory.aprompt("flight", of("alice"))
    assert text.startswith("Long-term memories") and "[f6] flight note 6" in text
    assert await memory.aprompt("unrelated", of("alice")) == ""
    assert (await asyncio.to_thread(memory.prompt, "flight", of("alice"))) == text
    with pytest.raises(ConfigError, match="no user"):
        await memory.aretrieve("flight", {"configurable": {}})


async def test_the_tools_act_for_the_runs_user(lg_memories: MemoryStore) -> None:
    memory = MemoryConfig(TenxStore(lg_memories), agent_scoped_tool=True)
    save, search, delete, save_shared, search_shared = memory.tools()
    said = await save.ainvoke({"content": "Allergic to peanuts"}, of("alice"))
    key = said.removeprefix("Saved memory ").rstrip(".")
    assert (await lg_memories.aget("alice", key)).content == "Allergic to peanuts"  # type: ignore[union-attr]
    assert key in await search.ainvoke({"query": "peanuts"}, of("alice"))
    assert await search.ainvoke({"query": "peanuts"}, of("bob")) == "No memories found."
    # the sync twins, as a sync graph's ToolNode calls them
    await asyncio.to_thread(save.invoke, {"content": "Allergic to nuts", "key": key}, of("alice"))
    assert (await lg_memories.aget("alice", key)).version == 2  # type: ignore[union-attr]
    assert await delete.ainvoke({"key": key}, of("bob")) == f"No memory {key} to delete."
    assert await asyncio.to_thread(delete.invoke, {"key": key}, of("alice")) == (
        f"Deleted memory {key}."
    )
    with pytest.raises(ConfigError, match="no user"):
        await save.ainvoke({"content": "x"}, {"configurable": {}})
    # the agent's own memories: one namespace per agent, shared by its users
    await save_shared.ainvoke({"content": "Refunds take 5 days"}, of("alice", assistant_id="desk"))
    found = await search_shared.ainvoke({"query": "refunds"}, of("bob", assistant_id="desk"))
    assert "Refunds take 5 days" in found
    other = await search_shared.ainvoke({"query": "refunds"}, of("bob", assistant_id="shop"))
    assert other == "No memories found."
    with pytest.raises(ConfigError, match="agent_id"):
        await search_shared.ainvoke({"query": "refunds"}, of("bob"))
    hits = await memory.aretrieve("refunds", of("carol", graph_id="desk"))
    assert [h.memory.content for h in hits] == ["Refunds take 5 days"]


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


async def test_an_agent_learns_in_one_thread_and_uses_it_in_another(
    store_backend: Backend,
) -> None:
    cp = await store_backend.make()
    store = TenxStore(MemoryStore(cp))
    memory = MemoryConfig(store=store)
    save = {"name": "save_memory", "args": {"content": "Prefers a window seat on every flight"}}
    model = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage("", tool_calls=[{**save, "id": "call-1"}]),
                AIMessage("Noted."),
                AIMessage("A window seat."),
                AIMessage("Any seat."),
            ]
        )
    )
    prompts: list[str] = []

    async def agent(state: State, config: RunnableConfig) -> dict[str, Any]:
        system = SystemMessage(await memory.aprompt(state, config) or "nothing known")
        prompts.append(str(system.content))
        return {"messages": [await model.ainvoke([system, *state["messages"]])]}

    graph = (
        StateGraph(State)
        .add_node("agent", agent)
        .add_node("tools", ToolNode(memory.tools()))
        .add_edge(START, "agent")
        .add_conditional_edges("agent", tools_condition)
        .add_edge("tools", "agent")
        .compile(checkpointer=TenxCheckpointSaver(cp), store=store)
    )
    told = {"messages": [("user", "I prefer a window seat on every flight.")]}
    await graph.ainvoke(told, of("alice", thread_id="a1"))
    assert prompts == ["nothing known", prompts[1]] and "window seat" in prompts[1]
    asked = {"messages": [("user", "Which seat on my flight?")]}
    answer = await graph.ainvoke(asked, of("alice", thread_id="a2"))
    assert "window seat" in prompts[-1] and answer["messages"][-1].content == "A window seat."
    await graph.ainvoke(asked, of("bob", thread_id="b1"))
    assert prompts[-1] == "nothing known"  # alice's memory never reaches bob
