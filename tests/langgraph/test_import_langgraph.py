"""Moving in from LangGraph's own savers: databases written by the real
AsyncPostgresSaver / PostgresSaver and AsyncSqliteSaver / SqliteSaver (plain and
DeltaChannel graphs, subgraphs, fan-out, interrupts) imported into SQLite, PostgreSQL
and MariaDB, verified, and resumed: the next turn is the same on tenxstore as on the
saver it came from."""

from __future__ import annotations

import asyncio
import json
import operator
import sqlite3
import sys
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import asyncpg
import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.channels import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, Send, interrupt
from sqlalchemy import text

import tenxstore
from tenxstore import ConfigError, ImportConflict
from tenxstore.langgraph import TenxCheckpointSaver, aimport_langgraph, import_langgraph
from tests import services
from tests.conftest import Backend, backend_for, drop_schema, new_schema, quoted

services.require_modules("bench", "langgraph.checkpoint.postgres", "langgraph.checkpoint.sqlite")

from langgraph.checkpoint.postgres import PostgresSaver  # noqa: E402
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver  # noqa: E402

SUB = "naïve 'sub' ✓ \"q\""  # a node name, so a namespace, of odd characters
SOURCES = ["postgresql", "sqlite"]
TARGETS = ["sqlite", "postgresql", "mariadb", "postgresql+encrypted"]


@dataclass
class Source:
    """A database of LangGraph's own saver, and how to reach it."""

    kind: str
    url: str  # what the import reads
    schema: str | None
    dsn: str  # what LangGraph's saver connects to

    def saver(self) -> Any:
        if self.kind == "postgresql":
            return AsyncPostgresSaver.from_conn_string(self.dsn)
        return AsyncSqliteSaver.from_conn_string(self.dsn)

    def sync_saver(self) -> Any:
        if self.kind == "postgresql":
            return PostgresSaver.from_conn_string(self.dsn)
        return SqliteSaver.from_conn_string(self.dsn)

    def options(self) -> dict[str, Any]:
        return {"source_schema": self.schema}


@asynccontextmanager
async def lg_source(kind: str, tmp_path: Path) -> AsyncIterator[Source]:
    """An empty database of LangGraph's saver (its tables made by its own setup)."""
    if kind == "sqlite":
        path = str(tmp_path / "langgraph.sqlite")
        yield Source(kind, path, None, path)
        return
    url, schema = services.pg_url(), new_schema()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"CREATE SCHEMA {quoted(schema)}")
    finally:
        await conn.close()
    source = Source(kind, url, schema, f"{url}?options=-csearch_path%3D{schema}")
    async with source.saver() as saver:
        await saver.setup()
    try:
        yield source
    finally:
        await drop_schema(url, schema)


# -- graphs ---------------------------------------------------------------------------


class Sub(TypedDict):
    notes: Annotated[list[str], operator.add]


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    notes: Annotated[list[str], operator.add]
    fanned: Annotated[list[str], operator.add]
    turn: int


def workflow(saver: Any) -> Any:
    """A chat with a fan-out (Send), a subgraph (its own namespace) and a stop before
    the reply (an interrupt: a turn is an input and a resume)."""
    sub = (
        StateGraph(Sub)
        .add_node("jot", lambda s: {"notes": [f"jot {len(s['notes'])}"]})
        .add_edge(START, "jot")
        .add_edge("jot", END)
        .compile()
    )

    def plan(state: State) -> dict[str, Any]:
        return {"turn": state.get("turn", 0) + 1}

    def fan(state: State) -> list[Send]:
        return [Send("work", {"item": f"{state['turn']}-{i}"}) for i in range(2)]

    def reply(state: State) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(f"reply {n}: {state['fanned'][-2:]}", id=f"ai-{n}")]}

    return (
        StateGraph(State)
        .add_node("plan", plan)
        .add_node("work", lambda arg: {"fanned": [arg["item"]]})
        .add_node(SUB, sub)
        .add_node("reply", reply)
        .add_edge(START, "plan")
        .add_conditional_edges("plan", fan, ["work"])
        .add_edge("work", SUB)
        .add_edge(SUB, "reply")
        .add_edge("reply", END)
        .compile(checkpointer=saver, interrupt_before=["reply"])
    )


