"""The replay-safe tool ledger (``tool_executions``): claims, leases, results, replays.

Every ledger change runs under the thread's row lock (PostgreSQL: ``FOR UPDATE`` on
the threads row; SQLite: ``BEGIN IMMEDIATE``), the same lock that serializes state
writes, so "read the call's row, decide, write it" is atomic on every database
without relying on upsert semantics that differ between them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from .config import RunIds
from .errors import (
    ConfigError,
    SerializationError,
    ToolExecutionInProgress,
    ToolExecutionMismatch,
    ToolExecutionNotFound,
)
from .serde import decode, encode
from .statements import tool_execution, utc
from .store import Store
from .types import ToolExecution
from .validate import check_id

__all__ = ["ToolLedger"]


class ToolLedger:
    """Claims, leases, results and replays of tool calls, on a repository's store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def _call_row(self, conn: AsyncConnection, ids: RunIds, call_id: str) -> Row[Any] | None:
        """The call's row, read under the thread's lock."""
        params = {"b_thread": ids.thread_id, "b_call": call_id}
        return (await conn.execute(self._store.sql.tool_call, params)).first()

    async def abegin_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, tool_name: str, args: dict[str, Any]
    ) -> ToolExecution:
        """Claim a tool call.

        Of many workers racing on one call exactly one gets ``status="started"``. A call
        that already succeeded returns its stored record (do not run it again). A failed
        call, or a claim whose lease expired, is claimed again with ``attempts`` + 1.
        A claim on a thread that does not exist creates it for the caller.

        Raises:
            ToolExecutionInProgress: Another worker holds a live claim.
            ToolExecutionMismatch: The id was used for another tool name or arguments.
            ThreadOwnershipError: Another user owns the thread.
        """
        store = self._store
        ids = store.ids(config)
        call_id = check_id("tool_call_id", tool_call_id)
        tool_name = check_id("tool_name", tool_name)
        args_text = store.encode_object(args, "args")
        now = store.now()
        x = store.tables.tool_executions
        async with store.write(ids.thread_id) as (conn, locked):
            await store.claim_thread(conn, ids, locked, now)
            row = await self._call_row(conn, ids, call_id)
            claim = {
                "status": "started",
                "result": None,
                "error": None,
                "lease_expires_at": now + store.settings.tool_lease,
                "started_at": now,
                "finished_at": None,
            }
            if row is None:
                await conn.execute(
                    insert(x).values(
                        thread_id=ids.thread_id,
                        tool_call_id=call_id,
                        tool_name=tool_name,
                        args=args_text,
                        attempts=1,
                        **claim,
                    )
                )
                row = await self._call_row(conn, ids, call_id)
                return tool_execution(ids.thread_id, row)
            if row.tool_name != tool_name or decode(row.args) != decode(args_text):
                raise ToolExecutionMismatch(
                    f"tool call {call_id!r} of thread {ids.thread_id!r} was made as "
                    f"{row.tool_name!r} with {decode(row.args)!r}, "
                    f"not {tool_name!r} with {decode(args_text)!r}"
                )
            if row.status == "succeeded":
                return tool_execution(ids.thread_id, row)
            lease = utc(row.lease_expires_at)
            if row.status == "started" and lease is not None and lease > now:
                raise ToolExecutionInProgress(ids.thread_id, call_id, lease)
            row = (
                await conn.execute(
                    update(x)
                    .where(x.c.thread_id == ids.thread_id, x.c.tool_call_id == call_id)
                    .values(attempts=x.c.attempts + 1, **claim)
                    .returning(*x.c)
                )
            ).one()
        return tool_execution(ids.thread_id, row)

    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any
    ) -> ToolExecution:
        """Record a tool call's result; the first success wins.

        Raises:
            ToolExecutionNotFound: The call was never claimed.
            SerializationError: ``result`` is not JSON; nothing was written.
        """
        ids = self._store.ids(config)
        call_id = check_id("tool_call_id", tool_call_id)
        result_text = encode(result, "result")
        return await self._finish(ids, call_id, "succeeded", result=result_text, error=None)

    async def afail_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, error: str | BaseException
    ) -> ToolExecution:
        """Record a tool call's failure (a succeeded call keeps its success).

        Raises:
            ToolExecutionNotFound: The call was never claimed.
        """
        ids = self._store.ids(config)
        call_id = check_id("tool_call_id", tool_call_id)
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}"
        if not isinstance(error, str):
            raise ConfigError(f"error must be a str or an exception, not {type(error).__name__}")
        return await self._finish(ids, call_id, "failed", result=None, error=encode(error))

    async def _finish(
        self, ids: RunIds, call_id: str, status: str, *, result: str | None, error: str | None
    ) -> ToolExecution:
        store = self._store
        x = store.tables.tool_executions
        async with store.write(ids.thread_id) as (conn, locked):
            row = None
            if locked is not None:
                store.check_owner(ids, locked)
                row = await self._call_row(conn, ids, call_id)
            if row is None:
                raise ToolExecutionNotFound(
                    f"tool call {call_id!r} of thread {ids.thread_id!r} was never claimed"
                )
            if row.status != "succeeded":
                row = (
                    await conn.execute(
                        update(x)
                        .where(x.c.thread_id == ids.thread_id, x.c.tool_call_id == call_id)
                        .values(
                            status=status,
                            result=result,
                            error=error,
                            lease_expires_at=None,
                            finished_at=store.now(),
                        )
                        .returning(*x.c)
                    )
                ).one()
        return tool_execution(ids.thread_id, row)

    async def aget_tool_execution(
        self, config: dict[str, Any], tool_call_id: str
    ) -> ToolExecution | None:
        """The ledger record of a tool call, or None (also for another user's thread)."""
        store = self._store
        ids = store.ids(config)
        call_id = check_id("tool_call_id", tool_call_id)
        x = store.tables.tool_executions
        rows = await store.read(
            select(*x.c).where(
                x.c.thread_id == store.visible_thread(ids), x.c.tool_call_id == call_id
            )
        )
        return tool_execution(ids.thread_id, rows[0]) if rows else None

    async def alist_tool_executions(self, config: dict[str, Any]) -> list[ToolExecution]:
        """Every tool call of the thread, in the order they were first claimed."""
        store = self._store
        ids = store.ids(config)
        x = store.tables.tool_executions
        rows = await store.read(
            select(*x.c)
            .where(x.c.thread_id == store.visible_thread(ids))
            .order_by(x.c.started_at, x.c.tool_call_id)
        )
        return [tool_execution(ids.thread_id, row) for row in rows]

    async def arun_tool_once(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        tool_name: str,
        args: dict[str, Any],
        fn: Callable[..., Any],
    ) -> Any:
        """Run ``fn(**args)`` at most once per live claim; replay the stored result after.

        See :meth:`tenxstore.CheckpointRepository.arun_tool_once`.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        record = await self.abegin_tool_execution(config, tool_call_id, tool_name, args)
        if record.status == "succeeded":
            return record.result
        try:
            outcome = fn(**args)
            if inspect.isawaitable(outcome):
                outcome = await outcome
        except Exception as exc:
            await self.afail_tool_execution(config, tool_call_id, exc)
            raise
        try:
            done = await self.acomplete_tool_execution(config, tool_call_id, outcome)
        except SerializationError as exc:
            await self.afail_tool_execution(config, tool_call_id, f"unserializable result: {exc}")
            raise
        return done.result
