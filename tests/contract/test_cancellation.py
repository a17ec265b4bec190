"""Calls cancelled mid-flight (``asyncio.wait_for`` timeouts, a client gone) under
concurrency: they leave no lock held, no transaction open and nothing for asyncio to
complain about afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from tenxstore import InMemoryCheckpointer, SqliteCheckpointer
from tenxstore.langgraph import TenxCheckpointSaver
from tests.conftest import backend_for, cfg

TASKS = 8
ROUNDS = 100


def timeout_of(round_: int, task: int) -> float:
    """Timeouts spread over 0-30 ms, different for each task and round: each call is
    cancelled at another point of its way (waiting its turn, in BEGIN, mid-statement,
    at COMMIT, giving its connection back), or not at all."""
    return ((round_ * 7 + task * 11) % 31) / 1000


def calls(cp: Any, saver: TenxCheckpointSaver, round_: int) -> list[Callable[[], Awaitable[Any]]]:
    """One write of each kind (the one-hop path, the locked path, the ledger's, the
    LangGraph saver's) and a read-then-write, on a few threads that they share."""

    def thread(task: int) -> dict[str, Any]:
        return cfg(f"t{(round_ + task) % 5}", "u")

    async def read_then_write(task: int) -> None:
        config = thread(task)
        await cp.aget_state(config)
        await cp.aput_state(config, {"round": round_, "task": task})

    def checkpoint(task: int) -> Awaitable[Any]:
        values = empty_checkpoint()
        values["channel_values"] = {"round": round_}
        values["channel_versions"] = {"round": saver.get_next_version(None, None)}
        config = {"configurable": {"thread_id": f"lg{task % 3}", "checkpoint_ns": ""}}
        return saver.aput(config, values, {"step": round_}, {})

    kinds: list[Callable[[int], Awaitable[Any]]] = [
        lambda task: cp.aput_state(thread(task), {"round": round_}),
        lambda task: cp.aput_checkpoint(
            thread(task), {"round": round_}, [{"role": "user", "content": f"m{round_}"}]
        ),
        read_then_write,
        lambda task: cp.aput_thread(thread(task), name=f"r{round_}"),
        lambda task: cp.abegin_tool_execution(thread(task), f"c{round_}-{task}", "tool", {}),
        checkpoint,
        lambda task: cp.aclean_thread(thread(task)),
        lambda task: cp.aput_state(cfg(f"new-{round_}-{task}", "u"), {"new": True}),
    ]
    return [lambda task=task: kinds[task % len(kinds)](task) for task in range(TASKS)]


async def cancelled_round(cp: Any, saver: TenxCheckpointSaver, round_: int) -> None:
    """``TASKS`` calls at once, each under ``wait_for`` with its own timeout; whatever
    they raise (a timeout, a stale version, a claim in progress) is theirs."""

    async def one(task: int, call: Callable[[], Awaitable[Any]]) -> None:
        with contextlib.suppress(Exception):  # any outcome of the call itself is allowed
            await asyncio.wait_for(call(), timeout_of(round_, task))

    await asyncio.gather(*(one(task, call) for task, call in enumerate(calls(cp, saver, round_))))


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_sqlite_cancelled_writes_never_leave_a_lock_held(kind: str, tmp_path: Path) -> None:
    """A write cancelled mid-statement used to leave its aiosqlite connection closed
    as a "zombie" that kept its locks (SQLAlchemy invalidates the connection of a
    cancelled call; SQLite keeps the transaction and the read of a connection closed
    with a statement in progress until that statement is freed) after every task had
    finished, until the garbage collector ran: the file's write lock (the next write
    waited out its lock_timeout: LockTimeout), an in-memory database's table locks
    (the next write: LockTimeout at once)."""
    path = tmp_path / "cancelled.db"
    cp: Any
    if kind == "sqlite":
        cp = SqliteCheckpointer(str(path), enforce_user_isolation=False, lock_timeout=5)
    else:
        cp = InMemoryCheckpointer(enforce_user_isolation=False)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)  # no busy wait at all
    try:
        await cp.asetup()
        saver = TenxCheckpointSaver(cp)
        for round_ in range(ROUNDS):
            await cancelled_round(cp, saver, round_)
            # Every task has finished: no lock may be held, at once.
            try:
                other.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise AssertionError(f"round {round_}: the write lock is still held") from exc
            other.execute("ROLLBACK")
            probe = cfg("probe", "u")
            await asyncio.wait_for(cp.aput_state(probe, {"round": round_}), 5)
            assert await cp.aget_state(cfg("probe", "u")) == {"round": round_}
    finally:
        other.close()
        await cp.aclose()


@pytest.mark.parametrize("name", ["postgresql", "pgbouncer", "mariadb", "sqlite"])
async def test_cancelled_calls_leave_nothing_to_complain_of(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Calls cancelled at every point of their way leave asyncio nothing to report
    (on PostgreSQL, each connection opening cancelled after its TCP connect used to
    leave asyncpg's TLS-negotiation future failed and unretrieved: hundreds of
    "Future exception was never retrieved") and the pool nothing to log at ERROR (a
    cancelled close left its reset undone: "Exception during reset or similar")."""
    loop = asyncio.get_running_loop()
    complaints: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: complaints.append(context))
    try:
        with caplog.at_level(logging.WARNING):
            async with backend_for(name, tmp_path) as backend:
                cp = await backend.make(enforce_user_isolation=False)
                saver = TenxCheckpointSaver(cp)
                for round_ in range(ROUNDS // 2):
                    await cancelled_round(cp, saver, round_)
                assert await cp.aput_state(cfg("probe", "u"), {"n": 1}) == 1
        gc.collect()  # an unretrieved future is reported when it is freed
    finally:
        loop.set_exception_handler(previous)
    assert [c.get("message") for c in complaints] == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_cancel_never_interrupts_a_connection_the_write_has_let_go() -> None:
    """The canceller (the event loop's thread) looks at the write's connection, then
    interrupts it; the worker may let the connection go in between: to COMMIT, or back
    to the pool, where the next writer takes it. Once ``detach()`` has returned, no
    interrupt of the ticket reaches the connection (it would end that COMMIT, or an
    innocent writer's statement, with "interrupted")."""
    from tenxstore.backends.sqlite import Ticket

    ticket = Ticket()
    looked = threading.Event()
    let_go = threading.Event()
    interrupts: list[str] = []

    class Connection:
        @property
        def interrupt(self) -> Callable[[], None]:
            looked.set()  # the canceller has the connection in hand
            let_go.wait(0.2)  # the worker lets it go now, unless it must wait its turn
            return lambda: interrupts.append("after" if let_go.is_set() else "before")

    ticket.attach(Connection())
    canceller = threading.Thread(target=ticket.cancel)
    canceller.start()
    assert looked.wait(5)
    ticket.detach()
    let_go.set()
    canceller.join(5)
    assert ticket.cancelled and interrupts == ["before"]