def _extend(state: list[str], writes: Any) -> list[str]:
    return [*state, *(x for w in writes for x in w)]


class Deltas(TypedDict):
    items: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=3)]


def delta_graph(saver: Any) -> Any:
    return (
        StateGraph(Deltas)
        .add_node("add", lambda s: {"items": [f"item {len(s['items'])}"]})
        .add_edge(START, "add")
        .add_edge("add", END)
        .compile(checkpointer=saver)
    )


def asking(saver: Any) -> Any:
    """A fan-out whose second task asks (interrupt()): the first one's writes wait as
    pending writes on the head, beside the interrupt."""

    def work(arg: dict[str, str]) -> dict[str, Any]:
        answer = interrupt(f"ok {arg['item']}?") if arg["item"].endswith("1") else "done"
        return {"fanned": [f"{arg['item']} {answer}"]}

    return (
        StateGraph(State)
        .add_node("plan", lambda s: {"turn": s.get("turn", 0) + 1})
        .add_node("work", work)
        .add_edge(START, "plan")
        .add_conditional_edges(
            "plan", lambda s: [Send("work", {"item": f"{s['turn']}-{i}"}) for i in range(2)]
        )
        .add_edge("work", END)
        .compile(checkpointer=saver)
    )


def cfg(thread: str, user: str | None = None) -> dict[str, Any]:
    extra = {} if user is None else {"user_id": user}
    return {"configurable": {"thread_id": thread, **extra}}


async def chat_turns(graph: Any, thread: str, user: str, turns: int) -> None:
    for n in range(turns):
        message = HumanMessage(f"question {n} " + "x" * n, id=f"{thread}-h{n}")
        await graph.ainvoke({"messages": [message]}, cfg(thread, user))
        await graph.ainvoke(None, cfg(thread, user))  # past the interrupt: the reply


def _snapshot(s: Any) -> tuple[Any, ...]:
    """What a state snapshot says, without the configs' saver-specific keys."""
    parent = s.parent_config["configurable"]["checkpoint_id"] if s.parent_config else None
    tasks = [(t.id, t.name, t.error, [i.value for i in t.interrupts]) for t in s.tasks]
    return (
        s.values,
        s.next,
        s.metadata,
        s.config["configurable"]["checkpoint_id"],
        parent,
        tasks,
        s.created_at,
    )


async def read_all(graph: Any, config: dict[str, Any]) -> list[Any]:
    """The head (with its subgraphs' states) and every checkpoint of the history."""
    head = await graph.aget_state(config, subgraphs=True)
    subs = [_snapshot(t.state) for t in head.tasks if t.state is not None]
    return [_snapshot(head), subs, [_snapshot(s) async for s in graph.aget_state_history(config)]]


async def importing(source: Source, target: Any, **options: Any) -> Any:
    return await aimport_langgraph(source.url, target, **source.options(), **options)


