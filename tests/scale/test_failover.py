"""A PostgreSQL failover under load, on a real primary and standby (streaming
replication, on loopback): nothing acknowledged is lost, every error is typed, no call
hangs, and the store goes on on the new primary without a restart.

Writers and readers run while the primary is killed (an immediate stop: a crash),
the standby promoted and the old primary rewound and rejoined as the new standby,
round after round. Every acknowledged ``(thread, version, state)`` is recorded; the
surviving primary must hold each exactly, and no version is acknowledged twice with
different states (a lost update). A tool call whose success was acknowledged is
succeeded on the new primary (its body never runs again), and a LangGraph thread keeps
every turn acknowledged. With synchronous replication that is 0 lost; with asynchronous replication
the number lost is counted and printed (that configuration's window), not asserted.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tenxstore import (
    CheckpointRepository,
    ConnectionLost,
    DatabaseUnavailable,
    StaleStateError,
    TenxStoreError,
)
from tests.replication import PgPair, started

pytestmark = pytest.mark.slow  # two PostgreSQL servers per test: run once in CI

CONNECT_TIMEOUT = 2.0  # seconds: the URL's connect_timeout
LOCK_TIMEOUT = 3.0  # seconds: the store's lock_timeout
# No call may take longer: a lost server is noticed within connect_timeout, a lock within
# lock_timeout; the margin is for a CI machine running two suites on two cores.
BOUND = CONNECT_TIMEOUT + LOCK_TIMEOUT + 5.0
THREADS, WRITERS_PER_THREAD, READERS = 4, 2, 2
ROUNDS = 2  # failovers per test (and as many rejoins)


@dataclass
class Ledger:
    """What the clients saw: acknowledged writes, uncertain ones, errors by type."""

    acked: dict[str, dict[int, Any]] = field(default_factory=lambda: collections.defaultdict(dict))
    twice: list[tuple[str, int]] = field(default_factory=list)  # a version acked twice
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    hangs: int = 0
    ok_writes: int = 0
    ok_reads: int = 0
    progress: asyncio.Event = field(default_factory=asyncio.Event)  # set by each ack
    last_ack: float = field(default_factory=time.monotonic)
    longest_gap: float = 0.0  # seconds: the longest time with no write acknowledged
    tools_done: dict[str, Any] = field(default_factory=dict)  # call id -> acked result
    tools_ran_again: list[str] = field(default_factory=list)  # a success claimed anew
    graph_turns: int = 0  # turns a LangGraph run acknowledged

    def ack(self, thread: str, version: int, state: Any) -> None:
        seen = self.acked[thread].get(version)
        if seen is not None and seen != state:
            self.twice.append((thread, version))
        self.acked[thread][version] = state
        self.ok_writes += 1
        self.progress.set()
        now = time.monotonic()
        self.longest_gap = max(self.longest_gap, now - self.last_ack)
        self.last_ack = now

    def failed(self, exc: BaseException) -> None:
        """An error a call raised, counted by type (a lost connection by what is known
        of its write: ``committed`` False, or None when it may have been applied)."""
        name = type(exc).__name__
        if isinstance(exc, ConnectionLost):
            name += f"(committed={exc.committed})"
        self.errors[name] += 1


@pytest.fixture(params=["synchronous", "asynchronous"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PgPair]:
    with started(tmp_path, synchronous=request.param == "synchronous") as nodes:
        yield nodes


@pytest.fixture
def async_pair(tmp_path: Path) -> Iterator[PgPair]:
    """One asynchronous pair (the tests that are about a standby, not about its mode)."""
    with started(tmp_path, synchronous=False) as nodes:
        yield nodes


async def bounded(call: Any, ledger: Ledger) -> Any:
    """``call`` awaited within :data:`BOUND`; a hang past it is counted (and raised)."""
    try:
        return await asyncio.wait_for(call, BOUND)
    except asyncio.TimeoutError:
        ledger.hangs += 1
        raise


async def writer(
    repo: CheckpointRepository, thread: str, me: int, ledger: Ledger, stop: asyncio.Event
) -> None:
    config: dict[str, Any] = {"configurable": {"thread_id": thread, "user_id": "u"}}
    step = 0
    fresh = True
    while not stop.is_set():
        step += 1
        try:
            if fresh:  # (re)read the head: the version this writer builds on
                await bounded(repo.aget_state(config), ledger)
                fresh = False
            state = {"writer": me, "step": step}
            version = await bounded(repo.aput_checkpoint(config, state), ledger)
            ledger.ack(thread, version, state)
        except StaleStateError:
            fresh = True  # the other writer of the thread got there first
        except asyncio.TimeoutError:
            fresh = True
        except TenxStoreError as exc:
            ledger.failed(exc)
            fresh = True
            await asyncio.sleep(0.05)  # back off while there is no primary (not a sync)


async def reader(repo: CheckpointRepository, ledger: Ledger, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        config = {"configurable": {"thread_id": f"t{n % THREADS}", "user_id": "u"}}
        try:
            await bounded(repo.aget_state(config), ledger)
            ledger.ok_reads += 1
        except asyncio.TimeoutError:
            pass
        except TenxStoreError as exc:
            ledger.failed(exc)
            await asyncio.sleep(0.05)  # back off while there is no primary (not a sync)


async def tools(repo: CheckpointRepository, ledger: Ledger, stop: asyncio.Event) -> None:
    """Tool calls through the ledger: claim, run (counted), complete. A call whose
    completion was acknowledged is claimed again at once: it must come back succeeded,
    so the tool never runs twice. A claim of unknown outcome goes on under a new id
    (the old one may hold a live lease)."""
    config = {"configurable": {"thread_id": "tools", "user_id": "u"}}
    n = 0
    while not stop.is_set():
        n += 1
        call = f"call-{n}"
        try:
            claim = await bounded(
                repo.abegin_tool_execution(config, call, "charge", {"n": n}), ledger
            )
            if claim.status != "succeeded":
                await bounded(repo.acomplete_tool_execution(config, call, {"charged": n}), ledger)
            ledger.tools_done[call] = {"charged": n}
            again = await bounded(
                repo.abegin_tool_execution(config, call, "charge", {"n": n}), ledger
            )
            if again.status != "succeeded":
                ledger.tools_ran_again.append(call)
        except asyncio.TimeoutError:
            pass
        except TenxStoreError as exc:
            ledger.failed(exc)
            await asyncio.sleep(0.05)  # back off while there is no primary (not a sync)


def chat(repo: CheckpointRepository) -> Any:
    """A LangGraph chat on the store: each turn appends the input and one reply."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    from tenxstore.langgraph import TenxCheckpointSaver

    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [("ai", f"reply {len(state['messages'])}")]}

    saver = TenxCheckpointSaver(repo).for_user("u")
    graph = StateGraph(MessagesState).add_node("reply", reply)
    return graph.add_edge(START, "reply").add_edge("reply", END).compile(checkpointer=saver)


