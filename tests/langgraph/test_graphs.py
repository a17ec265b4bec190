"""Real LangGraph graphs on TenxCheckpointSaver, every backend: sync and async APIs,
interrupts, time travel and forks, two runs from one head, subgraphs and fan-out."""

from __future__ import annotations

import asyncio
import operator
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.channels import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt

from tenxstore import StaleStateError
from tenxstore.langgraph import TenxCheckpointSaver
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parents[2]


class Chat(TypedDict):
    turns: Annotated[list[str], operator.add]


def chat_graph(saver: Any) -> Any:
    def reply(state: Chat) -> dict[str, list[str]]:  # sync: the sync API can run it too
        return {"turns": [f"reply {len(state['turns'])}"]}

    return (
        StateGraph(Chat)
        .add_node("reply", reply)
        .add_edge(START, "reply")
        .add_edge("reply", END)
        .compile(checkpointer=saver)
    )


def run(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


async def saver_for(backend: Backend) -> TenxCheckpointSaver:
    """Isolation on, as in production: the saver acts for one user."""
    return TenxCheckpointSaver(await backend.make()).for_user("alice")


async def test_configs_round_trip_under_isolation(backend: Backend) -> None:
    graph = chat_graph(await saver_for(backend))
    for text in ("hi", "again"):
        await graph.ainvoke({"turns": [text]}, run("t"))
    history = [s async for s in graph.aget_state_history(run("t"))]
    assert len(history) >= 4
    for snapshot in history:
        assert snapshot.config["configurable"]["user_id"] == "alice"
        again = await graph.aget_state(snapshot.config)  # accepted back as it came
        assert again.values == snapshot.values
        if snapshot.parent_config is not None:
            assert snapshot.parent_config["configurable"]["user_id"] == "alice"
            await graph.aget_state(snapshot.parent_config)


async def time_travel(graph: Any) -> list[Any]:
    """Replays and a fork from old checkpoints; what a user sees at each step."""
    seen: list[Any] = []
    await graph.ainvoke({"turns": ["one"]}, run("t"))
    await graph.ainvoke({"turns": ["two"]}, run("t"))
    history = [s async for s in graph.aget_state_history(run("t"))]
    seen.append([(s.values, s.next) for s in history])
    after_reply = next(s for s in history if s.values.get("turns") == ["one", "reply 1"])
    seen.append(await graph.ainvoke(None, after_reply.config))
    before_reply = next(s for s in history if s.values.get("turns") == ["one"])
    seen.append(await graph.ainvoke(None, before_reply.config))  # the reply runs again
    seen.append((await graph.aget_state(run("t"))).values)
    forked = await graph.aupdate_state(after_reply.config, {"turns": ["edited"]})
    seen.append((await graph.aget_state(forked)).values)
    seen.append((await graph.aget_state(run("t"))).values)
    seen.append(await graph.ainvoke({"turns": ["three"]}, run("t")))
    seen.append(len([s async for s in graph.aget_state_history(run("t"))]))
    return seen


async def test_time_travel_and_forks_behave_as_on_langgraphs_own_saver(backend: Backend) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    expected = await time_travel(chat_graph(InMemorySaver()))  # type: ignore[arg-type]
    assert await time_travel(chat_graph(await saver_for(backend))) == expected


class Gate:
    """Lets tasks on once ``parties`` of them have arrived (asyncio.Barrier is 3.11+)."""

    def __init__(self, parties: int) -> None:
        self.parties, self.arrived, self.open = parties, 0, asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived >= self.parties:
            self.open.set()
        await self.open.wait()


class ReadTogether(TenxCheckpointSaver):
    """Makes two runs read the head before either writes: a race, on cue."""

    gate: Gate | None = None

    async def aget_tuple(self, config: Any) -> Any:
        found = await super().aget_tuple(config)
        if self.gate is not None:
            await self.gate.wait()
        return found


async def test_two_runs_from_one_head_cannot_both_commit(backend: Backend) -> None:
    saver = ReadTogether(await backend.make()).for_user("alice")
    graph = chat_graph(saver)
    await graph.ainvoke({"turns": ["one"]}, run("t"))
    saver.gate = Gate(2)
    outcomes = await asyncio.gather(
        *(graph.ainvoke({"turns": [x]}, run("t")) for x in "ab"), return_exceptions=True
    )
    saver.gate = None
    refused = [o for o in outcomes if isinstance(o, StaleStateError)]
    assert len(refused) == 1, outcomes
    assert "another run committed" in str(refused[0])
    history = [s async for s in graph.aget_state_history(run("t"))]
    parents = [s.parent_config["configurable"]["checkpoint_id"] for s in history[:-1]]
    assert len(set(parents)) == len(parents)  # a line, not a fork


async def test_two_runs_that_found_the_thread_empty_cannot_both_commit(
    backend: Backend,
) -> None:
    saver = ReadTogether(await backend.make()).for_user("alice")
    graph = chat_graph(saver)
    saver.gate = Gate(2)
    outcomes = await asyncio.gather(
        *(graph.ainvoke({"turns": [x]}, run("new")) for x in "ab"), return_exceptions=True
    )
    saver.gate = None
    refused = [o for o in outcomes if isinstance(o, StaleStateError)]
    assert len(refused) == 1, outcomes
    assert "found the thread empty" in str(refused[0])
    (done,) = [o for o in outcomes if not isinstance(o, BaseException)]
    assert (await graph.aget_state(run("new"))).values == done  # the winner's turn is there
    history = [s async for s in graph.aget_state_history(run("new"))]
    assert sum(s.parent_config is None for s in history) == 1  # one root: a line


async def invoke_interrupting(graph: Any, payload: Any, config: Any) -> Any:
    """``graph.ainvoke`` for a run that calls ``interrupt()``. On Python 3.10
    LangGraph's interrupt() cannot find its config in async code (it needs 3.11), so
    there the run goes through the sync API in a worker thread: the same saver, whose
    sync methods run on its own loop."""
    if sys.version_info >= (3, 11):
        return await graph.ainvoke(payload, config)
    return await asyncio.to_thread(graph.invoke, payload, config)


async def test_interrupt_and_resume(backend: Backend) -> None:
    def ask(state: Chat) -> dict[str, list[str]]:
        answer = interrupt("approve?")
        return {"turns": [f"approved: {answer}"]}

    graph = (
        StateGraph(Chat)
        .add_node("ask", ask)
        .add_edge(START, "ask")
        .add_edge("ask", END)
        .compile(checkpointer=await saver_for(backend))
    )
    paused = await invoke_interrupting(graph, {"turns": ["start"]}, run("t"))
    assert paused["__interrupt__"][0].value == "approve?"
    done = await invoke_interrupting(graph, Command(resume="yes"), run("t"))
    assert done == {"turns": ["start", "approved: yes"]}


class Fan(TypedDict):
    items: list[str]
    done: Annotated[list[str], operator.add]


async def test_send_fan_out_and_a_subgraph(backend: Backend) -> None:
    inner = (
        StateGraph(Fan)
        .add_node("mark", lambda s: {"done": ["inner"]})
        .add_edge(START, "mark")
        .add_edge("mark", END)
        .compile()
    )

    def work(item: dict[str, str]) -> dict[str, list[str]]:
        return {"done": [item["item"]]}

    graph = (
        StateGraph(Fan)
        .add_node("inner", inner)
        .add_node("work", work)
        .add_conditional_edges(
            "inner", lambda s: [Send("work", {"item": i}) for i in s["items"]], ["work"]
        )
        .add_edge(START, "inner")
        .add_edge("work", END)
        .compile(checkpointer=await saver_for(backend))
    )
    result = await graph.ainvoke({"items": ["a", "b", "c"], "done": []}, run("t"))
    assert sorted(result["done"]) == ["a", "b", "c", "inner"]
    assert (await graph.aget_state(run("t"))).values == result


async def test_sync_calls_from_a_worker_thread(backend: Backend) -> None:
    graph = chat_graph(await saver_for(backend))

    def sync_use() -> tuple[dict[str, Any], int]:
        result = graph.invoke({"turns": ["hi"]}, run("t"))
        history = list(graph.get_state_history(run("t")))
        graph.update_state(run("t"), {"turns": ["edited"]})
        return result, len(history)

    result, history = await asyncio.to_thread(sync_use)
    assert result == {"turns": ["hi", "reply 1"]} and history >= 3
    assert (await graph.aget_state(run("t"))).values["turns"][-1] == "edited"


async def test_a_sync_call_inside_the_running_loop_says_what_to_do(backend: Backend) -> None:
    graph = chat_graph(await saver_for(backend))
    with pytest.raises(RuntimeError, match="aget_tuple"):
        graph.get_state(run("t"))


def test_a_sync_graph_in_a_plain_program(tmp_path: Path) -> None:
    code = f"""
import operator, sys
from typing import Annotated, TypedDict
sys.path.insert(0, {str(ROOT)!r})
from langgraph.graph import END, START, StateGraph
from tenxstore import SqliteCheckpointer
from tenxstore.langgraph import TenxCheckpointSaver

class Chat(TypedDict):
    turns: Annotated[list[str], operator.add]

cp = SqliteCheckpointer({str(tmp_path / "sync.db")!r}, enforce_user_isolation=False)
cp.setup()
graph = (
    StateGraph(Chat)
    .add_node("reply", lambda s: {{"turns": [f"reply {{len(s['turns'])}}"]}})
    .add_edge(START, "reply").add_edge("reply", END)
    .compile(checkpointer=TenxCheckpointSaver(cp))
)
config = {{"configurable": {{"thread_id": "t"}}}}
for text in ("hi", "again"):
    graph.invoke({{"turns": [text]}}, config)
history = list(graph.get_state_history(config))
print(graph.get_state(config).values["turns"], len(history))
"""
    done = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("]")[0] + "]" == "['hi', 'reply 1', 'again', 'reply 3']"


async def test_a_graphs_thread_moves_with_copy_export_and_import(
    tmp_path: Path, pg_url: str, pg_schema: str
) -> None:
    """`tenxstore copy` SQLite -> PostgreSQL carries the LangGraph checkpoints and writes
    (and verifies them): the same graph on the destination shows the same state and
    history; export and import of the file round-trip them too."""
    import tenxstore

    source = tenxstore.SqliteCheckpointer(tmp_path / "lg.db", enforce_user_isolation=False)
    await source.asetup()
    graph = chat_graph(TenxCheckpointSaver(source))
    for text in ("one", "two"):
        await graph.ainvoke({"turns": [text]}, run("t"))
    before = [(s.values, s.next) async for s in graph.aget_state_history(run("t"))]
    await source.aclose()
    tenx = str(Path(sys.executable).with_name("tenxstore"))
    source_url = f"sqlite:///{tmp_path / 'lg.db'}"
    command = [tenx, "copy", source_url, pg_url, "--destination-schema", pg_schema]
    copied = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, check=False
    )
    assert copied.returncode == 0, copied.stderr
    destination = tenxstore.CheckpointRepository(
        pg_url, schema=pg_schema, enforce_user_isolation=False
    )
    try:
        moved = chat_graph(TenxCheckpointSaver(destination))
        after = [(s.values, s.next) async for s in moved.aget_state_history(run("t"))]
        assert after == before and len(after) >= 6
        export = await destination.aexport_thread({"thread_id": "t"})
        assert export is not None and len(export.langgraph_checkpoints) == len(before)
        dump = tmp_path / "t.jsonl"
        from tenxstore import archive

        assert await archive.export_threads(destination, dump, ["t"]) == 1
        await destination.aclean_thread({"thread_id": "t"})
        assert (await archive.import_file(destination, dump))["created"] == 1
        again = [(s.values, s.next) async for s in moved.aget_state_history(run("t"))]
        assert again == before
        result = await moved.ainvoke({"turns": ["three"]}, run("t"))  # and it goes on
        assert result["turns"][-2:] == ["three", "reply 5"]
    finally:
        await destination.aclose()


