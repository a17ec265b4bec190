"""A LangGraph run names its thread or touches none; LangGraph threads move in lists.

Without a ``thread_id`` the saver read the user's newest thread and the run went on
in it: two conversations mixed, silently. Every saver call that acts on a thread now
refuses such a config before any I/O (``MissingThreadId``, a ``KeyError`` as
LangGraph's own savers raise), and a LangGraph write moves its thread's
``updated_at`` as a state write does.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command

from tenxstore import AuthPolicy, CheckpointRepository, ConfigError, MissingThreadId
from tenxstore.langgraph import TenxCheckpointSaver, ainvoke_retrying, idempotent_input
from tests.conftest import Backend


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def reply(state: Chat) -> dict[str, Any]:
    return {"messages": [AIMessage(f"reply {len(state['messages'])}")]}


def chat(saver: TenxCheckpointSaver) -> Any:
    graph = StateGraph(Chat).add_node("reply", reply)
    return graph.add_edge(START, "reply").add_edge("reply", END).compile(checkpointer=saver)


def alice(thread: str | None = None, **extra: Any) -> dict[str, Any]:
    configurable: dict[str, Any] = {"user_id": "alice", **extra}
    if thread is not None:
        configurable["thread_id"] = thread
    return {"configurable": configurable}


async def contents(graph: Any, thread: str) -> list[Any]:
    state = await graph.aget_state(alice(thread))
    return [m.content for m in state.values.get("messages", [])]


async def test_a_run_without_a_thread_writes_into_none(backend: Backend) -> None:
    cp = await backend.make()
    graph = chat(TenxCheckpointSaver(cp))
    await graph.ainvoke({"messages": [("user", "first")]}, alice("t1"))
    await graph.ainvoke({"messages": [("user", "second")]}, alice("t2"))
    before = {t: await contents(graph, t) for t in ("t1", "t2")}
    for config in (alice(), alice(thread=""), alice(checkpoint_ns="")):
        with pytest.raises(MissingThreadId) as raised:
            await graph.ainvoke({"messages": [("user", "lost?")]}, config)
        assert isinstance(raised.value, KeyError)
    assert {t: await contents(graph, t) for t in ("t1", "t2")} == before
    assert {t.thread_id for t in await cp.alist_threads({"user_id": "alice"})} == {"t1", "t2"}


def _offline() -> TenxCheckpointSaver:
    """A saver on a database nobody listens at: any I/O would raise DatabaseUnavailable."""
    return TenxCheckpointSaver(CheckpointRepository("postgresql://127.0.0.1:1/nowhere"))


NAMELESS = [
    None,
    {},
    {"configurable": {}},
    {"configurable": {"thread_id": None, "user_id": "alice"}},
    {"configurable": {"thread_id": "", "user_id": "alice"}},
    {"configurable": {"user_id": "alice", "checkpoint_ns": "", "checkpoint_id": "1"}},
    {"thread_id": "t1", "configurable": {"user_id": "alice"}},
    {"metadata": {"thread_id": "t1"}, "configurable": {"user_id": "alice"}},
]


@pytest.mark.parametrize("config", NAMELESS, ids=repr)
async def test_every_saver_call_on_a_thread_needs_one_before_any_io(config: Any) -> None:
    saver = _offline()
    checkpoint = empty_checkpoint()
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: saver.aget_tuple(config),
        lambda: saver.aput(config, checkpoint, {}, {}),
        lambda: saver.aput_writes(config, [("ch", 1)], "task"),
        lambda: saver.aget_delta_channel_history(config=config, channels=["ch"]),
    ]
    for call in calls:
        with pytest.raises(MissingThreadId) as raised:
            await call()
    if config and "thread_id" in config:  # LangGraph reads configurable only
        assert "config['thread_id'] is not where LangGraph reads it" in str(raised.value)


async def test_thread_arguments_and_listings_that_name_no_thread() -> None:
    saver = _offline()
    operator = TenxCheckpointSaver(
        saver.checkpointer, auth_policy=AuthPolicy(enforce_user_isolation=False)
    )
    for thread in (None, ""):
        for call in (
            operator.adelete_thread(thread),  # type: ignore[arg-type]
            operator.acopy_thread(thread, "t2"),  # type: ignore[arg-type]
            operator.acopy_thread("t1", thread),  # type: ignore[arg-type]
            operator.aprune([thread]),  # type: ignore[list-item]
        ):
            with pytest.raises(MissingThreadId):
                await call
        with pytest.raises(MissingThreadId):  # a thread key with no thread is a mistake
            [t async for t in saver.alist({"configurable": {"thread_id": thread}})]
    with pytest.raises(ConfigError, match="not one str"):  # not threads "t" and "1"
        await operator.aprune("t1")
    with pytest.raises(MissingThreadId):  # the synchronous twins too
        await asyncio.to_thread(saver.get_tuple, {"configurable": {"user_id": "alice"}})


async def test_a_langgraph_write_moves_the_threads_updated_at(backend: Backend) -> None:
    cp = await backend.make()
    graph = chat(TenxCheckpointSaver(cp))
    await graph.ainvoke({"messages": [("user", "a")]}, alice("older"))
    await graph.ainvoke({"messages": [("user", "b")]}, alice("newer"))
    created = await cp.aget_thread({"thread_id": "older", "user_id": "alice"})
    assert [t.thread_id for t in await cp.alist_threads({"user_id": "alice"})] == [
        "newer",
        "older",
    ]
    await graph.ainvoke({"messages": [("user", "again")]}, alice("older"))  # the hot path
    listed = await cp.alist_threads({"user_id": "alice"})
    assert [t.thread_id for t in listed] == ["older", "newer"]
    assert created is not None and listed[0].updated_at > created.updated_at
    assert listed[0].created_at == created.created_at and listed[0].version == 0


async def test_runs_that_start_together_store_each_message_once(backend: Backend) -> None:
    """Eight runs of one thread start together, each with one user message given as a
    (role, text) tuple — no id. Refused runs go again through ainvoke_retrying: in the
    end every message is in the thread exactly once, none lost, none twice (sent again
    as they were, a refused run's message was stored twice whenever the run that won
    had taken it in: 1-2 a round of 20)."""
    cp = await backend.make()
    graph = chat(TenxCheckpointSaver(cp))

    class Tries:  # the graph, counting the runs ainvoke_retrying makes
        channels = graph.channels
        made = 0

        async def ainvoke(self, *args: Any, **kwargs: Any) -> Any:
            Tries.made += 1
            return await graph.ainvoke(*args, **kwargs)

    for round_ in range(2):
        config = alice(f"race-{round_}")
        await asyncio.gather(
            *(
                ainvoke_retrying(Tries(), {"messages": [("user", f"m{i}")]}, config)
                for i in range(8)
            )
        )
        state = await graph.aget_state(config)
        humans = [m.content for m in state.values["messages"] if m.type == "human"]
        assert sorted(humans) == [f"m{i}" for i in range(8)], humans
        assert len({m.id for m in state.values["messages"]}) == len(state.values["messages"])
    assert Tries.made > 2 * 8  # runs were refused and went again: the race took place


class Tally(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: Annotated[list[str], operator.add]
    topic: str


async def test_an_input_that_would_be_added_twice_is_refused_before_running(
    backend: Backend,
) -> None:
    cp = await backend.make()
    graph = (
        StateGraph(Tally)
        .add_node("reply", reply)
        .add_edge(START, "reply")
        .add_edge("reply", END)
        .compile(checkpointer=TenxCheckpointSaver(cp))
    )
    with pytest.raises(ConfigError, match="'turns'"):
        await ainvoke_retrying(graph, {"turns": ["x"]}, alice("t"))
    assert await graph.aget_state(alice("t")) is not None
    assert await cp.aget_thread({"thread_id": "t", "user_id": "alice"}) is None  # not run
    done = await ainvoke_retrying(
        graph, {"messages": "hi", "topic": "weather"}, alice("t"), attempts=1
    )
    assert [m.content for m in done["messages"]] == ["hi", "reply 1"] and done["topic"] == "weather"
    assert all(m.id for m in done["messages"])
    assert idempotent_input(graph, None) is None
    resume = Command(resume=1)
    assert idempotent_input(graph, resume) is resume
    with pytest.raises(ConfigError, match="at least 1"):
        await ainvoke_retrying(graph, {"messages": "hi"}, alice("t"), attempts=0)
    given = HumanMessage("mine")
    prepared = idempotent_input(graph, {"messages": [given]})
    assert given.id is None and prepared["messages"][0].id  # the caller's object unchanged
