"""ReplaySafeToolNode: a graph's tool calls run once, through the tool ledger.

A tool that charges a card is the example throughout: it appends to a list (or, in a
process of its own, to a file), so "charged once" is a count, not a hope.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command

from tenxstore import (
    ConfigError,
    InMemoryCheckpointer,
    StaleStateError,
    ThreadOwnershipError,
    ToolExecutionInProgress,
)
from tenxstore.langgraph import ReplaySafeToolNode, TenxCheckpointSaver
from tests import procs
from tests.conftest import Backend, backend_for


class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    paid: bool


def asks(*calls: tuple[str, dict[str, Any], str]) -> Callable[[Chat], Chat]:
    """A model node that asks for these tool calls (name, args, id)."""

    def model(state: Chat) -> Chat:
        return {
            "messages": [
                AIMessage(
                    "",
                    tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in calls],
                )
            ]
        }

    return model


def graph_of(
    node: ReplaySafeToolNode, saver: TenxCheckpointSaver, model: Any, *, pause: bool = False
) -> Any:
    """model -> tools -> end (``pause``: interrupted before the tools)."""
    return (
        StateGraph(Chat)
        .add_node("model", model)
        .add_node("tools", node)
        .add_edge(START, "model")
        .add_edge("model", "tools")
        .add_edge("tools", END)
        .compile(checkpointer=saver, interrupt_before=["tools"] if pause else None)
    )


def run(thread: str = "t", user: str = "alice") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "user_id": user}}


async def before_tools(graph: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The config of the checkpoint just before the tools ran (to travel back to)."""
    history = [s async for s in graph.aget_state_history(config)]
    return next(s for s in history if s.next == ("tools",)).config  # type: ignore[no-any-return]


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_call_runs_once_across_replays_and_answers_as_it_did(
    backend: Backend, sync: bool
) -> None:
    """Time travel to the checkpoint before the tools, twice: the card is charged
    once, and every run's ToolMessage is the first one's (content and artifact)."""
    charges: list[int] = []

    @tool(response_format="content_and_artifact")
    def charge(amount: int) -> tuple[str, dict[str, Any]]:
        """Charge the card."""
        charges.append(amount)
        return f"charged {amount}", {"receipt": len(charges)}

    saver = TenxCheckpointSaver(await backend.make())
    graph = graph_of(
        ReplaySafeToolNode([charge], saver), saver, asks(("charge", {"amount": 5}, "c1"))
    )

    async def invoke(value: Any, config: dict[str, Any]) -> Any:
        if sync:
            return await asyncio.to_thread(graph.invoke, value, config)
        return await graph.ainvoke(value, config)

    first = await invoke({"messages": [HumanMessage("pay")]}, run())
    back = await before_tools(graph, run())
    for _ in range(2):
        again = await invoke(None, back)
        said = again["messages"][-1]
        assert isinstance(said, ToolMessage)
        assert (said.content, said.artifact) == ("charged 5", {"receipt": 1})
    assert charges == [5]
    assert first["messages"][-1].artifact == {"receipt": 1}
    record = await saver.checkpointer.aget_tool_execution(
        {"thread_id": "t", "user_id": "alice"}, "c1"
    )
    assert record is not None and (record.status, record.attempts) == ("succeeded", 1)
    assert record.result["content"] == "charged 5"  # readable by operators


async def test_parallel_calls_in_one_message_each_run_once(backend: Backend) -> None:
    done: list[str] = []

    @tool
    async def send(to: str) -> str:
        """Send a message."""
        done.append(to)
        return f"sent to {to}"

    saver = TenxCheckpointSaver(await backend.make())
    model = asks(("send", {"to": "a"}, "s1"), ("send", {"to": "b"}, "s2"))
    graph = graph_of(ReplaySafeToolNode([send], saver), saver, model)
    out = await graph.ainvoke({"messages": [HumanMessage("go")]}, run())
    await graph.ainvoke(None, await before_tools(graph, run()))
    assert sorted(done) == ["a", "b"]
    assert sorted(m.content for m in out["messages"] if isinstance(m, ToolMessage)) == [
        "sent to a",
        "sent to b",
    ]


async def test_a_failing_call_is_recorded_and_runs_again_on_the_next_run(
    backend: Backend,
) -> None:
    """A raised error fails the run (ToolNode's default for a tool's own error); an
    error ToolNode turns into a message (handle_tool_errors) is the node's output.
    Either way the call is recorded as failed, and the next run of it runs again."""
    tries: list[int] = []

    @tool
    def flaky(n: int) -> str:
        """Fail the first two times."""
        tries.append(n)
        if len(tries) < 3:
            raise RuntimeError(f"down ({len(tries)})")
        return "up"

    saver = TenxCheckpointSaver(await backend.make())
    raising = graph_of(ReplaySafeToolNode([flaky], saver), saver, asks(("flaky", {"n": 1}, "f1")))
    with pytest.raises(RuntimeError, match="down \\(1\\)"):
        await raising.ainvoke({"messages": [HumanMessage("try")]}, run())
    messages = graph_of(
        ReplaySafeToolNode([flaky], saver, handle_tool_errors=True),
        saver,
        asks(("flaky", {"n": 1}, "f1")),
    )
    back = await before_tools(messages, run())
    said = (await messages.ainvoke(None, back))["messages"][-1]
    assert said.status == "error" and "down (2)" in said.content
    said = (await messages.ainvoke(None, back))["messages"][-1]
    assert (said.status, said.content) == ("success", "up")
    said = (await messages.ainvoke(None, back))["messages"][-1]
    assert said.content == "up" and len(tries) == 3  # stored: not run a fourth time
    record = await saver.checkpointer.aget_tool_execution(
        {"thread_id": "t", "user_id": "alice"}, "f1"
    )
    assert record is not None and (record.status, record.attempts) == ("succeeded", 3)


