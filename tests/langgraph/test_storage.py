"""How LangGraph values are stored: a list that grows is kept as what it gained (a
delta on the version before), read back exactly as LangGraph wrote it whatever the
edits; a delta is written only on the very row it was made from; a damaged chain is
an error, never a wrong value; a downgrade writes every value whole again."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any, TypedDict

import asyncpg
import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.base import copy_checkpoint, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from sqlalchemy import text

import tenxstore
from tenxstore import AuthPolicy, SerializationError, StaleStateError, migrate
from tenxstore.crypto import BLOB, CHECKPOINT, life_of, open_typed
from tenxstore.deltas import MAX_DEPTH, Stored, blob_write, delta, rebuild
from tenxstore.langgraph import TenxCheckpointSaver
from tests.conftest import Backend, backend_for


def chat(saver: Any) -> Any:
    """A chat: the input's messages go in (add_messages: append, edit by id, remove),
    then one AI reply is appended."""

    def reply(state: MessagesState) -> dict[str, list[AnyMessage]]:
        count = len(state["messages"])
        return {"messages": [AIMessage(content=f"reply to {count}", id=f"ai-{count}")]}

    return (
        StateGraph(MessagesState)
        .add_node("reply", reply)
        .add_edge(START, "reply")
        .add_edge("reply", END)
        .compile(checkpointer=saver)
    )


def run(thread: str = "t", **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, **extra}}


def turns() -> list[list[AnyMessage]]:
    """Inputs that append, edit an earlier message in place, remove one, and clear."""
    script: list[list[AnyMessage]] = []
    for n in range(24):
        script.append([HumanMessage(content=f"question {n} " + "x" * (n * 7), id=f"h{n}")])
        if n == 8:
            script.append([HumanMessage(content="question 2, edited", id="h2")])
        if n == 12:
            script.append([RemoveMessage(id="h5"), HumanMessage(content="after", id="a12")])
        if n == 17:
            script.append([RemoveMessage(id=REMOVE_ALL_MESSAGES), HumanMessage("anew", id="z")])
    return script


async def history(graph: Any, config: dict[str, Any]) -> list[Any]:
    return [s.values.get("messages", []) async for s in graph.aget_state_history(config)]


def blobs_table(backend: Backend) -> str:
    return "lg_blobs" if backend.schema is None else f'"{backend.schema}".lg_blobs'


def blob_column(backend: Backend) -> str:
    """``blob``, quoted where it is a reserved word (MySQL)."""
    return "`blob`" if backend.name == "mariadb" else "blob"


async def blob_rows(cp: Any, backend: Backend) -> list[Any]:
    """The rows of the ``messages`` channel's values."""
    async with cp.engine.connect() as conn:
        found = await conn.execute(
            text(
                f"SELECT version, base, {blob_column(backend)} "
                f"FROM {blobs_table(backend)} "
                "WHERE channel = 'messages' ORDER BY version"
            )
        )
        return list(found)


async def test_every_state_reads_back_as_langgraph_wrote_it(backend: Backend) -> None:
    """The same script on LangGraph's InMemorySaver and on tenxstore: every checkpoint
    of the history holds the same messages (edits, removals, a clear included), with a
    history limit that prunes on the way, and from a checkpointer that knows nothing."""
    saver = TenxCheckpointSaver(await backend.make(), history_limit=9).for_user("alice")
    ours, theirs = chat(saver), chat(InMemorySaver())
    for given in turns():
        mine = await ours.ainvoke({"messages": given}, run())
        expected = await theirs.ainvoke({"messages": given}, run())
        assert mine == expected
    kept = await history(ours, run())
    assert len(kept) >= 9
    assert kept == (await history(theirs, run()))[: len(kept)]
    if backend.name != "memory":  # a reader with nothing remembered reads the same
        fresh = TenxCheckpointSaver(await backend.make()).for_user("alice")
        assert await history(chat(fresh), run()) == kept