# -- the way in: imported, verified, resumed ------------------------------------------


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("name", TARGETS)
async def test_a_thread_moves_in_and_goes_on_as_on_langgraphs_saver(
    kind: str, name: str, tmp_path: Path
) -> None:
    async with lg_source(kind, tmp_path) as source, backend_for(name, tmp_path) as target:
        cp = await target.make()
        async with source.saver() as theirs:
            graph = workflow(theirs)
            await chat_turns(graph, "t-alice", "alice", 3)
            await chat_turns(graph, "t-bob", "bob", 2)
            await graph.ainvoke(
                {"messages": [HumanMessage("left at the stop", id="s")]}, cfg("t-bob", "bob")
            )
            expected = {
                t: await read_all(graph, cfg(t, u))
                for t, u in (("t-alice", "alice"), ("t-bob", "bob"))
            }

            done = await importing(source, cp, user_from_metadata="user_id", batch_size=7)
            assert done.outcomes == {"created": 2} and done.refused == {} and done.verified == 2
            assert done.checkpoints > 20 and done.writes > 0 and done.values > 0

            for thread, user in (("t-alice", "alice"), ("t-bob", "bob")):
                ours = workflow(TenxCheckpointSaver(cp).for_user(user))
                assert await read_all(ours, cfg(thread)) == expected[thread]
            # another user does not see it
            other = workflow(TenxCheckpointSaver(cp).for_user("mallory"))
            assert (await other.aget_state(cfg("t-alice"))).values == {}

            # the same next turn on both: past bob's stop, then a whole new turn
            ours = workflow(TenxCheckpointSaver(cp).for_user("bob"))
            assert await ours.ainvoke(None, cfg("t-bob")) == await graph.ainvoke(
                None, cfg("t-bob", "bob")
            )
            message = {"messages": [HumanMessage("and then?", id="next")]}
            for step in (message, None):
                mine = await ours.ainvoke(step, cfg("t-bob"))
                assert mine == await graph.ainvoke(step, cfg("t-bob", "bob"))
            assert (await ours.aget_state(cfg("t-bob"))).values == (
                await graph.aget_state(cfg("t-bob", "bob"))
            ).values

        # run again: the imported threads are unchanged (bob's has moved on: a conflict)
        again = await importing(source, cp, user_from_metadata="user_id", thread_ids=["t-alice"])
        assert again.outcomes == {"unchanged": 1} and again.checkpoints == 0
        with pytest.raises(ImportConflict, match="t-bob"):
            await importing(source, cp, user_from_metadata="user_id")


async def _deltas(cp: Any, target: Backend) -> int:
    """Rows of lg_blobs stored as what they gained (a delta on an earlier version)."""
    table = "lg_blobs" if target.schema is None else f'"{target.schema}".lg_blobs'
    async with cp.engine.connect() as conn:
        found = await conn.execute(text(f"SELECT COUNT(*) FROM {table} WHERE base IS NOT NULL"))
        return int(found.scalar())


@pytest.mark.parametrize("kind", SOURCES)
async def test_a_grown_message_list_is_stored_as_what_it_gained(kind: str, tmp_path: Path) -> None:
    async with lg_source(kind, tmp_path) as source, backend_for("sqlite", tmp_path) as target:
        cp = await target.make()
        async with source.saver() as theirs:
            await chat_turns(workflow(theirs), "t", "alice", 6)
        await importing(source, cp, user_id="alice")
        assert await _deltas(cp, target) >= 5  # each reply and question appended


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("name", ["sqlite", "mariadb"])
async def test_a_delta_channel_graph_moves_in_with_its_writes_and_snapshots(
    kind: str, name: str, tmp_path: Path
) -> None:
    async with lg_source(kind, tmp_path) as source, backend_for(name, tmp_path) as target:
        cp = await target.make()
        async with source.saver() as theirs:
            graph = delta_graph(theirs)
            for n in range(8):  # snapshots every third update
                await graph.ainvoke({"items": [f"in {n}"]}, cfg("d", "alice"))
            expected = await read_all(graph, cfg("d", "alice"))
            done = await importing(source, cp, user_id="alice")
            assert done.verified == 1
            ours = delta_graph(TenxCheckpointSaver(cp).for_user("alice"))
            assert await read_all(ours, cfg("d")) == expected
            for n in range(2):
                step = {"items": [f"more {n}"]}
                assert await ours.ainvoke(step, cfg("d")) == await graph.ainvoke(
                    step, cfg("d", "alice")
                )


