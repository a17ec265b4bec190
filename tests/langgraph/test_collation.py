"""Pending writes come back in LangGraph's order — Python's order of ``(task_path,
task_id, idx)`` — on a PostgreSQL database whose locale orders text otherwise
(``en-US`` puts ``"alpha"`` before ``"Beta"``, Python the other way round). The order
decides a channel's value where writes are replayed: a DeltaChannel rebuilt from its
ancestors' writes, or a step resumed from its pending writes."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

import tenxstore
from tenxstore.langgraph import TenxCheckpointSaver
from tests import services
from tests.conftest import drop_schema, new_schema


@pytest.fixture
async def en_us_url() -> AsyncIterator[str]:
    """A schema in a PostgreSQL database with the ICU ``en-US`` collation (created
    once per server and kept; named after the test database, so parallel suites on
    their own databases do not meet)."""
    parts = urlsplit(services.pg_url())
    name = f"{parts.path.lstrip('/') or 'postgres'}_en_us"
    admin = await asyncpg.connect(services.pg_url())
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            # another suite may make it meanwhile
            with contextlib.suppress(asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
                await admin.execute(
                    f'CREATE DATABASE "{name}" TEMPLATE template0 '
                    "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
                )
    finally:
        await admin.close()
    url = urlunsplit(parts._replace(path=f"/{name}"))
    check = await asyncpg.connect(url)
    try:  # the premise: this database's own order is not Python's
        assert await check.fetchval("SELECT 'alpha' < 'Beta'") is True
        assert not "alpha" < "Beta"
    finally:
        await check.close()
    yield url


@pytest.fixture
async def saver(en_us_url: str) -> AsyncIterator[TenxCheckpointSaver]:
    schema = new_schema()
    repository = tenxstore.CheckpointRepository(en_us_url, schema=schema)
    await repository.asetup()
    try:
        yield TenxCheckpointSaver(repository).for_user("alice")
    finally:
        await repository.aclose()
        await drop_schema(en_us_url, schema)


def _extend(state: list[str], writes: Any) -> list[str]:
    out = list(state or [])
    for write in writes:
        out.extend(write)
    return out


class Team(TypedDict):
    said: Annotated[list[str], operator.add]
    notes: Annotated[list[str], DeltaChannel(_extend)]


def team(saver: Any) -> Any:
    """Two nodes in one step, ``alpha`` and ``Beta``, each appending to a plain list
    and to a DeltaChannel: LangGraph applies their writes in task-path order."""

    def speak(name: str) -> Any:
        return lambda state: {"said": [f"{name} {len(state['said'])}"], "notes": [name]}

    return (
        StateGraph(Team)
        .add_node("alpha", speak("alpha"))
        .add_node("Beta", speak("Beta"))
        .add_edge(START, "alpha")
        .add_edge(START, "Beta")
        .compile(checkpointer=saver)
    )


async def history(graph: Any) -> list[Any]:
    config = {"configurable": {"thread_id": "t"}}
    for turn in range(3):
        await graph.ainvoke({"said": [f"turn {turn}"], "notes": []}, config)
    return [(s.values, s.next) async for s in graph.aget_state_history(config)]


async def test_a_delta_channel_replays_writes_in_langgraphs_order(
    saver: TenxCheckpointSaver,
) -> None:
    expected = await history(team(InMemorySaver()))
    assert await history(team(saver)) == expected


async def test_pending_writes_come_back_in_langgraphs_order(saver: TenxCheckpointSaver) -> None:
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    checkpoint = {**empty_checkpoint(), "id": str(uuid6())}
    stored = await saver.aput(config, checkpoint, {"source": "loop", "step": 0}, {})
    paths = ["~__pregel_pull, alpha", "~__pregel_pull, Beta", "~__pregel_push, 0", ""]
    for n, path in enumerate(paths):
        for task_id in (f"b-{n}", f"A-{n}"):
            await saver.aput_writes(stored, [("said", f"{path}/{task_id}")], task_id, path)
    found = await saver.aget_tuple(stored)
    assert found is not None
    order = sorted(
        (path, task_id) for n, path in enumerate(paths) for task_id in (f"b-{n}", f"A-{n}")
    )
    assert [w[0] for w in found.pending_writes] == [task_id for _, task_id in order]
