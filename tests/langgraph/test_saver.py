"""TenxCheckpointSaver beyond LangGraph's suite: one writer per parent, bounded history,
isolation, and a real StateGraph resumed after a crash."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph

from tenxstore import AuthPolicy, ConfigError, StaleStateError, ThreadOwnershipError
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


async def test_config_less_calls_need_an_authority_under_isolation(backend: Backend) -> None:
    cp = await backend.make()
    saver = TenxCheckpointSaver(cp)
    alice, mallory = saver.for_user("alice"), saver.for_user("mallory")
    await put(alice, root("a1"), 0)
    await put(alice, root("a2"), 0)
    await put(mallory, root("m1"), 0)
    for call in (
        saver.adelete_thread("a1"),
        saver.acopy_thread("a1", "stolen"),
        saver.aprune(["a1"], strategy="delete"),
    ):
        with pytest.raises(ConfigError, match="for_user"):
            await call
    for call in (
        mallory.adelete_thread("a1"),
        mallory.acopy_thread("m1", "a2"),  # would overwrite alice's thread
        mallory.aprune(["a1"], strategy="delete"),
    ):
        with pytest.raises(ThreadOwnershipError):
            await call
    await mallory.acopy_thread("a1", "m-copy")  # another user's source reads as absent
    assert await mallory.aget_tuple(root("m-copy")) is None
    for thread in ("a1", "a2"):
        assert await alice.aget_tuple(root(thread)) is not None  # nothing of alice's moved
    with pytest.raises(ConfigError):  # a bound saver acts for its user only
        await alice.aget_tuple(root("a1", user_id="mallory"))
    # The owner's own saver, and an operator's, may.
    await alice.acopy_thread("a1", "a1-copy")
    assert await alice.aget_tuple(root("a1-copy")) is not None
    await alice.adelete_thread("a1")
    assert await alice.aget_tuple(root("a1")) is None
    operator = TenxCheckpointSaver(cp, auth_policy=AuthPolicy(enforce_user_isolation=False))
    await operator.aprune(["m1"], strategy="delete")
    assert await mallory.aget_tuple(root("m1")) is None


async def test_a_config_value_never_lifts_the_savers_isolation(backend: Backend) -> None:
    saver = TenxCheckpointSaver(await backend.make())
    await put(saver, root("private", user_id="alice"), 0)
    lifted = root("private", user_id="bob", auth_policy={"enforce_user_isolation": False})
    with pytest.raises(ConfigError, match="AuthPolicy"):
        await saver.aget_tuple(lifted)
    with pytest.raises(ConfigError, match="AuthPolicy"):
        await put(saver, lifted, 1)


async def test_a_user_lists_their_own_checkpoints(backend: Backend) -> None:
    saver = TenxCheckpointSaver(await backend.make())
    for thread, user in (("a1", "alice"), ("a2", "alice"), ("b1", "bob")):
        await put(saver, root(thread, user_id=user), 0)
    mine = [t async for t in saver.alist({"configurable": {"user_id": "alice"}})]
    assert sorted(t.config["configurable"]["thread_id"] for t in mine) == ["a1", "a2"]
    with pytest.raises(ConfigError):  # no user, isolation on: nobody's list
        [t async for t in saver.alist(None)]


async def test_a_run_from_before_a_delete_or_a_replace_never_writes(backend: Backend) -> None:
    cp = await backend.make()
    saver = TenxCheckpointSaver(cp).for_user("alice")
    head = await put(saver, root("t"), 0)
    resumed = await saver.aget_tuple(root("t"))  # a run resumes from here...
    assert resumed is not None
    await saver.adelete_thread("t")  # ...the user deletes the conversation meanwhile
    for config in (head, resumed.config):
        with pytest.raises(StaleStateError) as err:
            await put(saver, config, 1)
        assert err.value.replaced
        with pytest.raises(StaleStateError):
            await saver.aput_writes(config, [("step", 1)], "task")
    assert await saver.aget_tuple(root("t")) is None
    assert await cp.aget_thread({"thread_id": "t", "user_id": "alice"}) is None
    # The same after an import that replaced the thread.
    head = await put(saver, root("t"), 0)
    export = await cp.aexport_thread({"thread_id": "t", "user_id": "alice"})
    assert await cp.aimport_thread(export, on_conflict="replace") in ("replaced", "unchanged")
    await cp.aput_state({"thread_id": "t", "user_id": "alice"}, {"x": 1})
    assert await cp.aimport_thread(export, on_conflict="replace") == "replaced"
    with pytest.raises(StaleStateError):
        await put(saver, head, 1)
    # A run that starts after the delete writes as usual.
    fresh = await put(saver, root("t"), 0)
    assert (await put(saver, fresh, 1))["configurable"]["checkpoint_id"]


async def test_delete_for_runs_acts_within_the_savers_authority(backend: Backend) -> None:
    cp = await backend.make()
    saver = TenxCheckpointSaver(cp)
    alice, bob = saver.for_user("alice"), saver.for_user("bob")
    for who, thread in ((alice, "a"), (bob, "b")):
        checkpoint = empty_checkpoint()
        await who.aput(root(thread), checkpoint, {"run_id": "run-1", "step": 0}, {})
    with pytest.raises(ConfigError, match="for_user"):
        await saver.adelete_for_runs(["run-1"])  # no user, isolation on: refused
    await alice.adelete_for_runs(["run-1"])
    assert await alice.aget_tuple(root("a")) is None
    assert await bob.aget_tuple(root("b")) is not None  # another user's run is untouched
    operator = TenxCheckpointSaver(cp, auth_policy=AuthPolicy(enforce_user_isolation=False))
    await operator.adelete_for_runs(["run-1"])
    assert await bob.aget_tuple(root("b")) is None


async def test_delete_for_runs_finds_any_run_id_by_the_index(backend: Backend) -> None:
    """Run ids longer than the indexed column (by their digest), UUIDs and LIKE's
    metacharacters: each deletes its own run's checkpoints, and nothing else."""
    import uuid

    saver = TenxCheckpointSaver(await backend.make()).for_user("alice")
    runs = ["r" * 300, "r" * 299 + "s", uuid.uuid4(), "50%_off", "50x_off"]
    for n, run_id in enumerate(runs):
        await saver.aput(root(f"t{n}"), empty_checkpoint(), {"run_id": run_id}, {})
    await saver.adelete_for_runs([runs[0], str(runs[2]), runs[3]])
    left = {t.config["configurable"]["thread_id"] async for t in saver.alist(None)}
    assert left == {"t1", "t4"}