@pytest.mark.parametrize("kind", SOURCES)
async def test_pending_writes_and_an_interrupt_move_in_sync(kind: str, tmp_path: Path) -> None:
    """The synchronous savers and import_langgraph: a head holding one task's pending
    writes beside another's interrupt, resumed with the same answer on both."""
    async with lg_source(kind, tmp_path) as source, backend_for("postgresql", tmp_path) as target:
        cp = await target.make()

        def interrupted() -> Any:
            with source.sync_saver() as theirs:
                graph = asking(theirs)
                graph.invoke({"messages": []}, cfg("q", "alice"))
                head = theirs.get_tuple(cfg("q"))
                assert {ch for _, ch, _ in head.pending_writes} >= {"fanned", "__interrupt__"}
                return _snapshot(graph.get_state(cfg("q", "alice")))

        def imported() -> Any:
            done = import_langgraph(source.url, cp, user_id="alice", **source.options())
            assert done.verified == 1
            graph = asking(TenxCheckpointSaver(cp).for_user("alice"))
            return _snapshot(graph.get_state(cfg("q"))), graph.invoke(
                Command(resume="yes"), cfg("q")
            )

        def resumed() -> Any:
            with source.sync_saver() as theirs:
                return asking(theirs).invoke(Command(resume="yes"), cfg("q", "alice"))

        expected = await asyncio.to_thread(interrupted)
        state, mine = await asyncio.to_thread(imported)
        assert state == expected
        assert mine == await asyncio.to_thread(resumed)
        assert "1-1 yes" in mine["fanned"] and "1-0 done" in mine["fanned"]


# -- what a target already holds ------------------------------------------------------


async def _head(cp: Any, thread: str, user: str = "alice") -> Any:
    found = await TenxCheckpointSaver(cp).for_user(user).aget_tuple(cfg(thread))
    return None if found is None else found.checkpoint["id"]


async def test_a_thread_the_target_holds_otherwise_errors_skips_or_is_replaced(
    tmp_path: Path,
) -> None:
    async with lg_source("sqlite", tmp_path) as source, backend_for("sqlite", tmp_path) as target:
        cp = await target.make()
        async with source.saver() as theirs:
            await chat_turns(workflow(theirs), "t", "alice", 2)
            expected = await read_all(workflow(theirs), cfg("t", "alice"))
        await importing(source, cp, user_id="alice")
        ours = workflow(TenxCheckpointSaver(cp).for_user("alice"))
        await chat_turns(ours, "t", "alice", 1)  # the thread goes on in tenxstore
        moved_on = await _head(cp, "t")
        with pytest.raises(ImportConflict, match="'t' is in the target"):
            await importing(source, cp, user_id="alice")
        assert await _head(cp, "t") == moved_on
        skipped = await importing(source, cp, user_id="alice", on_conflict="skip")
        assert skipped.outcomes == {"skipped": 1} and skipped.verified == 0
        assert await _head(cp, "t") == moved_on
        replaced = await importing(source, cp, user_id="alice", on_conflict="replace")
        assert replaced.outcomes == {"replaced": 1} and replaced.verified == 1
        assert await read_all(ours, cfg("t")) == expected
        # another user's thread of that id, written with the core API: replaced too
        again = await importing(source, cp, user_id="alice", on_conflict="replace")
        assert again.outcomes == {"unchanged": 1}
        await cp.aclean_thread({"thread_id": "t", "user_id": "alice"})
        await cp.aput_state({"thread_id": "t", "user_id": "bob"}, {"core": True})
        with pytest.raises(ImportConflict):
            await importing(source, cp, user_id="alice")
        taken = await importing(source, cp, user_id="alice", on_conflict="replace")
        assert taken.outcomes == {"replaced": 1}
        assert await cp.aget_state({"thread_id": "t", "user_id": "bob"}) is None
        assert await read_all(ours, cfg("t")) == expected


# -- owners -----------------------------------------------------------------------------