async def graph_turns(repo: CheckpointRepository, ledger: Ledger, stop: asyncio.Event) -> None:
    """LangGraph turns on one thread; ``graph_turns`` counts the acknowledged ones (a
    turn that failed is run again, from whatever the thread holds)."""
    graph = chat(repo)
    config = {"configurable": {"thread_id": "graph"}}
    while not stop.is_set():
        try:
            await bounded(graph.ainvoke({"messages": [("user", "hi")]}, config), ledger)
            state = await bounded(graph.aget_state(config), ledger)
            # the most turns ever acknowledged: a failover that lost some shows as fewer
            ledger.graph_turns = max(ledger.graph_turns, len(state.values["messages"]) // 2)
        except asyncio.TimeoutError:
            pass
        except TenxStoreError as exc:
            ledger.failed(exc)
            await asyncio.sleep(0.05)  # back off while there is no primary (not a sync)


async def writes_between(ledger: Ledger, count: int) -> None:
    """Until ``count`` more writes were acknowledged."""
    goal = ledger.ok_writes + count
    while ledger.ok_writes < goal:
        ledger.progress.clear()
        await ledger.progress.wait()


async def lost_on(pair: PgPair, acked: dict[str, dict[int, Any]]) -> list[tuple[str, int]]:
    """The acknowledged ``(thread, version)`` the current primary does not hold as
    acknowledged, read by a store that knows nothing of the run."""
    missing = []
    async with CheckpointRepository(pair.url(pair.primary)) as check:
        for thread, versions in acked.items():
            config = {"configurable": {"thread_id": thread, "user_id": "u"}}
            stored = {s.version: s.state for s in await check.alist_states(config, 100_000)}
            missing += [(thread, v) for v, state in versions.items() if stored.get(v) != state]
    return missing


async def test_a_failover_under_load_loses_nothing_acknowledged(pair: PgPair) -> None:
    url = f"{pair.multi_host_url()}&connect_timeout={CONNECT_TIMEOUT:g}"
    repo = CheckpointRepository(url, lock_timeout=LOCK_TIMEOUT, state_history_limit=100_000)
    await repo.asetup()
    ledger = Ledger()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(writer(repo, f"t{t}", t * WRITERS_PER_THREAD + w, ledger, stop))
        for t in range(THREADS)
        for w in range(WRITERS_PER_THREAD)
    ] + [asyncio.create_task(reader(repo, ledger, stop)) for _ in range(READERS)]
    tasks += [
        asyncio.create_task(tools(repo, ledger, stop)),
        asyncio.create_task(graph_turns(repo, ledger, stop)),
    ]
    no_primary: list[float] = []
    try:
        for _ in range(ROUNDS):
            await asyncio.wait_for(writes_between(ledger, 200), 60)  # load on the primary
            no_primary.append(await asyncio.to_thread(pair.failover))
            # the store goes on on the new primary (else this times out: the test fails)
            await asyncio.wait_for(writes_between(ledger, 100), 60)
            await asyncio.to_thread(pair.rejoin)
        await asyncio.wait_for(writes_between(ledger, 100), 60)
    finally:
        stop.set()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
    assert [e for e in ended if e is not None] == []  # no worker died of an untyped error
    # On the surviving primary, with a store that knows nothing of the run.
    missing = await lost_on(pair, ledger.acked)
    lost = len(missing)
    async with CheckpointRepository(pair.url(pair.primary)) as check:
        done = 0
        for call, result in ledger.tools_done.items():
            stored = await check.aget_tool_execution(
                {"configurable": {"thread_id": "tools", "user_id": "u"}}, call
            )
            done += stored is not None and stored.status == "succeeded" and stored.result == result
        graph = chat(check)
        kept = await graph.aget_state({"configurable": {"thread_id": "graph"}})
        kept_turns = len(kept.values.get("messages", [])) // 2
    await repo.aclose()
    print(
        f"\n{'sync' if pair.synchronous else 'async'} replication: {ROUNDS} failovers, "
        f"no primary for {', '.join(f'{s:.2f}' for s in no_primary)} s, "
        f"no write acknowledged for {ledger.longest_gap:.2f} s at most; "
        f"{ledger.ok_writes} writes and {ledger.ok_reads} reads acknowledged, "
        f"{lost} acknowledged writes lost, {len(ledger.twice)} versions acknowledged twice; "
        f"errors: {dict(ledger.errors)}; calls past {BOUND:g} s: {ledger.hangs}; "
        f"tool calls {done}/{len(ledger.tools_done)} succeeded as acknowledged, "
        f"{len(ledger.tools_ran_again)} claimed anew after success; graph turns "
        f"{kept_turns} kept of {ledger.graph_turns} acknowledged"
    )
    assert ledger.hangs == 0
    typed = {
        "DatabaseUnavailable",
        "LockTimeout",
        *(f"ConnectionLost(committed={c})" for c in (False, None)),
    }
    assert set(ledger.errors) <= typed
    assert ledger.tools_ran_again == []  # on the primary that acknowledged the success
    if pair.synchronous:
        assert lost == 0, missing[:10]
        assert ledger.twice == []
        assert done == len(ledger.tools_done)
        assert kept_turns >= ledger.graph_turns


