"""The replay-safe tool ledger of the repository (``tool_executions``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    insert,
    select,
    update,
)
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from ._repository_core import (
    RepositoryCore,
    _utc,
)
from ._tools import run_tool_once
from .config import (
    RunIds,
    check_id,
)
from .errors import (
    ConfigError,
    ToolExecutionInProgress,
    ToolExecutionMismatch,
    ToolExecutionNotFound,
)
from .serde import decode, encode
from .types import ToolExecution

__all__ = ["LedgerMixin"]


class LedgerMixin(RepositoryCore):
    """Claims, leases, results and replays of tool calls."""

    # Every ledger change runs under the thread's row lock (PostgreSQL: FOR UPDATE on
    # the threads row; SQLite: BEGIN IMMEDIATE), the same lock that serializes state
    # writes, so "read the call's row, decide, write it" is atomic on both dialects
    # without relying on upsert semantics that differ between them.

    async def _call_row(
        self, conn: AsyncConnection, ids: RunIds, locked: Any, tool_call_id: str
    ) -> Row[Any]:
        """The call's row under the locked thread row, checking the owner first."""
        x = self._t.tool_executions
        row = None
        if locked is not None:
            self._check_owner(ids, locked)
            row = (
                await conn.execute(
                    select(*x.c).where(
                        x.c.thread_id == ids.thread_id, x.c.tool_call_id == tool_call_id
                    )
                )
            ).first()
        if row is None:
            raise ToolExecutionNotFound(
                f"tool call {tool_call_id!r} of thread {ids.thread_id!r} was never claimed"
            )
        return row

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
        ids = self._ids(config)
        call_id = self._tool_call_id(tool_call_id)
        tool_name = check_id("tool_name", tool_name)
        args_text = self._encode_object(args, "args")
        now = self._now()
        x = self._t.tool_executions
        async with self._write(ids.thread_id) as (conn, locked):
            await self._claim_thread(conn, ids, locked, now)
            row = (
                await conn.execute(
                    select(*x.c).where(x.c.thread_id == ids.thread_id, x.c.tool_call_id == call_id)
                )
            ).first()
            claim = {
                "status": "started",
                "result": None,
                "error": None,
                "lease_expires_at": now + self._lease,
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
                row = (
                    await conn.execute(
                        select(*x.c).where(
                            x.c.thread_id == ids.thread_id, x.c.tool_call_id == call_id
                        )
                    )
                ).one()
                return self._tool_execution(ids.thread_id, row)
            if row.tool_name != tool_name or decode(row.args) != decode(args_text):
                raise ToolExecutionMismatch(
                    f"tool call {call_id!r} of thread {ids.thread_id!r} was made as "
                    f"{row.tool_name!r} with {decode(row.args)!r}, "
                    f"not {tool_name!r} with {decode(args_text)!r}"
                )
            if row.status == "succeeded":
                return self._tool_execution(ids.thread_id, row)
            lease = _utc(row.lease_expires_at)
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
        return self._tool_execution(ids.thread_id, row)

    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any
    ) -> ToolExecution:
        """Record a tool call's result; the first success wins.

        Raises:
            ToolExecutionNotFound: The call was never claimed.
            SerializationError: ``result`` is not JSON; nothing was written.
        """
        ids = self._ids(config)
        call_id = self._tool_call_id(tool_call_id)
        result_text = encode(result, "result")
        return await self._finish(ids, call_id, "succeeded", result=result_text, error=None)

    async def afail_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, error: str | BaseException
    ) -> ToolExecution:
        """Record a tool call's failure (a succeeded call keeps its success).

        Raises:
            ToolExecutionNotFound: The call was never claimed.
        """
        ids = self._ids(config)
        call_id = self._tool_call_id(tool_call_id)
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}"
        if not isinstance(error, str):
            raise ConfigError(f"error must be a str or an exception, not {type(error).__name__}")
        return await self._finish(ids, call_id, "failed", result=None, error=encode(error))

    async def _finish(
        self, ids: RunIds, call_id: str, status: str, *, result: str | None, error: str | None
    ) -> ToolExecution:
        x = self._t.tool_executions
        async with self._write(ids.thread_id) as (conn, locked):
            row = await self._call_row(conn, ids, locked, call_id)
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
                            finished_at=self._now(),
                        )
                        .returning(*x.c)
                    )
                ).one()
        return self._tool_execution(ids.thread_id, row)

    async def aget_tool_execution(
        self, config: dict[str, Any], tool_call_id: str
    ) -> ToolExecution | None:
        """The ledger record of a tool call, or None (also for another user's thread)."""
        ids = self._ids(config)
        call_id = self._tool_call_id(tool_call_id)
        x = self._t.tool_executions
        rows = await self._fetch(
            select(*x.c).where(
                x.c.thread_id == self._visible_thread(ids), x.c.tool_call_id == call_id
            )
        )
        return self._tool_execution(ids.thread_id, rows[0]) if rows else None

    async def arun_tool_once(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        tool_name: str,
        args: dict[str, Any],
        fn: Callable[..., Any],
    ) -> Any:
        """Run ``fn(**args)`` at most once per live claim; replay the stored result after.

        Once one run has succeeded, every later call — in any process, after any
        restart — returns the stored result without calling ``fn``. If ``fn`` raises,
        the failure is recorded and the exception re-raised; the next call claims the
        tool again. Across an expired lease the body may run again (at-least-once).

        Returns:
            The recorded result (as stored: JSON, so tuples come back as lists).

        Raises:
            ToolExecutionInProgress: Another worker is running this call now.
            SerializationError: ``fn`` returned something that is not JSON (recorded
                as a failure).
        """
        return await run_tool_once(self, config, tool_call_id, tool_name, args, fn)