def _extend(state: list[str], writes: Any) -> list[str]:
    out = list(state or [])
    for write in writes:
        out.extend(write)
    return out


class Delta(TypedDict):
    turns: Annotated[list[str], DeltaChannel(_extend)]


async def delta_chat(saver: Any, turns: int) -> list[Any]:
    graph = (
        StateGraph(Delta)
        .add_node("reply", lambda state: {"turns": [f"reply {len(state['turns'])}"]})
        .add_edge(START, "reply")
        .add_edge("reply", END)
        .compile(checkpointer=saver)
    )
    seen = []
    for turn in range(turns):
        seen.append(await graph.ainvoke({"turns": [f"say {turn}"]}, run("t")))
    history = [s async for s in graph.aget_state_history(run("t"))]
    seen.append([(s.values, s.next) for s in history])
    return seen


async def test_delta_channel_graphs_under_isolation(backend: Backend) -> None:
    """LangGraph's DeltaChannel rebuilds a channel from the ancestors' writes: the same
    values as on LangGraph's own saver, with the parent walk, the writes and the
    seed's value in one statement."""
    from langgraph.checkpoint.memory import InMemorySaver

    expected = await delta_chat(InMemorySaver(), 12)
    saver = await saver_for(backend)
    assert await delta_chat(saver, 12) == expected
    cp = saver.checkpointer
    repository = getattr(cp, "inner", cp)
    if hasattr(repository, "backend"):
        sent: list[str] = []
        remove = repository.backend.on_statement(sent.append)
        try:
            history = await saver.aget_delta_channel_history(config=run("t"), channels=["turns"])
        finally:
            remove()
        assert len(history["turns"]["writes"]) >= 12
        assert [s for s in sent if s != "BEGIN"] == sent[-1:], sent  # ONE statement