async def test_every_thread_needs_an_owner_under_isolation(tmp_path: Path) -> None:
    async with lg_source("sqlite", tmp_path) as source, backend_for("sqlite", tmp_path) as target:
        cp = await target.make()
        with pytest.raises(ConfigError, match="isolates users"):  # before any I/O
            await aimport_langgraph(str(tmp_path / "nothing-here.sqlite"), cp)
        async with source.saver() as theirs:
            graph = delta_graph(theirs)
            await graph.ainvoke({"items": ["a"]}, cfg("owned", "alice"))
            await graph.ainvoke({"items": ["b"]}, cfg("nobody"))
            await graph.ainvoke({"items": ["c"]}, cfg("two", "alice"))
            await graph.ainvoke({"items": ["d"]}, cfg("two", "bob"))
        done = await importing(source, cp, user_from_metadata="user_id")
        assert done.outcomes == {"created": 1}
        assert set(done.refused) == {"nobody", "two"}
        assert "no checkpoint's metadata names its user ('user_id')" in done.refused["nobody"]
        assert "2 users" in done.refused["two"] and '"bob"' in done.refused["two"]
        operator = {"auth_policy": tenxstore.AuthPolicy(enforce_user_isolation=False)}
        assert [t.thread_id for t in await cp.alist_threads(operator)] == ["owned"]
        assert (await cp.aget_thread({"thread_id": "owned", **operator})).user_id == "alice"
        # one owner for all, or none (an application without isolation)
        done = await importing(source, cp, user_id="carol", thread_ids=["nobody", "two"])
        assert done.outcomes == {"created": 2}
        shared = await target.make(enforce_user_isolation=False)
        await shared.aclean_thread({"thread_id": "two"})
        done = await importing(source, shared, thread_ids=["two"])
        assert done.outcomes == {"created": 1}
        assert (await shared.aget_thread({"thread_id": "two"})).user_id is None
        with pytest.raises(ConfigError, match="has no checkpoint of thread 'absent'"):
            await importing(source, cp, user_id="carol", thread_ids=["absent"])


# -- values the strict serde refuses ----------------------------------------------------


@dataclass
class Note:
    text: str


class Noted(TypedDict):
    note: Note
    turns: Annotated[list[str], operator.add]


def noting(saver: Any) -> Any:
    return (
        StateGraph(Noted)
        .add_node("n", lambda s: {"turns": [s["note"].text]})
        .add_edge(START, "n")
        .add_edge("n", END)
        .compile(checkpointer=saver)
    )


@pytest.mark.parametrize("kind", SOURCES)
async def test_a_value_of_a_type_not_allowed_refuses_its_thread(kind: str, tmp_path: Path) -> None:
    async with lg_source(kind, tmp_path) as source, backend_for("sqlite", tmp_path) as target:
        cp = await target.make()
        async with source.saver() as theirs:  # one run each: a second would read it back
            await noting(theirs).ainvoke({"note": Note("hi"), "turns": []}, cfg("noted", "a"))
            await delta_graph(theirs).ainvoke({"items": ["x"]}, cfg("plain", "a"))
        done = await importing(source, cp, user_id="alice")
        assert done.outcomes == {"created": 1} and set(done.refused) == {"noted"}
        assert "Note" in done.refused["noted"] and "strict serde" in done.refused["noted"]
        assert await _head(cp, "noted") is None  # nothing of it written
        allowed = [(__name__, "Note")]
        done = await importing(source, cp, user_id="alice", allowed_types=allowed)
        assert done.outcomes == {"created": 1, "unchanged": 1} and done.refused == {}
        saver = TenxCheckpointSaver(cp, allowed_types=[Note]).for_user("alice")
        state = await noting(saver).aget_state(cfg("noted"))
        assert state.values == {"note": Note("hi"), "turns": ["hi"]}


# -- older savers, and what is not read -------------------------------------------------


async def _pg(source: Source, *statements: str) -> None:
    conn = await asyncpg.connect(source.url)
    try:
        await conn.execute(f"SET search_path TO {quoted(source.schema or 'public')}")
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.mark.parametrize("kind", SOURCES)
async def test_a_database_of_a_saver_before_task_path_is_read(kind: str, tmp_path: Path) -> None:
    """PostgresSaver before migration 9 and SqliteSaver before 2.0 had no task_path."""
    async with lg_source(kind, tmp_path) as source, backend_for("postgresql", tmp_path) as target:
        cp = await target.make()
        async with source.saver() as theirs:
            graph = workflow(theirs)
            await chat_turns(graph, "t", "alice", 2)
            await graph.ainvoke({"messages": [HumanMessage("stop", id="s")]}, cfg("t", "alice"))
            expected = await read_all(graph, cfg("t", "alice"))
        if kind == "postgresql":
            await _pg(
                source,
                "ALTER TABLE checkpoint_writes DROP COLUMN task_path",
                "DELETE FROM checkpoint_migrations WHERE v = 9",
            )
        else:
            with sqlite3.connect(source.dsn) as db:
                db.execute("ALTER TABLE writes DROP COLUMN task_path")
        done = await importing(source, cp, user_id="alice")
        assert done.verified == 1 and done.source.endswith(("migration 8", "(no task_path)"))
        assert (
            await read_all(workflow(TenxCheckpointSaver(cp).for_user("alice")), cfg("t"))
            == expected
        )