async def test_two_workers_on_one_thread_run_the_call_once(backend: Backend) -> None:
    """Two runs resume the thread from the same checkpoint at once: one runs the
    tool, the other waits for its outcome and answers with it (one of the two runs
    is then refused at its checkpoint, as two runs from one head always are)."""
    charges: list[int] = []
    entered: list[str] = []
    both_in = asyncio.Event()

    @tool
    async def charge(amount: int) -> str:
        """Charge the card."""
        await both_in.wait()  # the other worker is at this call too
        charges.append(amount)
        return f"charged {amount}"

    async def count_in(request: Any, once: Callable[[Any], Awaitable[Any]]) -> Any:
        entered.append(request.tool_call["id"])
        if len(entered) == 2:
            both_in.set()
        return await once(request)

    saver = TenxCheckpointSaver(await backend.make())
    node = ReplaySafeToolNode([charge], saver, awrap_tool_call=count_in)
    graph = graph_of(node, saver, asks(("charge", {"amount": 7}, "c1")), pause=True)
    await graph.ainvoke({"messages": [HumanMessage("pay")]}, run())
    outcomes = await asyncio.gather(
        graph.ainvoke(None, run()), graph.ainvoke(None, run()), return_exceptions=True
    )
    assert charges == [7] and len(entered) == 2
    answers = [o for o in outcomes if not isinstance(o, BaseException)]
    assert all(isinstance(o, StaleStateError) for o in outcomes if o not in answers), outcomes
    assert answers and all(a["messages"][-1].content == "charged 7" for a in answers)


async def test_a_call_another_worker_holds_is_waited_for_then_refused(
    backend: Backend,
) -> None:
    saver = TenxCheckpointSaver(await backend.make())
    charges: list[int] = []

    @tool
    def charge(amount: int) -> str:
        """Charge the card."""
        charges.append(amount)
        return "charged"

    graph = graph_of(
        ReplaySafeToolNode([charge], saver, wait_timeout=0.05),
        saver,
        asks(("charge", {"amount": 1}, "c1")),
        pause=True,
    )
    await graph.ainvoke({"messages": [HumanMessage("pay")]}, run())
    # another worker claimed the call and is running it (its lease is live)
    claim = await saver.checkpointer.abegin_tool_execution(
        {"thread_id": "t", "user_id": "alice"}, "c1", "charge", {"amount": 1}
    )
    assert claim.status == "started"
    with pytest.raises(ToolExecutionInProgress):
        await graph.ainvoke(None, run())
    assert charges == []