class Snapshots(TypedDict):
    turns: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=3)]


async def snapshotting_chat(saver: Any, turns: int) -> Any:
    """A DeltaChannel graph that snapshots its channel every third update."""
    graph = (
        StateGraph(Snapshots)
        .add_node("reply", lambda state: {"turns": [f"reply {len(state['turns'])}"]})
        .add_edge(START, "reply")
        .add_edge("reply", END)
        .compile(checkpointer=saver)
    )
    for turn in range(turns):
        await graph.ainvoke({"turns": [f"say {turn}"]}, run("t"))
    return graph


async def test_bounded_history_keeps_a_delta_channel_graph_whole(backend: Backend) -> None:
    """A DeltaChannel graph's values are rebuilt from its ancestors' writes: pruning
    (by history_limit) leaves its namespace whole, and aprune(keep_latest) refuses it
    as LangGraph's own savers do; the history reads as on LangGraph's saver."""
    from langgraph.checkpoint.memory import InMemorySaver

    reference = await snapshotting_chat(InMemorySaver(), 13)
    expected = [(s.values, s.next) async for s in reference.aget_state_history(run("t"))]
    saver = TenxCheckpointSaver(await backend.make(), history_limit=2).for_user("alice")
    graph = await snapshotting_chat(saver, 13)
    history = [(s.values, s.next) async for s in graph.aget_state_history(run("t"))]
    assert history == expected
    with pytest.raises(NotImplementedError, match="DeltaChannel"):
        await saver.aprune(["t"], strategy="keep_latest")
    assert [(s.values, s.next) async for s in graph.aget_state_history(run("t"))] == expected