async def test_rows_an_older_postgres_saver_wrote_read_as_the_current_one_reads_them(
    tmp_path: Path,
) -> None:
    """Checkpoints of format 1 (langgraph-checkpoint-postgres 1.x: every value a blob,
    the Sends kept as writes of the parent), in a database migrated since: the import
    reads them as AsyncPostgresSaver does, the parent's Sends moved into the tasks
    channel."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    serde = JsonPlusSerializer()
    async with (
        lg_source("postgresql", tmp_path) as source,
        backend_for("sqlite", tmp_path) as target,
    ):
        cp = await target.make()
        v1, v2 = f"{1:032}.0.1", f"{2:032}.0.2"
        first = {
            "v": 1,
            "id": "1ef00000-0000-6000-8000-000000000001",
            "ts": "2024-09-01T10:00:00+00:00",
            "channel_versions": {"items": v1},
            "versions_seen": {},
            "pending_sends": [],
        }
        second = {
            **first,
            "id": "1ef00000-0000-6000-8000-000000000002",
            "ts": "2024-09-01T10:00:01+00:00",
            "channel_versions": {"items": v2, "step": v2},
        }
        rows = [(first, None), (second, first["id"])]
        blobs = [("items", v1, ["a"]), ("items", v2, ["a", "b"]), ("step", v2, {"n": 2})]
        send = serde.dumps_typed(Send("work", {"item": "x"}))
        conn = await asyncpg.connect(source.url)
        try:
            await conn.execute(f"SET search_path TO {quoted(source.schema or '')}")
            for body, parent in rows:
                await conn.execute(
                    "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
                    "parent_checkpoint_id, checkpoint, metadata) "
                    "VALUES ('old', '', $1, $2, $3, $4)",
                    body["id"],
                    parent,
                    json.dumps(body),
                    '{"source": "loop", "step": 1, "user_id": "alice"}',
                )
            for channel, version, value in blobs:
                await conn.execute(
                    "INSERT INTO checkpoint_blobs VALUES ('old', '', $1, $2, $3, $4)",
                    channel,
                    version,
                    *serde.dumps_typed(value),
                )
            await conn.execute(
                "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, "
                "task_id, idx, channel, type, blob) "
                "VALUES ('old', '', $1, 'task-1', 0, '__pregel_tasks', $2, $3)",
                first["id"],
                *send,
            )
        finally:
            await conn.close()
        async with source.saver() as theirs:
            expected = await theirs.aget_tuple(cfg("old"))
        assert expected.checkpoint["channel_values"]["__pregel_tasks"] == [
            Send("work", {"item": "x"})
        ]
        done = await importing(source, cp, user_from_metadata="user_id")
        assert done.verified == 1, done
        mine = await TenxCheckpointSaver(cp).for_user("alice").aget_tuple(cfg("old"))
        assert mine.checkpoint == expected.checkpoint
        assert mine.metadata == expected.metadata
        assert mine.parent_config["configurable"]["checkpoint_id"] == first["id"]


async def test_a_source_of_another_version_or_kind_is_refused(tmp_path: Path) -> None:
    async with (
        lg_source("postgresql", tmp_path) as source,
        backend_for("sqlite", tmp_path) as target,
    ):
        cp = await target.make()
        await _pg(source, "INSERT INTO checkpoint_migrations (v) VALUES (10)")
        with pytest.raises(ConfigError, match="at migration 10; this release reads migrations 3-9"):
            await importing(source, cp, user_id="a")
        await _pg(source, "DELETE FROM checkpoint_migrations WHERE v >= 3")
        with pytest.raises(ConfigError, match="at migration 2"):
            await importing(source, cp, user_id="a")
        with pytest.raises(ConfigError, match="no tables of LangGraph's PostgresSaver"):
            await aimport_langgraph(source.url, cp, user_id="a", source_schema="elsewhere")
        old = tmp_path / "old.sqlite"
        with sqlite3.connect(old) as db:  # LangGraph 0.1's SqliteSaver
            db.execute(
                "CREATE TABLE checkpoints (thread_id TEXT, thread_ts TEXT, parent_ts TEXT, "
                "checkpoint BLOB, metadata BLOB)"
            )
        with pytest.raises(ConfigError, match=r"before 0\.2"):
            await aimport_langgraph(str(old), cp, user_id="a")
        with pytest.raises(ConfigError, match="no tables of LangGraph's SqliteSaver"):
            await aimport_langgraph(target.url or "", cp, user_id="a")  # a tenxstore file
        with pytest.raises(ConfigError, match="no SQLite file"):
            await aimport_langgraph(str(tmp_path / "missing.sqlite"), cp, user_id="a")


async def test_a_checkpoint_whose_parent_is_gone_moves_in_as_langgraph_reads_it(
    tmp_path: Path,
) -> None:
    async with (
        lg_source("postgresql", tmp_path) as source,
        backend_for("mariadb", tmp_path) as target,
    ):
        cp = await target.make()
        async with source.saver() as theirs:
            graph = workflow(theirs)
            await chat_turns(graph, "t", "alice", 3)
            history = [s async for s in graph.aget_state_history(cfg("t", "alice"))]
            gone = history[len(history) // 2].config["configurable"]["checkpoint_id"]
            await _pg(
                source,
                f"DELETE FROM checkpoints WHERE checkpoint_id = '{gone}' AND checkpoint_ns = ''",
            )
            expected = await read_all(graph, cfg("t", "alice"))
            assert len(expected[2]) < len(history)  # the history stops at the gap
            done = await importing(source, cp, user_id="alice")
            assert done.verified == 1
            ours = workflow(TenxCheckpointSaver(cp).for_user("alice"))
            assert await read_all(ours, cfg("t")) == expected
            step = {"messages": [HumanMessage("on", id="on")]}
            assert await ours.ainvoke(step, cfg("t")) == await graph.ainvoke(
                step, cfg("t", "alice")
            )


# -- the command: a dry run, a kill and a rerun -----------------------------------------


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tenxstore.cli", "import-langgraph", *args]


async def _run(*args: str) -> tuple[int | None, str, str]:
    """The command in a process of its own: its exit status, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        *_cli(*args), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