async def test_a_tool_that_returns_a_command_is_replayed_as_that_command(
    backend: Backend,
) -> None:
    runs: list[int] = []

    @tool
    def settle(amount: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> Any:
        """Settle and mark the state paid."""
        runs.append(amount)
        return Command(
            update={
                "paid": True,
                "messages": [ToolMessage(f"settled {amount}", tool_call_id=tool_call_id)],
            }
        )

    saver = TenxCheckpointSaver(await backend.make())
    graph = graph_of(
        ReplaySafeToolNode([settle], saver), saver, asks(("settle", {"amount": 3}, "s1"))
    )
    await graph.ainvoke({"messages": [HumanMessage("settle")]}, run())
    again = await graph.ainvoke(None, await before_tools(graph, run()))
    assert runs == [3]
    assert again["paid"] is True and again["messages"][-1].content == "settled 3"


async def test_another_user_cannot_read_a_stored_result(backend: Backend) -> None:
    saver = TenxCheckpointSaver(await backend.make())
    secrets: list[str] = []

    @tool
    def lookup(q: str) -> str:
        """Look up a secret."""
        secrets.append(q)
        return "alice's secret"

    graph = graph_of(
        ReplaySafeToolNode([lookup], saver), saver, asks(("lookup", {"q": "pin"}, "l1"))
    )
    await graph.ainvoke({"messages": [HumanMessage("pin?")]}, run())
    # eve's own graph (no checkpointer of its own) asks alice's thread for the call
    eve = (
        StateGraph(Chat)
        .add_node("tools", ReplaySafeToolNode([lookup], saver.checkpointer))
        .add_edge(START, "tools")
        .add_edge("tools", END)
        .compile()
    )
    call = AIMessage("", tool_calls=[{"name": "lookup", "args": {"q": "pin"}, "id": "l1"}])
    with pytest.raises(ThreadOwnershipError):
        await eve.ainvoke({"messages": [call]}, run("t", "eve"))
    assert secrets == ["pin"]


async def test_a_thread_erased_during_the_step_gets_no_tool_call(backend: Backend) -> None:
    """The thread is erased after its run started and before the call is made: the
    call is refused (StaleStateError: the run read another life), the tool does not
    run, and nothing of the thread is made again (a ledger claim used to re-create it,
    with the tool's arguments and result, for the erased user)."""
    saver = TenxCheckpointSaver(await backend.make())
    charges: list[int] = []
    erase = False

    @tool
    def charge(amount: int) -> str:
        """Charge the card."""
        charges.append(amount)
        return "charged"

    async def erase_first(request: Any, once: Callable[[Any], Awaitable[Any]]) -> Any:
        if erase:  # an operator's delete-user, between the run's read and this call
            await saver.checkpointer.aclean_thread({"thread_id": "t", "user_id": "alice"})
        return await once(request)

    def model(state: Chat) -> Chat:
        n = len(state["messages"])
        call = {"name": "charge", "args": {"amount": n}, "id": f"c{n}"}
        return {"messages": [AIMessage("", tool_calls=[call])]}

    graph = graph_of(ReplaySafeToolNode([charge], saver, awrap_tool_call=erase_first), saver, model)
    await graph.ainvoke({"messages": [HumanMessage("pay")]}, run())
    erase = True
    with pytest.raises(StaleStateError, match="deleted or replaced"):
        await graph.ainvoke({"messages": [HumanMessage("pay again")]}, run())
    assert charges == [1]
    ids = {"thread_id": "t", "user_id": "alice"}
    assert await saver.checkpointer.aget_thread(ids) is None
    assert await saver.checkpointer.aget_tool_execution(ids, "c3") is None


def test_bad_arguments_are_refused() -> None:
    @tool
    def noop() -> str:
        """Nothing."""
        return ""

    with pytest.raises(ConfigError, match="checkpointer"):
        ReplaySafeToolNode([noop], object())
    saver = TenxCheckpointSaver(InMemoryCheckpointer())  # nothing opened until used
    for bad in (-1, float("nan"), True, "1"):
        with pytest.raises(ConfigError, match="wait_timeout"):
            ReplaySafeToolNode([noop], saver, wait_timeout=bad)


# -- a worker killed after the call, before its checkpoint ---------------------------


def _charge_and_die(url: str, schema: str | None, options: dict[str, Any], marks: str) -> None:
    """A worker that runs the graph and dies once the ledger has recorded the call,
    before LangGraph stores the tools' step: the crash the ledger is for."""
    from tenxstore import CheckpointRepository

    @tool
    def charge(amount: int) -> str:
        """Charge the card."""
        with open(marks, "a") as out:
            out.write(f"{amount}\n")
        return f"charged {amount}"

    async def die_after(request: Any, once: Callable[[Any], Awaitable[Any]]) -> Any:
        await once(request)
        os._exit(17)  # the side effect happened and is recorded; the step is not

    async def main() -> None:
        repo = CheckpointRepository(url, schema=schema, **options)
        saver = TenxCheckpointSaver(repo)
        node = ReplaySafeToolNode([charge], saver, awrap_tool_call=die_after)
        graph = graph_of(node, saver, asks(("charge", {"amount": 12}, "c1")))
        # "sync": each step's checkpoint is stored before the next step runs, so the
        # model's tool call is durable before the tool is (LangGraph's default, "async",
        # may still be storing it: a crash then replays the model, whose next answer may
        # ask with another call id)
        await graph.ainvoke({"messages": [HumanMessage("pay")]}, run(), durability="sync")

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sqlite", "postgresql", "mariadb"])
async def test_a_worker_killed_after_the_call_is_resumed_without_charging_again(
    name: str, tmp_path: Path
) -> None:
    async with backend_for(name, tmp_path) as backend:
        await backend.make()  # migrated
        assert backend.url is not None
        marks = tmp_path / "charges"
        worker = procs.context().Process(
            target=_charge_and_die, args=(backend.url, backend.schema, backend.options, str(marks))
        )
        worker.start()
        await asyncio.to_thread(worker.join, 120)
        assert worker.exitcode == 17
        assert marks.read_text() == "12\n"

        @tool
        def charge(amount: int) -> str:
            """Charge the card (never, here: the call was made)."""
            raise AssertionError("charged twice")

        saver = TenxCheckpointSaver(await backend.make())
        graph = graph_of(
            ReplaySafeToolNode([charge], saver), saver, asks(("charge", {"amount": 12}, "c1"))
        )
        state = await graph.aget_state(run())
        assert state.next == ("tools",)  # the tools' step was never stored
        done = await graph.ainvoke(None, run())
        assert done["messages"][-1].content == "charged 12"
        assert marks.read_text() == "12\n"