class TwoDeltas(TypedDict):
    turns: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=3)]
    notes: Annotated[list[str], DeltaChannel(_extend)]


async def two_deltas(saver: Any) -> list[Any]:
    """A graph of two DeltaChannels (one snapshotting every third update, one never in
    these turns), with a fork from an earlier checkpoint: every checkpoint's history."""
    graph = (
        StateGraph(TwoDeltas)
        .add_node("reply", lambda s: {"turns": [f"reply {len(s['turns'])}"], "notes": ["n"]})
        .add_edge(START, "reply")
        .add_edge("reply", END)
        .compile(checkpointer=saver)
    )
    for turn in range(7):
        await graph.ainvoke({"turns": [f"say {turn}"]}, run("t"))
    states = [s async for s in graph.aget_state_history(run("t"))]
    await graph.ainvoke({"turns": ["forked"], "notes": ["f"]}, states[9].config)
    histories = []
    async for state in graph.aget_state_history(run("t")):
        found = await saver.aget_delta_channel_history(
            config=state.config, channels=["turns", "notes"]
        )
        histories.append(
            {
                channel: (
                    [(task, ch, value) for task, ch, value in entry["writes"]],
                    getattr(entry.get("seed"), "value", entry.get("seed")),
                )
                for channel, entry in found.items()
            }
        )
    return [[w for w, _ in h.values()] for h in histories], [
        [seed for _, seed in h.values()] for h in histories
    ]