async def test_channel_values_read_back_as_put(backend: Backend) -> None:
    """Values live in lg_blobs by channel and version: a channel named longer than its
    key stays inline, and a checkpoint put again with new values reads the new ones."""
    saver = TenxCheckpointSaver(await backend.make(enforce_user_isolation=False))
    long = "c" * 300
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"short": [1, 2], long: {"x": 1}}
    checkpoint["channel_versions"] = {"short": "1", long: "1"}
    stored = await saver.aput(root("t"), checkpoint, {}, {"short": "1", long: "1"})
    again = {**checkpoint, "channel_values": {"short": [3], long: {"x": 2}}}
    await saver.aput(root("t"), again, {}, {"short": "1", long: "1"})  # the same id
    found = await saver.aget_tuple(stored)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"short": [3], long: {"x": 2}}


async def test_odd_keys_are_refused_or_kept_exactly(backend: Backend) -> None:
    """LangGraph's keys (namespace, checkpoint and task ids, task path, channel names)
    as every database can hold them: one it cannot (too long for this database's key
    column, U+0000 where it is a column, a lone surrogate) is a typed error with
    nothing written; a channel named with U+0000 is kept (inline) and read back; a
    value the serde cannot serialize is SerializationError."""
    from tenxstore import SerializationError

    saver = TenxCheckpointSaver(await backend.make(enforce_user_isolation=False))
    limit = saver._tables.limits.namespace if backend.name != "memory" else 255
    bad_namespaces = ["n" * (limit + 1), "a\x00b", "a\ud800b", 7]
    for ns in bad_namespaces:
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ns}}
        with pytest.raises(ConfigError, match="checkpoint_ns"):
            await saver.aput(config, empty_checkpoint(), {"source": "input"}, {})
    for channel in ("c\ud800", 5):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {channel: "v"}
        checkpoint["channel_versions"] = {channel: saver.get_next_version(None, None)}
        with pytest.raises(SerializationError, match="channel"):
            await saver.aput(root("t"), checkpoint, {"source": "input"}, {})
    unserializable = empty_checkpoint()
    unserializable["channel_values"] = {"c": object()}
    unserializable["channel_versions"] = {"c": saver.get_next_version(None, None)}
    with pytest.raises(SerializationError, match="'c'"):
        await saver.aput(root("t"), unserializable, {"source": "input"}, {})
    assert await saver.aget_tuple(root("t")) is None  # nothing was written
    # A channel named with U+0000 (and one longer than the key column) is kept whole.
    odd = {"c\x00d": "nul", "l" * 300: "long", "é✓𝄞": "unicode"}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = dict(odd)
    checkpoint["channel_versions"] = {ch: saver.get_next_version(None, None) for ch in odd}
    head = await saver.aput(root("t"), checkpoint, {"source": "input"}, {})
    found = await saver.aget_tuple(head)
    assert found is not None and found.checkpoint["channel_values"] == odd
    for task_id, path, channel in (
        ("t\x00", "", "c"),
        ("t", "p\ud800", "c"),
        ("t" * (saver._tables.limits.task_id + 1), "", "c"),
    ):
        with pytest.raises(ConfigError):
            await saver.aput_writes(head, [(channel, 1)], task_id, path)
    with pytest.raises(SerializationError, match="U\\+0000"):
        await saver.aput_writes(head, [("c\x00d", 1)], "task")
    found = await saver.aget_tuple(head)
    assert found is not None and found.pending_writes == []