async def test_a_standby_is_never_written_to(async_pair: PgPair) -> None:
    """A URL naming only the standby: with ``target_session_attrs=read-write`` nothing
    connects (``DatabaseUnavailable``, saying why); without it, a write reaches the
    standby and is refused there, as tenxstore's error; nothing is written either way."""
    nodes = async_pair
    assert nodes.standby is not None
    standby = nodes.url(nodes.standby)
    config = {"configurable": {"thread_id": "t", "user_id": "u"}}
    async with CheckpointRepository(nodes.url(nodes.primary)) as primary:
        await primary.asetup()
    # asynchronous replication: the standby holds the schema once it has replayed it
    nodes.wait_sql(
        nodes.standby,
        "SELECT count(*) FROM pg_tables WHERE tablename = 'tenxstore_store'",
        "1",
        "the standby replaying the schema",
    )
    for url, why in (
        (f"{standby}?target_session_attrs=read-write", "target_session_attrs"),
        (standby, "read-only"),
    ):
        async with CheckpointRepository(url) as repo:
            with pytest.raises(DatabaseUnavailable, match=why):
                await repo.aput_checkpoint(config, {"n": 1})
    async with CheckpointRepository(nodes.url(nodes.primary)) as primary:
        assert await primary.aget_state(config) is None


