"""One error boundary: every exception leaving a public call is tenxstore's, or the
caller's own. A driver error no backend translates (a full disk, an I/O error) is
injected into every statement of every public call, on every backend: each call
raises a TenxStoreError (``DatabaseError`` wrapping the driver's when nothing more
precise applies), never the driver's own exception."""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

import tenxstore
from tenxstore import DatabaseError, TenxStoreError
from tenxstore.langgraph import TenxCheckpointSaver
from tests.conftest import Backend, cfg


def fault_of(backend: Backend) -> BaseException:
    """An error of this backend's driver that no translation knows."""
    if backend.name.startswith(("postgresql", "pgbouncer")):
        import asyncpg

        return asyncpg.exceptions.DiskFullError("could not extend file: No space left")
    if backend.name == "mariadb":
        import asyncmy  # type: ignore[import-untyped]

        return asyncmy.errors.OperationalError(1021, "Disk full; waiting for someone to free")
    return sqlite3.OperationalError("disk I/O error")


def calls(cp: Any, saver: TenxCheckpointSaver) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Every public call that reaches the database, with arguments it accepts."""
    from langgraph.checkpoint.base import empty_checkpoint

    run = {"configurable": {"thread_id": "t1", "user_id": "alice"}}

    async def listed(gen: Any) -> list[Any]:
        return [x async for x in gen]

    return {
        "aget_state": lambda: cp.aget_state(cfg()),
        "aget_state_cache": lambda: cp.aget_state_cache(cfg()),
        "aput_checkpoint": lambda: cp.aput_checkpoint(cfg(), {"n": 1}, [{"id": "m"}]),
        "aput_state": lambda: cp.aput_state(cfg(_checkpoint_version=1), {"n": 2}),
        "alist_states": lambda: cp.alist_states(cfg()),
        "aget_messages": lambda: cp.aget_messages(cfg()),
        "aput_thread": lambda: cp.aput_thread(cfg(), name="n"),
        "aget_thread": lambda: cp.aget_thread(cfg()),
        "alist_threads": lambda: cp.alist_threads({"user_id": "alice"}),
        "aclean_thread": lambda: cp.aclean_thread(cfg()),
        "abegin_tool_execution": lambda: cp.abegin_tool_execution(cfg(), "c", "t", {}),
        "acomplete_tool_execution": lambda: cp.acomplete_tool_execution(cfg(), "c", 1),
        "afail_tool_execution": lambda: cp.afail_tool_execution(cfg(), "c", "boom"),
        "aget_tool_execution": lambda: cp.aget_tool_execution(cfg(), "c"),
        "arun_tool_once": lambda: cp.arun_tool_once(cfg(), "d", "t", {}, lambda: 1),
        "alist_tool_executions": lambda: cp.alist_tool_executions(cfg()),
        "aexport_thread": lambda: cp.aexport_thread(cfg()),
        "aiter_threads": lambda: listed(cp.aiter_threads()),
        "adelete_user": lambda: cp.adelete_user("alice"),
        "aprune_idle": lambda: cp.aprune_idle(timedelta(microseconds=1)),
        "astats": lambda: cp.astats(),
        "saver.aget_tuple": lambda: saver.aget_tuple(run),
        "saver.alist": lambda: listed(saver.alist(run)),
        "saver.aput": lambda: saver.aput(run, empty_checkpoint(), {}, {}),
        "saver.aput_writes": lambda: saver.aput_writes(
            {"configurable": {**run["configurable"], "checkpoint_id": "x"}}, [("c", 1)], "task"
        ),
        "saver.adelete_thread": lambda: saver.adelete_thread("t1"),
        "saver.acopy_thread": lambda: saver.acopy_thread("t1", "t2"),
        "saver.aprune": lambda: saver.aprune(["t1"], strategy="delete"),
        "saver.adelete_for_runs": lambda: saver.adelete_for_runs(["run"]),
        "saver.aget_delta_channel_history": lambda: saver.aget_delta_channel_history(
            config=run, channels=["c"]
        ),
    }


async def test_an_unknown_driver_error_leaves_every_call_as_ours(backend: Backend) -> None:
    cp = await backend.make()
    saver = TenxCheckpointSaver(cp).for_user("alice")
    await cp.aput_checkpoint(cfg(), {"n": 0}, [{"id": "m0"}])  # something to read
    await cp.abegin_tool_execution(cfg(), "c", "t", {})
    fault = fault_of(backend)

    def fail(_sql: str) -> None:
        raise fault

    repository = getattr(cp, "inner", cp)
    stop = repository.backend.on_statement(fail)
    escaped: dict[str, BaseException] = {}
    wrapped = 0
    try:
        for name, call in calls(cp, saver).items():
            try:
                await call()
            except TenxStoreError as exc:
                wrapped += isinstance(exc, DatabaseError) and exc.cause is fault
            except BaseException as exc:  # the boundary let it out
                escaped[name] = exc
    finally:
        stop()
    assert escaped == {}
    assert wrapped > 10  # most calls met the fault itself, wrapped whole
    assert await cp.aget_state(cfg()) == {"n": 0}  # nothing half written meanwhile


async def test_the_callers_own_exceptions_pass_as_they_are(backend: Backend) -> None:
    """A tool body's exception — even one of a driver's classes, or an OSError — and a
    progress hook's leave as they were raised, not wrapped."""
    cp = await backend.make()
    for own in (sqlite3.OperationalError("the tool's own"), ConnectionResetError("its own")):

        def tool(own: BaseException = own) -> None:
            raise own

        with pytest.raises(type(own)) as raised:
            await cp.arun_tool_once(cfg(), f"c-{type(own).__name__}", "t", {}, tool)
        assert raised.value is own
    await cp.aput_state(cfg(), {"n": 1})

    def hook(_totals: Any) -> None:
        raise OSError("the hook's own")

    with pytest.raises(OSError, match="the hook's own"):
        await cp.adelete_user("alice", on_batch=hook)


def test_every_public_async_method_is_inside_the_boundary() -> None:
    """A public coroutine or async generator of a checkpointer or of the saver that is
    not wrapped would let a driver's error out as it is."""
    unguarded = [
        f"{cls.__name__}.{name}"
        for cls in (
            tenxstore.CheckpointRepository,
            tenxstore.CachedCheckpointer,
            TenxCheckpointSaver,
        )
        for name, fn in inspect.getmembers(cls)
        if not name.startswith("_")
        and (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn))
        and not hasattr(fn, "__wrapped__")
        and fn.__module__.startswith("tenxstore")
    ]
    assert unguarded == []


def test_a_database_error_shows_no_driver_message() -> None:
    error = DatabaseError(sqlite3.OperationalError("near 'secret-value': syntax error"))
    assert "secret-value" not in str(error) and "sqlite3.OperationalError" in str(error)
    assert error.committed is None
    import pickle

    assert str(pickle.loads(pickle.dumps(error))) == str(error)