async def test_delta_channel_history_of_every_checkpoint_as_langgraph_reads_it(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of every checkpoint of a forked two-channel history, the writes and seed of each
    channel are those LangGraph's own saver gives (task ids aside: they are random),
    read in one statement and the long way alike; another user reads nothing."""
    from langgraph.checkpoint.memory import InMemorySaver

    import tenxstore.langgraph.histories as histories
    import tenxstore.langgraph.sql as statements

    def values(found: Any) -> Any:
        writes, seeds = found
        return [[[value for _, _, value in w] for w in h] for h in writes], seeds

    expected = values(await two_deltas(InMemorySaver()))
    assert values(await two_deltas(await saver_for(backend))) == expected
    for module in (statements, histories):  # walks deeper than one: batches
        monkeypatch.setattr(module, "HISTORY_DEPTH", 1)
    shallow = await saver_for(backend)
    await shallow.adelete_thread("t")
    assert values(await two_deltas(shallow)) == expected
    stranger = TenxCheckpointSaver(await backend.make()).for_user("mallory")
    if backend.name != "memory":
        found = await stranger.aget_delta_channel_history(config=run("t"), channels=["turns"])
        assert found == {"turns": {"writes": []}}


async def _turned_into_a_delta_channel(saver: Any, name: str) -> Any:
    """A list channel written whole three times, then declared a DeltaChannel (a
    thread from before the graph adopted it): its value is the last whole one plus
    the writes since, not every write from the start."""

    def graph(delta: bool) -> Any:
        kind: Any = Annotated[list, DeltaChannel(_extend)] if delta else list
        state: Any = TypedDict("State", {name: kind})  # type: ignore[misc]
        node = (lambda s: {name: ["x"]}) if delta else (lambda s: {name: ["a", "b"]})
        built = StateGraph(state).add_node("n", node).add_edge(START, "n").add_edge("n", END)
        return built.compile(checkpointer=saver)

    for _ in range(3):
        await graph(False).ainvoke({name: ["a", "b"]}, run("t"))
    adopted = graph(True)
    await adopted.ainvoke({name: ["y"]}, run("t"))
    return (await adopted.aget_state(run("t"))).values


@pytest.mark.parametrize("name", ["plain", "tab\there", 'quote"d', "back\\slash", "caf\u00e9"])
async def test_a_delta_channel_of_any_name_reads_as_langgraph_wrote_it(
    backend: Backend, name: str
) -> None:
    """Any channel name (escaped in JSON or not) finds its stored value: the one
    statement takes only names JSON holds verbatim, the others the long way."""
    from langgraph.checkpoint.memory import InMemorySaver

    expected = await _turned_into_a_delta_channel(InMemorySaver(), name)
    assert expected == {name: ["a", "b", "y", "x"]}
    assert await _turned_into_a_delta_channel(await saver_for(backend), name) == expected


async def test_bounded_history_keeps_a_branch_left_at_an_interrupt(backend: Backend) -> None:
    """Heads of abandoned branches go with the history (a "regenerate" button does
    not grow it), except a head left at an interrupt: it can still be resumed."""

    def ask(state: Chat) -> dict[str, list[str]]:
        if state["turns"][-1] == "ask":
            return {"turns": [f"approved: {interrupt('approve?')}"]}
        return {"turns": ["ok"]}

    saver = TenxCheckpointSaver(await backend.make(), history_limit=3).for_user("alice")
    graph = (
        StateGraph(Chat)
        .add_node("ask", ask)
        .add_edge(START, "ask")
        .add_edge("ask", END)
        .compile(checkpointer=saver)
    )
    await invoke_interrupting(graph, {"turns": ["ask"]}, run("t"))
    waiting = await graph.aget_state(run("t"))
    assert waiting.next == ("ask",)
    fork = await graph.aupdate_state(waiting.parent_config, {"turns": ["instead"]})
    for turn in range(8):  # a branch of its own, with a regenerate at every turn
        await graph.ainvoke({"turns": [f"on {turn}"]}, fork if turn == 0 else run("t"))
        head = await graph.aget_state(run("t"))
        await graph.aupdate_state(head.parent_config, {"turns": ["again"]})
    everything = [t async for t in saver.alist(run("t"))]
    assert len(everything) <= 3 + 1 + 1  # the newest, the interrupted head, half the limit
    resumed = await invoke_interrupting(graph, Command(resume="yes"), waiting.config)
    assert resumed["turns"] == ["ask", "approved: yes"]


class Outer(TypedDict, total=False):
    turns: Annotated[list[str], operator.add]
    mark: str


class Inner(TypedDict, total=False):
    mark: str  # the subgraph sees only this: its output never carries ``turns`` again


async def test_bounded_history_prunes_the_runs_of_subgraphs(backend: Backend) -> None:
    """A subgraph writes each run into a namespace of its own (``node:task``): they go
    with the root checkpoint they ran under."""
    inner = (
        StateGraph(Inner)
        .add_node("mark", lambda s: {"mark": f"inner {s.get('mark', '')}"})
        .add_edge(START, "mark")
        .add_edge("mark", END)
        .compile()
    )
    saver = TenxCheckpointSaver(await backend.make(), history_limit=4).for_user("alice")
    graph = (
        StateGraph(Outer)
        .add_node("inner", inner)
        .add_edge(START, "inner")
        .add_edge("inner", END)
        .compile(checkpointer=saver)
    )
    for turn in range(20):
        result = await graph.ainvoke({"turns": [str(turn)]}, run("t"))
    everything = [t async for t in saver.alist(run("t"))]
    namespaces = {t.config["configurable"]["checkpoint_ns"] for t in everything}
    assert len(everything) <= 20 and len(namespaces) <= 4, namespaces
    assert any(ns for ns in namespaces)  # the subgraph's runs were stored, and pruned
    assert (await graph.aget_state(run("t"))).values == result
    assert result["turns"] == [str(turn) for turn in range(20)]


async def test_history_is_bounded_by_default(backend: Backend) -> None:
    saver = TenxCheckpointSaver(await backend.make()).for_user("alice")
    assert saver.history_limit == 100
    graph = chat_graph(saver)
    for turn in range(60):  # three checkpoints a turn
        await graph.ainvoke({"turns": [str(turn)]}, run("t"))
    kept = len([s async for s in graph.aget_state_history(run("t"))])
    assert 100 <= kept < 150  # pruned when grown by half the limit


async def test_a_fork_from_a_pruned_checkpoint_says_so(backend: Backend) -> None:
    saver = TenxCheckpointSaver(await backend.make(), history_limit=3).for_user("alice")
    graph = chat_graph(saver)
    await graph.ainvoke({"turns": ["one"]}, run("t"))
    old = [s async for s in graph.aget_state_history(run("t"))][-1]
    for turn in range(4):
        await graph.ainvoke({"turns": [str(turn)]}, run("t"))
    with pytest.raises(StaleStateError, match="no longer stored") as err:
        await graph.aupdate_state(old.config, {"turns": ["fork"]})
    assert not err.value.replaced