async def test_a_thread_moves_to_langgraphs_own_saver_and_goes_on(sql_backend: Backend) -> None:
    """The way out: every checkpoint of a tenxstore thread put into LangGraph's
    InMemorySaver in order, with its pending writes; the graph goes on there as on a
    thread that never left it. Versions must be in LangGraph's format for this: its
    savers continue a channel with 32-digit counters and compare versions as text (a
    shorter padding sorts after theirs, and no node would see a channel change)."""
    script = turns()
    half = len(script) // 2
    ours = chat(TenxCheckpointSaver(await sql_backend.make()).for_user("alice"))
    theirs = chat(InMemorySaver())
    for given in script[:half]:
        await ours.ainvoke({"messages": given}, run())
        await theirs.ainvoke({"messages": given}, run())
    saver: Any = ours.checkpointer
    target = InMemorySaver()
    for t in reversed([t async for t in saver.alist(run())]):  # oldest first
        parent = t.parent_config or run(checkpoint_ns="")
        parent = {"configurable": {**parent["configurable"], "thread_id": "t"}}
        stored = await target.aput(
            parent, t.checkpoint, t.metadata, dict(t.checkpoint["channel_versions"])
        )
        for task_id, channel, value in t.pending_writes or []:
            await target.aput_writes(stored, [(channel, value)], task_id)
    moved = chat(target)
    for given in script[half:]:
        assert await moved.ainvoke({"messages": given}, run()) == await theirs.ainvoke(
            {"messages": given}, run()
        )


async def test_a_list_that_grows_is_stored_as_what_it_gained(sql_backend: Backend) -> None:
    cp = await sql_backend.make(enforce_user_isolation=False)
    graph = chat(TenxCheckpointSaver(cp, history_limit=None))
    for n in range(60):
        await graph.ainvoke({"messages": [HumanMessage(f"message {n} " + "y" * 200)]}, run())
    rows = await blob_rows(cp, sql_backend)
    final = (await graph.aget_state(run())).values["messages"]
    whole = len(JsonPlusSerializer().dumps_typed(final)[1])
    assert len(final) == 120
    assert sum(r.base is not None for r in rows) > len(rows) // 2
    # stored whole at every version it would be ~60 times the last value
    assert sum(len(r.blob) for r in rows) < 6 * whole


async def test_a_none_value_is_kept_in_its_checkpoint(sql_backend: Backend) -> None:
    """A None value (a branch channel's, a cleared field) is kept inline in its
    checkpoint, not as a row of its own; every state reads back as written."""

    class Note(TypedDict):
        note: str | None
        count: int

    def step(state: Note) -> dict[str, Any]:
        count = state.get("count", 0) + 1
        return {"note": None if count % 2 else f"note {count}", "count": count}

    cp = await sql_backend.make(enforce_user_isolation=False)
    graph = StateGraph(Note).add_node("step", step).add_edge(START, "step")
    compiled = graph.add_edge("step", END).compile(checkpointer=TenxCheckpointSaver(cp))
    seen = []
    for _ in range(4):
        seen.append(await compiled.ainvoke({"note": "in"}, run()))
    assert seen[-1] == {"note": "note 4", "count": 4}
    history = [s.values async for s in compiled.aget_state_history(run())]
    assert {"note": None, "count": 3} in history and {"note": "note 2", "count": 2} in history
    async with cp.engine.connect() as conn:
        threads = blobs_table(sql_backend).replace("lg_blobs", "threads")
        found = await conn.execute(
            text(
                f"SELECT b.thread_id, b.type, b.{blob_column(sql_backend)}, t.incarnation, "
                f"t.user_id FROM {blobs_table(sql_backend)} b JOIN {threads} t "
                "ON t.thread_id = b.thread_id WHERE b.channel = 'note'"
            )
        )
        kinds = [  # opened first when the backend seals values (for the thread's life)
            JsonPlusSerializer().loads_typed(
                open_typed(cp.keys, r.type, bytes(r.blob), r.thread_id, BLOB, life_of(r))
            )
            for r in found
        ]
    assert None not in kinds and "note 4" in kinds