async def test_an_asynchronous_standby_loses_what_it_had_not_received(async_pair: PgPair) -> None:
    """The window of asynchronous replication, made wide: the standby's stream is cut,
    writes go on being acknowledged by the primary alone, the primary dies and the
    standby is promoted. Exactly those writes are lost, and the check above counts
    them (it can fail)."""
    nodes = async_pair
    standby = nodes.standby
    assert standby is not None
    repo = CheckpointRepository(nodes.multi_host_url(), state_history_limit=1000)
    await repo.asetup()
    config: dict[str, Any] = {"configurable": {"thread_id": "t", "user_id": "u"}}
    acked: dict[str, dict[int, Any]] = {"t": {}}
    for n in range(10):
        acked["t"][await repo.aput_checkpoint(config, {"n": n})] = {"n": n}
    sent = nodes.sql(nodes.primary, "SELECT pg_current_wal_lsn()")
    received = f"SELECT pg_last_wal_receive_lsn() >= '{sent}'::pg_lsn"
    await asyncio.to_thread(nodes.wait_sql, standby, received, "t", "the standby received")
    nodes.sql(standby, "ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()")
    await asyncio.to_thread(
        nodes.wait_sql,
        standby,
        "SELECT count(*) FROM pg_stat_wal_receiver",
        "0",
        "the standby's stream cut",
    )
    unseen = {}
    for n in range(10, 30):
        unseen[await repo.aput_checkpoint(config, {"n": n})] = {"n": n}
    acked["t"].update(unseen)
    await asyncio.to_thread(nodes.failover)
    await repo.aclose()
    assert sorted(await lost_on(nodes, acked)) == [("t", v) for v in sorted(unseen)]


async def test_a_primary_fenced_read_only_is_left_for_the_new_one(async_pair: PgPair) -> None:
    """A primary demoted in place (fenced read-only, its sessions still open) while the
    standby is promoted: a write on a pooled connection to the old primary is refused
    (``DatabaseUnavailable``, nothing written) and that connection is discarded, so the
    writes that follow reach the new primary — on the hot path (a state write) and on
    SQLAlchemy's (a thread record) alike, without waiting for the pool's recycle."""
    nodes = async_pair
    old = nodes.primary
    async with CheckpointRepository(nodes.multi_host_url()) as repo:
        await repo.asetup()
        config: dict[str, Any] = {"configurable": {"thread_id": "t", "user_id": "u"}}
        await asyncio.gather(
            *(
                repo.aput_thread({"configurable": {"thread_id": f"p{n}", "user_id": "u"}})
                for n in range(4)
            )
        )
        await repo.aput_checkpoint(config, {"n": 0})
        nodes.sql(old, "ALTER SYSTEM SET default_transaction_read_only = on")
        nodes.sql(old, "SELECT pg_reload_conf()")
        await asyncio.to_thread(nodes.promote)
        refused = 0
        for write in (  # SQLAlchemy's path first: the hot path's discard drops all
            lambda: repo.aput_thread(config, name="after"),
            lambda: repo.aput_checkpoint(config, {"n": 1}),
        ):
            for _ in range(10):  # each refusal discards one pooled connection
                try:
                    await write()
                    break
                except DatabaseUnavailable as exc:
                    assert "read-only" in str(exc)
                    refused += 1
            else:
                raise AssertionError("every write was refused: the fenced node was kept")
        assert refused <= 8  # at most the connections the pool had open
        state = await repo.aget_state(config)
        assert state == {"n": 1}
    async with CheckpointRepository(nodes.url(nodes.primary)) as fresh:
        assert await fresh.aget_state(config) == {"n": 1}
        threads = await fresh.alist_threads({"configurable": {"user_id": "u"}})
        assert "after" in [t.name for t in threads]