async def _many(source: Source, threads: int, turns: int) -> None:
    async with source.saver() as theirs:
        graph = delta_graph(theirs)
        for t in range(threads):
            for n in range(turns):
                await graph.ainvoke({"items": [f"{t}.{n}"]}, cfg(f"t{t:03}", f"u{t % 3}"))


def _count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as db:
        try:
            return int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
        except sqlite3.OperationalError:  # not set up yet
            return 0


async def test_the_command_counts_then_a_killed_import_is_finished_by_a_rerun(
    tmp_path: Path,
) -> None:
    async with lg_source("sqlite", tmp_path) as source:
        await _many(source, 60, 4)
        target = tmp_path / "target.db"
        url = f"sqlite:///{target}"
        owners = ("--user-from-metadata", "user_id")
        code, out, err = await _run(source.url, "--url", url, *owners, "--dry-run")
        assert code == 0, err
        checkpoints = _count(Path(source.url), "checkpoints")
        writes = _count(Path(source.url), "writes")
        assert f"60 thread(s) (60 new), {checkpoints} checkpoint(s), {writes} pending" in out
        assert _count(target, "lg_checkpoints") == 0 and _count(target, "threads") == 0
        code, out, err = await _run(source.url, "--url", url)
        assert code == 1 and "isolates users" in err

        running = await asyncio.create_subprocess_exec(
            *_cli(source.url, "--url", url, *owners, "--batch-size", "1"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            while _count(target, "threads") < 5:  # well into it: mid-thread, most likely
                assert running.returncode is None, "the import ended before it was killed"
                await asyncio.sleep(0.01)
        finally:
            running.kill()
            await running.wait()
        committed = _count(target, "threads")
        assert 5 <= committed < 60

        code, out, err = await _run(source.url, "--url", url, *owners)
        assert code == 0, err
        assert f"{60 - committed} created, {committed} unchanged" in out
        assert "60 thread(s) verified" in out
        assert _count(target, "lg_checkpoints") == checkpoints  # each once, none twice
        assert _count(target, "lg_writes") == writes
        code, out, err = await _run(source.url, "--url", url, *owners)
        assert "imported from SqliteSaver: 60 unchanged" in out


# -- bounded memory -------------------------------------------------------------------


async def _long_thread(source: Source, checkpoints: int) -> None:
    """One thread of ``checkpoints`` checkpoints, put by AsyncPostgresSaver itself: a
    window of the last 20 messages (a new version each step) and a counter."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    async with source.saver() as theirs:
        config: dict[str, Any] = {"configurable": {"thread_id": "long", "checkpoint_ns": ""}}
        window: list[AnyMessage] = []
        for n in range(checkpoints):
            window = [*window[-19:], HumanMessage(f"message {n} " + "y" * 40, id=f"m{n}")]
            version = theirs.get_next_version(None if n == 0 else f"{n:032}.0", None)
            checkpoint = {
                **empty_checkpoint(),
                "id": str(uuid6(clock_seq=n)),
                "channel_values": {"messages": window, "count": n},
                "channel_versions": {"messages": version, "count": version},
            }
            metadata = {"source": "loop", "step": n, "user_id": "alice"}
            config = await theirs.aput(config, checkpoint, metadata, checkpoint["channel_versions"])
            await theirs.aput_writes(config, [("count", n + 1)], f"task-{n}")


@pytest.mark.slow
async def test_thousands_of_checkpoints_move_in_within_bounded_memory(tmp_path: Path) -> None:
    """Memory grows with a page of rows and the namespace's channel versions, not with
    the values of the thread: the peak importing one thread of 5,000 checkpoints is
    about that of 1,000 (tracemalloc, the importer's allocations)."""
    peaks = {}
    for size in (1_000, 5_000):
        async with lg_source("postgresql", tmp_path) as source:
            await _long_thread(source, size)
            (tmp_path / str(size)).mkdir()
            async with backend_for("sqlite", tmp_path / str(size)) as target:
                cp = await target.make()
                tracemalloc.start()
                try:
                    done = await importing(source, cp, user_id="alice", batch_size=200)
                    peaks[size] = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                assert done.checkpoints == size and done.writes == size and done.verified == 1
                assert done.values == 2 * size
    print(
        f"import peak: 1,000 checkpoints {peaks[1_000] / 2**20:.1f} MiB, "
        f"5,000 checkpoints {peaks[5_000] / 2**20:.1f} MiB"
    )
    # an importer that kept each checkpoint it read grew by ~5 MiB here (and failed)
    assert peaks[5_000] < 1.5 * peaks[1_000] + (2 << 20)
    assert peaks[5_000] < 32 << 20


# -- the way back -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", SOURCES)
async def test_the_way_back_a_thread_copied_into_langgraphs_saver_goes_on_there(
    kind: str, tmp_path: Path
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from tenxstore.langgraph import acopy_langgraph_thread

    async with lg_source(kind, tmp_path) as source, backend_for("postgresql", tmp_path) as target:
        cp = await target.make()
        saver = TenxCheckpointSaver(cp).for_user("alice")
        ours, oracle = workflow(saver), workflow(InMemorySaver())
        for graph in (ours, oracle):
            await chat_turns(graph, "t", "alice", 2)
            await graph.ainvoke({"messages": [HumanMessage("stop", id="s")]}, cfg("t", "alice"))
        async with source.saver() as theirs:
            copied = await acopy_langgraph_thread(saver, theirs, "t")
            assert copied == len([c async for c in saver.alist(cfg("t"))])
            back = workflow(theirs)
            assert await read_all(back, cfg("t", "alice")) == await read_all(ours, cfg("t"))
            for step in (None, {"messages": [HumanMessage("then", id="then")]}, None):
                expected = await oracle.ainvoke(step, cfg("t", "alice"))
                assert await back.ainvoke(step, cfg("t", "alice")) == expected