async def test_channel_versions_read_back_exactly_and_are_stored_once(
    sql_backend: Backend,
) -> None:
    """A checkpoint's channel versions read back as put — strings, integers, a float,
    a None value's version, an empty string (the mark of a None value inline), a
    channel name too long for the table's key — while a
    version the row's ``versions`` names is not stored again in the checkpoint blob."""
    cp = await sql_backend.make(enforce_user_isolation=False)
    saver = TenxCheckpointSaver(cp)
    long_name = "c" * 300
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"text": "hi", "count": 3, "none": None, long_name: [1]}
    checkpoint["channel_versions"] = {
        "text": "00000000000000000000000000000002.0.123",
        "count": 7,
        "none": "00000000000000000000000000000004.0.5",
        long_name: 2.5,
        "empty": "",
    }
    checkpoint["channel_values"]["empty"] = "e"
    put = await saver.aput(run(), checkpoint, {"source": "input", "step": -1}, {})
    for reader in (
        saver,
        TenxCheckpointSaver(await sql_backend.make(enforce_user_isolation=False)),
    ):
        got = await reader.aget_tuple(put)
        assert got is not None
        assert got.checkpoint["channel_versions"] == checkpoint["channel_versions"]
        assert got.checkpoint["channel_values"] == checkpoint["channel_values"]
    table = blobs_table(sql_backend).replace("lg_blobs", "lg_checkpoints")
    threads = blobs_table(sql_backend).replace("lg_blobs", "threads")
    async with cp.engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    f"SELECT c.type, c.checkpoint, t.incarnation, t.user_id FROM {table} c "
                    f"JOIN {threads} t ON t.thread_id = c.thread_id"
                )
            )
        ).one()
    stored = JsonPlusSerializer().loads_typed(
        open_typed(cp.keys, row.type, bytes(row.checkpoint), "t", CHECKPOINT, life_of(row))
    )
    assert stored["channel_versions"] == {
        "count": 7,
        "none": "00000000000000000000000000000004.0.5",
        long_name: 2.5,
        "empty": "",
    }


async def test_a_delta_is_written_only_on_the_row_it_was_made_from(
    sql_backend: Backend,
) -> None:
    """Two processes (two checkpointers, each remembering the last value it wrote). The
    first writes a thread. The second deletes it and writes it again with versions of
    the same names (a saver counting versions as integers) and other messages, then
    clears them and writes the first's messages again, with a reply. The first goes
    on from that head by its id (no read of the head, which would refresh what it
    remembers): its new value extends the bytes it remembers, but the row of that
    version now holds the second's messages — a delta on it would read back wrong. It
    must be stored whole."""

    class Counting(TenxCheckpointSaver):
        def get_next_version(self, current: Any, channel: None = None) -> Any:
            return (current or 0) + 1

    operator = AuthPolicy(enforce_user_isolation=False)
    first = Counting(await sql_backend.make(), auth_policy=operator)
    second = Counting(await sql_backend.make(), auth_policy=operator)
    said: list[AnyMessage] = []
    for n in range(3):
        said.append(HumanMessage(f"first {n}", id=f"f{n}"))
        await chat(first).ainvoke({"messages": [said[-1]]}, run())
        said.append(AIMessage(content=f"reply to {2 * n + 1}", id=f"ai-{2 * n + 1}"))
    remembered = await first.aget_tuple(run())
    assert remembered is not None
    await second.adelete_thread("t")
    for n in range(3):
        await chat(second).ainvoke({"messages": [HumanMessage(f"second {n}", id=f"s{n}")]}, run())
    again = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *said]
    await chat(second).ainvoke({"messages": again}, run())
    head = await second.aget_tuple(run())
    assert head is not None
    # The first's next checkpoint, put without reading the head (as a run that read
    # before the second wrote would): the messages of the head and one more.
    checkpoint = copy_checkpoint(head.checkpoint)
    checkpoint["id"] = str(uuid6(clock_seq=-2))
    messages = [*head.checkpoint["channel_values"]["messages"], HumanMessage("first", id="x")]
    checkpoint["channel_values"]["messages"] = messages
    version = first.get_next_version(max(checkpoint["channel_versions"].values()))
    checkpoint["channel_versions"]["messages"] = version
    await first.aput(
        head.config, checkpoint, {"source": "update", "step": 9}, {"messages": version}
    )
    expected = [m.content for m in said] + ["reply to 6", "first"]
    for reader in (first, second, Counting(await sql_backend.make(), auth_policy=operator)):
        state = await chat(reader).aget_state(run())
        assert [m.content for m in state.values["messages"]] == expected


async def test_a_value_held_is_read_only_from_its_own_row(sql_backend: Backend) -> None:
    """A read of the head does not fetch the chain of a value the process holds (its
    last write or read of the channel): only down to it, by its version and uid. So a
    process that fell behind (another wrote turns on top of its value) reads the rest
    of the chain, and one whose thread was deleted and written again under versions
    of the same names (other rows, other uids) reads the new rows, never its own."""

    class Counting(TenxCheckpointSaver):
        def get_next_version(self, current: Any, channel: None = None) -> Any:
            return (current or 0) + 1

    operator = AuthPolicy(enforce_user_isolation=False)
    behind = Counting(await sql_backend.make(), auth_policy=operator)
    other = Counting(await sql_backend.make(), auth_policy=operator)
    for n in range(3):
        await chat(behind).ainvoke({"messages": [HumanMessage(f"b{n}", id=f"b{n}")]}, run())
    for n in range(3):  # on top of what ``behind`` holds: deltas of its value
        await chat(other).ainvoke({"messages": [HumanMessage(f"o{n}", id=f"o{n}")]}, run())

    async def seen(saver: Any) -> list[Any]:
        state = await chat(saver).aget_state(run())
        return [m.content for m in state.values["messages"]]

    expected = [x for n in range(6) for x in ([f"b{n}"] if n < 3 else [f"o{n - 3}"])]
    expected = [x for i, h in enumerate(expected) for x in (h, f"reply to {2 * i + 1}")]
    assert await seen(behind) == expected
    await chat(behind).ainvoke({"messages": [HumanMessage("b3", id="b3")]}, run())
    expected += ["b3", "reply to 13"]
    fresh = Counting(await sql_backend.make(), auth_policy=operator)
    assert await seen(fresh) == await seen(other) == await seen(behind) == expected
    held = await behind.aget_tuple(run())
    # deleted and written again, the same number of turns: the same version names
    await other.adelete_thread("t")
    for n in range(7):
        await chat(other).ainvoke({"messages": [HumanMessage(f"n{n}", id=f"n{n}")]}, run())
    head = await other.aget_tuple(run())
    assert held is not None and head is not None
    assert head.checkpoint["channel_versions"] == held.checkpoint["channel_versions"]
    anew = [x for n in range(7) for x in (f"n{n}", f"reply to {2 * n + 1}")]
    assert await seen(behind) == await seen(fresh) == anew


async def test_a_chain_read_from_a_value_held_keeps_its_bound(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value rebuilt from one held counts the whole chain's depth: the next delta
    after ``MAX_DEPTH`` of them, by whichever process, is a whole value again."""
    monkeypatch.setattr(tenxstore.deltas, "MAX_DEPTH", 3)
    operator = AuthPolicy(enforce_user_isolation=False)
    savers = [TenxCheckpointSaver(await sql_backend.make(), auth_policy=operator) for _ in "ab"]
    for n in range(12):  # turns by turns, each process behind by one turn
        saver = savers[n % 2]
        await chat(saver).ainvoke({"messages": [HumanMessage(f"m{n}", id=f"m{n}")]}, run())
    rows = {r.version: r.base for r in await blob_rows(savers[0].checkpointer, sql_backend)}
    for version in rows:
        depth, at = 0, rows[version]
        while at is not None:
            depth, at = depth + 1, rows[at]
        assert depth <= 3, f"{version}: {depth} deltas in a row"


async def waiting_for_a_lock(pg_url: str, count: int) -> None:
    """Until ``count`` sessions of the test database wait for a lock (polled; no
    sleeps)."""
    conn = await asyncpg.connect(pg_url)
    try:
        while True:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"  # not another suite's, on the server
            )
            if waiting >= count:
                return
            await asyncio.sleep(0)  # let the other tasks run
    finally:
        await conn.close()


async def test_a_put_again_racing_a_one_statement_child_loses_nothing(
    tmp_path: Path,
) -> None:
    """The head C is put again on the locked path with other messages at the same
    version V, while another process puts C's child D as a delta on V in one
    statement, whose snapshot predates the put-again (its thread lock wait ends after
    it). The put-again takes C's mark away: D is not written on V's old bytes (it
    takes the locked path, which sees V's new row), and D reads back as written."""
    async with backend_for("postgresql", tmp_path) as pg:
        assert pg.url is not None and pg.schema is not None
        first = TenxCheckpointSaver(await pg.make(enforce_user_isolation=False))
        second = TenxCheckpointSaver(await pg.make(enforce_user_isolation=False))
        for text_ in ("m1", "m2"):
            await chat(first).ainvoke({"messages": [HumanMessage(text_, id=text_)]}, run())
        head = await second.aget_tuple(run())  # the second remembers messages@V
        assert head is not None and head.parent_config is not None
        c_id = head.checkpoint["id"]
        version = head.checkpoint["channel_versions"]["messages"]
        again = copy_checkpoint(head.checkpoint)
        again["channel_values"]["messages"] = [HumanMessage("other " * 20, id="o1")]
        parent = head.parent_config["configurable"]["checkpoint_id"]
        config_again = run(checkpoint_id=parent, _checkpoint_head=c_id)
        child = copy_checkpoint(head.checkpoint)
        child["id"] = str(uuid6(clock_seq=-2))
        written = [*head.checkpoint["channel_values"]["messages"], HumanMessage("d", id="d")]
        child["channel_values"]["messages"] = written
        child_version = second.get_next_version(version)
        child["channel_versions"]["messages"] = child_version
        holder = await asyncpg.connect(pg.url)
        try:
            hold = holder.transaction()
            await hold.start()
            await holder.execute(
                f'SELECT 1 FROM "{pg.schema}".lg_checkpoints WHERE checkpoint_id = $1 FOR UPDATE',
                c_id,
            )
            put_again = asyncio.create_task(
                first.aput(config_again, again, head.metadata, {"messages": version})
            )
            await waiting_for_a_lock(pg.url, 1)  # it holds the thread, waits for row C
            put_child = asyncio.create_task(
                second.aput(
                    head.config, child, {"source": "loop", "step": 9}, {"messages": child_version}
                )
            )
            await waiting_for_a_lock(pg.url, 2)  # its snapshot taken, it waits too
            await hold.rollback()
        finally:
            await holder.close()
        await asyncio.gather(put_again, put_child)  # both commit: the child on C
        reader = TenxCheckpointSaver(await pg.make(enforce_user_isolation=False))
        found = await reader.aget_tuple(run(checkpoint_id=child["id"]))
        assert found is not None
        assert found.checkpoint["channel_values"]["messages"] == written


@pytest.mark.parametrize("how", ["delete_for_runs", "aprune_delete"])
async def test_a_one_statement_put_racing_a_delete_writes_nothing(tmp_path: Path, how: str) -> None:
    """Another process deletes the head C (its run's checkpoints, or the thread's
    whole history) on the locked path while a put of C's child D runs as one
    statement whose snapshot predates the delete (its thread lock wait ends after
    it): the delete takes the namespace's head mark away, so D is not written on a
    parent and values that are gone — it takes the locked path, which says C is
    gone."""
    async with backend_for("postgresql", tmp_path) as pg:
        assert pg.url is not None and pg.schema is not None
        operator = AuthPolicy(enforce_user_isolation=False)
        first = TenxCheckpointSaver(await pg.make(), auth_policy=operator)
        second = TenxCheckpointSaver(await pg.make(), auth_policy=operator)
        config = run()
        for step in range(2):
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"step": step}
            checkpoint["channel_versions"] = {"step": first.get_next_version(None, None)}
            checkpoint["id"] = str(uuid6(clock_seq=step))
            config = await first.aput(
                config, checkpoint, {"source": "loop", "step": step, "run_id": "r1"}, {}
            )
        head = await second.aget_tuple(run())
        assert head is not None
        child = copy_checkpoint(head.checkpoint)
        child["id"] = str(uuid6(clock_seq=9))
        child["channel_values"] = {"step": 2}
        version = second.get_next_version(head.checkpoint["channel_versions"]["step"], None)
        child["channel_versions"] = {"step": version}
        holder = await asyncpg.connect(pg.url)
        try:
            hold = holder.transaction()
            await hold.start()
            await holder.execute(
                f'SELECT 1 FROM "{pg.schema}".threads WHERE thread_id = $1 FOR UPDATE', "t"
            )
            if how == "delete_for_runs":
                deleting = asyncio.create_task(first.adelete_for_runs(["r1"]))
            else:
                deleting = asyncio.create_task(first.aprune(["t"], strategy="delete"))
            await waiting_for_a_lock(pg.url, 1)  # it waits for the thread's lock
            put_child = asyncio.create_task(
                second.aput(head.config, child, {"source": "loop", "step": 2}, {"step": version})
            )
            await waiting_for_a_lock(pg.url, 2)  # its snapshot taken, it waits too
            await hold.rollback()
        finally:
            await holder.close()
        await deleting
        with pytest.raises(StaleStateError):
            await put_child
        reader = TenxCheckpointSaver(await pg.make(), auth_policy=operator)
        assert await reader.aget_tuple(run(checkpoint_id=child["id"])) is None
        assert [t async for t in reader.alist(run())] == []


async def test_a_damaged_chain_is_an_error_not_a_wrong_value(sql_backend: Backend) -> None:
    cp = await sql_backend.make(enforce_user_isolation=False)
    graph = chat(TenxCheckpointSaver(cp))
    for n in range(4):
        await graph.ainvoke({"messages": [HumanMessage(f"message {n}")]}, run())
    based = [r for r in await blob_rows(cp, sql_backend) if r.base is not None]
    assert based
    async with cp.engine.begin() as conn:
        await conn.execute(
            text(f"DELETE FROM {blobs_table(sql_backend)} WHERE version = :v"),
            {"v": based[-1].base},
        )
    fresh = chat(TenxCheckpointSaver(await sql_backend.make(enforce_user_isolation=False)))
    with pytest.raises(SerializationError, match="channel 'messages'"):
        await fresh.aget_state(run())


async def test_puts_and_prunes_racing_lose_nothing(sql_backend: Backend) -> None:
    """A run writing turn after turn while another process prunes the thread again and
    again (aprune keeps each namespace's newest): every turn commits, and the head reads
    back whole, from the writer and from a checkpointer that remembers nothing."""
    operator = AuthPolicy(enforce_user_isolation=False)
    writer = TenxCheckpointSaver(await sql_backend.make(), auth_policy=operator)
    pruner = TenxCheckpointSaver(await sql_backend.make(), auth_policy=operator)
    graph = chat(writer)
    await graph.ainvoke({"messages": [HumanMessage("start", id="h-start")]}, run())
    done = asyncio.Event()

    async def prune() -> int:
        count = 0
        while not done.is_set():
            await pruner.aprune(["t"])
            count += 1
            await asyncio.sleep(0)
        return count

    pruning = asyncio.create_task(prune())
    try:
        for n in range(25):
            await graph.ainvoke({"messages": [HumanMessage(f"turn {n}", id=f"h{n}")]}, run())
    finally:
        done.set()
        prunes = await pruning
    assert prunes > 1
    expected = ["start", "reply to 1"]
    for n in range(25):
        expected += [f"turn {n}", f"reply to {2 * n + 3}"]
    reader = TenxCheckpointSaver(await sql_backend.make(), auth_policy=operator)
    for saver in (writer, reader):
        state = await chat(saver).aget_state(run())
        assert [m.content for m in state.values["messages"]] == expected


async def test_a_downgrade_writes_every_value_whole(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    cp = tenxstore.CheckpointRepository(url, enforce_user_isolation=False)
    await cp.asetup()
    graph = chat(TenxCheckpointSaver(cp, history_limit=None))
    for n in range(20):
        await graph.ainvoke({"messages": [HumanMessage(f"message {n}", id=f"h{n}")]}, run())
    assert any(r.base is not None for r in await blob_rows(cp, Backend("sqlite")))
    await migrate.downgrade(cp.backend, revision="0005_langgraph_storage")
    await cp.aclose()
    serde = JsonPlusSerializer()
    with sqlite3.connect(tmp_path / "d.db") as raw:
        found = raw.execute(
            "SELECT type, blob FROM lg_blobs WHERE channel = 'messages' ORDER BY version"
        ).fetchall()
        columns = [row[1] for row in raw.execute("PRAGMA table_info(lg_blobs)")]
    assert "base" not in columns
    lengths = [len(serde.loads_typed((kind, bytes(blob)))) for kind, blob in found]
    assert lengths == sorted(lengths) and lengths[-1] == 40
    again = tenxstore.CheckpointRepository(url, enforce_user_isolation=False)
    await again.asetup()  # up to head again: the whole values read as they are
    try:
        state = await chat(TenxCheckpointSaver(again)).aget_state(run())
        assert len(state.values["messages"]) == 40
    finally:
        await again.aclose()


async def test_a_downgrade_writes_the_channel_versions_back(sql_backend: Backend) -> None:
    """Below 0007 every checkpoint blob holds its channel versions again (an older
    tenxstore reads them there), a None value's and an unnamed one's included; up
    again, every checkpoint reads back as before."""
    cp = await sql_backend.make(enforce_user_isolation=False)
    saver = TenxCheckpointSaver(cp, history_limit=None)
    graph = chat(saver)
    for n in range(4):
        await graph.ainvoke({"messages": [HumanMessage(f"message {n}", id=f"h{n}")]}, run())
    before = [t.checkpoint async for t in saver.alist(run())]
    await migrate.downgrade(cp.backend, revision="0006_langgraph_deltas", schema=sql_backend.schema)
    table = blobs_table(sql_backend).replace("lg_blobs", "lg_checkpoints")
    async with cp.engine.connect() as conn:
        found = await conn.execute(
            text(f"SELECT type, checkpoint FROM {table} ORDER BY checkpoint_id DESC")
        )
        rows = found.all()
    if sql_backend.keys is None:
        raw = [JsonPlusSerializer().loads_typed((r.type, bytes(r.checkpoint))) for r in rows]
        assert [c["channel_versions"] for c in raw] == [c["channel_versions"] for c in before]
    else:  # sealed checkpoints are left as they are: a release before 0007 cannot open them
        assert rows and all(r.type == "!msgpack" for r in rows)
    await migrate.upgrade(cp.backend, schema=sql_backend.schema, revision="head")
    again = TenxCheckpointSaver(await sql_backend.make(enforce_user_isolation=False))
    assert [t.checkpoint async for t in again.alist(run())] == before


def test_a_delta_is_exactly_the_bytes_appended() -> None:
    serde = JsonPlusSerializer()
    values: list[Any] = []
    rows: dict[str, Stored] = {}
    base = None
    for n in range(3 * MAX_DEPTH):  # over fixarray, array16 and several whole values
        values = [*values, {"n": n, "text": "é" * (n % 5)}]
        write = blob_write("c", f"{n:04}", serde.dumps_typed(values), base)
        rows[write.version] = Stored(
            write.type,
            write.blob,
            None if write.base is None else write.base.version,
            write.splice,
            write.skip,
            write.uid,
        )
        base = write.remembered()
        assert base.depth <= MAX_DEPTH
        assert rebuild(rows, write.version)[1] == serde.dumps_typed(values)[1]
    assert sum(r.base is None for r in rows.values()) >= 3
    assert delta(serde.dumps_typed([1, 2])[1], serde.dumps_typed([2, 1, 3])[1]) is None
    assert delta(serde.dumps_typed({"a": 1})[1], serde.dumps_typed({"a": 1, "b": 2})[1]) is None
    edited = blob_write("c", "x", serde.dumps_typed([*values[:-1], {"n": -1}]), base)
    assert edited.base is None
