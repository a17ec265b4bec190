"""The replay-safe tool ledger (``tool_executions``): claims, leases, results, replays.

Every ledger change runs under the thread's row lock (PostgreSQL: ``FOR UPDATE`` on
the threads row; SQLite: ``BEGIN IMMEDIATE``), the same lock that serializes state
writes, so "read the call's row, decide, write it" is atomic on every database
without relying on upsert semantics that differ between them.

A claim is identified by its attempt number (``ToolExecution.attempts``): outcomes
name the claim they come from, and an outcome from a claim that is no longer the
live one changes nothing (:class:`~tenxstore.ToolExecutionClaimLost`). The claim an
outcome comes from is ``attempt=`` when given, else the claim this task (its
``contextvars`` context) took last: so a worker that lost its lease cannot free the
claim that took over, even calling the methods without ``attempt=``. Leases are
measured on the database's clock, so clock skew between workers cannot make two
claims live at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, TypeVar

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from . import telemetry
from .boundary import callers_own
from .config import RunIds, recorded_incarnation, recorded_version
from .crypto import ARGS, ERROR, RESULT, Life, life_of
from .errors import (
    ConfigError,
    SerializationError,
    StaleStateError,
    TenxStoreError,
    ToolExecutionClaimLost,
    ToolExecutionInProgress,
    ToolExecutionMismatch,
    ToolExecutionNotFound,
)
from .serde import encode
from .statements import tool_execution, utc
from .store import Store
from .types import ToolExecution, ToolStatus
from .validate import check_count, check_id

__all__ = ["ToolLedger"]

log = logging.getLogger(__name__)
T = TypeVar("T")
UNSTORABLE = "the tool returned a value that cannot be stored"


async def _to_the_end(work: Awaitable[T]) -> tuple[T, bool]:
    """Run ``work`` to its end even if the caller is cancelled meanwhile.

    Returns its result and whether a cancellation arrived; the caller then re-raises
    it. Used where stopping half-way would lose what already happened (a claim taken,
    a tool body that has run).
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.done():  # the work itself was cancelled (a loop shutting down)
                raise
            cancelled = True
        except BaseException as exc:
            if cancelled:  # the cancellation still propagates, as asyncio requires
                raise asyncio.CancelledError from exc
            raise


_ClaimKey = tuple[int, Any, str]  # (the store, thread_id, tool_call_id)
Claim = tuple[int | None, int | None]  # (the thread's incarnation, attempts)
_CLAIMS: contextvars.ContextVar[Mapping[_ClaimKey, Claim]] = contextvars.ContextVar(
    "tenxstore_tool_claims", default=MappingProxyType({})
)
"""The claims this context took: a task's own, copied into the tasks it starts."""


def _took(key: _ClaimKey, attempt: Claim | None) -> None:
    """Remember (or, with None, forget) the claim this context holds; copy on write, so
    a task never changes what another task's context holds."""
    claims = dict(_CLAIMS.get())
    if attempt is None:
        claims.pop(key, None)
    else:
        claims[key] = attempt
    _CLAIMS.set(claims)


def _digest(canonical: str) -> str:
    """Arguments as an error names them: a digest of their canonical JSON."""
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _live(row: Any, clock: datetime) -> bool:
    lease = utc(row.lease_expires_at)
    return bool(row.status == "started" and lease is not None and lease > clock)


def _check_life_read(
    ids: RunIds, locked: Any, read_version: int | None, read_life: int | None
) -> None:
    """Raise StaleStateError unless the life the run read is still the thread's: a
    thread that was there when the run read it (a version above 0) and is gone, or is
    another life now, was deleted or replaced since."""
    gone = locked is None and bool(read_version)
    if gone or (read_life is not None and (locked is None or locked.incarnation != read_life)):
        raise StaleStateError(
            ids.thread_id,
            read_version or 0,
            "(none)" if locked is None else locked.version,
            replaced=True,
        )


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
        """Claim a tool call (see :meth:`_begin`)."""
        record, claim = await self._begin(config, tool_call_id, tool_name, args)
        if claim is not None:
            _took(self._key(self._store.ids(config), record.tool_call_id), claim)
        return record

    async def _begin(
        self, config: dict[str, Any], tool_call_id: str, tool_name: str, args: dict[str, Any]
    ) -> tuple[ToolExecution, Claim | None]:
        """Claim a tool call.

        Of many workers racing on one call exactly one gets ``status="started"``. A call
        that already succeeded returns its stored record (do not run it again). A failed
        call, or a claim whose lease expired (on the database's clock), is claimed again
        with ``attempts`` + 1: the returned ``attempts`` names this claim; pass it as
        ``attempt=`` when completing or failing the call. A claim on a thread that does
        not exist creates it for the caller.

        A run that read the thread (its config records the version, and the life,
        it read) claims only in that life of the thread, as a state write does: once
        the thread was deleted (``aclean_thread``, ``adelete_user``, ``aprune_idle``)
        or replaced since, the claim raises ``StaleStateError`` and writes nothing —
        an erased user's thread is never brought back by a tool call.

        Raises:
            ToolExecutionInProgress: Another worker holds a live claim.
            ToolExecutionMismatch: The id was used for another tool name or arguments
                (compared as canonical JSON: ``1``, ``1.0`` and ``True`` differ).
            ThreadOwnershipError: Another user owns the thread.
            StaleStateError: The run read the thread, and it was deleted or replaced
                since (``replaced`` is True); nothing was written.
        """
        store = self._store
        ids = store.ids(config)
        read_version = recorded_version(config)
        read_life = recorded_incarnation(config)
        call_id = check_id("tool_call_id", tool_call_id)
        tool_name = check_id("tool_name", tool_name)
        args_text = store.encode_object(args, "args")
        canonical = encode(args, "args", sort_keys=True)
        async with store.write(ids.thread_id) as (conn, locked):
            _check_life_read(ids, locked, read_version, read_life)
            thread = await store.claim_thread(conn, ids, locked, store.now())
            life, bound = thread.incarnation, life_of(thread)  # values sealed for its life
            clock = await store.backend.clock(conn)
            row = await self._call_row(conn, ids, call_id)
            claim = self._claim(clock)
            if row is None:
                sealed_args = store.seal(args_text, ids.thread_id, ARGS, bound)
                row = await self._first_claim(conn, ids, call_id, tool_name, sealed_args, claim)
                telemetry.tool_outcome(log, "claimed", tool_name)
                return tool_execution(ids.thread_id, row, store.keys, bound), (life, 1)
            self._check_same_call(row, ids, call_id, tool_name, canonical, bound)
            if row.status == "succeeded":
                telemetry.tool_outcome(log, "replayed", tool_name)
                return tool_execution(ids.thread_id, row, store.keys, bound), None
            if _live(row, clock):
                telemetry.tool_outcome(log, "in_progress", tool_name)
                raise ToolExecutionInProgress(ids.thread_id, call_id, utc(row.lease_expires_at))
            again = "taken_over" if row.status == "started" else "reclaimed"
            row = await self._claim_again(conn, ids, call_id, claim)
        telemetry.tool_outcome(log, again, tool_name)
        return tool_execution(ids.thread_id, row, store.keys, bound), (life, row.attempts)

    def _claim(self, clock: datetime) -> dict[str, Any]:
        """The columns of a new claim, its lease measured on the database's ``clock``."""
        return {
            "status": "started",
            "result": None,
            "error": None,
            "lease_expires_at": clock + self._store.settings.tool_lease,
            "started_at": clock,
            "finished_at": None,
        }

    async def _first_claim(
        self,
        conn: AsyncConnection,
        ids: RunIds,
        call_id: str,
        tool_name: str,
        sealed_args: str,
        claim: dict[str, Any],
    ) -> Row[Any] | None:
        """The call's row inserted as its first claim, and read back."""
        x = self._store.tables.tool_executions
        await conn.execute(
            insert(x).values(
                thread_id=ids.thread_id,
                tool_call_id=call_id,
                tool_name=tool_name,
                args=sealed_args,
                attempts=1,
                **claim,
            )
        )
        return await self._call_row(conn, ids, call_id)

    async def _claim_again(
        self, conn: AsyncConnection, ids: RunIds, call_id: str, claim: dict[str, Any]
    ) -> Row[Any]:
        """The call's row claimed once more (``attempts`` + 1)."""
        x = self._store.tables.tool_executions
        here = (x.c.thread_id == ids.thread_id, x.c.tool_call_id == call_id)
        stmt = update(x).where(*here).values(attempts=x.c.attempts + 1, **claim)
        return await self._store.backend.update_returning(conn, stmt, x, *here)

    def _check_same_call(
        self, row: Row[Any], ids: RunIds, call_id: str, tool_name: str, canonical: str, bound: Life
    ) -> None:
        """Raise ToolExecutionMismatch when the call was made as another tool or
        with other arguments."""
        store = self._store
        stored = encode(store.load(row.args, ids.thread_id, ARGS, bound), sort_keys=True)
        if row.tool_name != tool_name or stored != canonical:
            telemetry.tool_outcome(log, "mismatch", tool_name)
            # Arguments are named by a digest, never shown: they are the user's
            # data (sealed at rest when encryption is on), and this goes to logs.
            raise ToolExecutionMismatch(
                f"tool call {call_id!r} of thread {ids.thread_id!r} was made as "
                f"{row.tool_name!r} with arguments {_digest(stored)}, not "
                f"{tool_name!r} with arguments {_digest(canonical)}"
            )

    def _key(self, ids: RunIds, call_id: str) -> _ClaimKey:
        return (id(self._store), ids.thread_id, call_id)

    def _token(
        self, config: dict[str, Any], ids: RunIds, call_id: str, attempt: int | None
    ) -> Claim:
        """The claim an outcome comes from: ``attempt``, else this context's claim; and
        the life of the thread it was made in (this context's claim's, else the one
        the run recorded when it read or wrote the thread), when known."""
        life, taken = _CLAIMS.get().get(self._key(ids, call_id), (None, None))
        if life is None:
            life = recorded_incarnation(config)
        if attempt is not None:
            return life, check_count("attempt", attempt)
        return life, taken

    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any, *, attempt: int | None = None
    ) -> ToolExecution:
        """Record a tool call's result; the first success wins.

        Args:
            attempt: The claim this result comes from (``ToolExecution.attempts`` of
                the claim). A result from a claim that lost its lease is still recorded
                when no success exists and no other claim is live; otherwise it is
                refused. Without it: the claim this task took (see the module), and
                when the task took none, whichever claim is current.

        Raises:
            ToolExecutionNotFound: The call was never claimed.
            ToolExecutionClaimLost: ``attempt`` is not the live claim, and another is.
            SerializationError: ``result`` is not JSON; nothing was written.
        """
        ids = self._store.ids(config)
        call_id = check_id("tool_call_id", tool_call_id)
        token = self._token(config, ids, call_id, attempt)
        result_text = encode(result, "result")
        return await self._finish(ids, call_id, "succeeded", result_text, None, token)

    async def afail_tool_execution(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        error: str | BaseException,
        *,
        attempt: int | None = None,
    ) -> ToolExecution:
        """Record a tool call's failure, which frees the call for the next claim (a
        succeeded call keeps its success).

        Args:
            attempt: The claim that failed (without it: as for a result). A failure
                from a claim that is no longer the current one changes nothing.

        Raises:
            ToolExecutionNotFound: The call was never claimed.
            ToolExecutionClaimLost: ``attempt`` is not the current claim.
        """
        ids = self._store.ids(config)
        call_id = check_id("tool_call_id", tool_call_id)
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}"
        if not isinstance(error, str):
            raise ConfigError(f"error must be a str or an exception, not {type(error).__name__}")
        token = self._token(config, ids, call_id, attempt)
        return await self._finish(ids, call_id, "failed", None, encode(error, "error"), token)

    async def _finish(
        self,
        ids: RunIds,
        call_id: str,
        status: ToolStatus,
        result: str | None,
        error: str | None,
        claim: Claim,
    ) -> ToolExecution:
        """Record an outcome under the thread's lock, if its claim may still record one
        (``claim``: the thread's life and the attempt it was made in, when known)."""
        life, attempt = claim
        store = self._store
        x = store.tables.tool_executions
        async with store.write(ids.thread_id) as (conn, locked):
            row = None
            if locked is not None:
                store.check_owner(ids, locked)
                row = await self._call_row(conn, ids, call_id)
            if row is None:
                telemetry.tool_outcome(log, "not_found")
                raise ToolExecutionNotFound(
                    f"tool call {call_id!r} of thread {ids.thread_id!r} was never claimed"
                )
            if row.status == "succeeded":
                telemetry.tool_outcome(log, "kept", row.tool_name)
                # the first success wins
                return tool_execution(ids.thread_id, row, store.keys, life_of(locked))
            if life is not None and locked.incarnation != life:  # a claim of a life gone
                telemetry.tool_outcome(log, "claim_lost", row.tool_name)
                raise ToolExecutionClaimLost(
                    ids.thread_id, call_id, attempt or 0, row.attempts, replaced=True
                )
            clock = await store.backend.clock(conn)
            tid, bound = ids.thread_id, life_of(locked)  # sealed for the locked row's life
            # A late outcome (its claim's lease expired and the call was claimed again):
            # only a success may still land, and never over a live claim.
            late = attempt is not None and attempt != row.attempts
            if attempt is not None and late and (status != "succeeded" or _live(row, clock)):
                telemetry.tool_outcome(log, "claim_lost", row.tool_name)
                raise ToolExecutionClaimLost(ids.thread_id, call_id, attempt, row.attempts)
            here = (x.c.thread_id == ids.thread_id, x.c.tool_call_id == call_id)
            stmt = (
                update(x)
                .where(*here)
                .values(
                    status=status,
                    result=None if result is None else store.seal(result, tid, RESULT, bound),
                    error=None if error is None else store.seal(error, tid, ERROR, bound),
                    lease_expires_at=None,
                    finished_at=clock,
                )
            )
            row = await self._store.backend.update_returning(conn, stmt, x, *here)
        _took(self._key(ids, call_id), None)
        telemetry.tool_outcome(log, status, row.tool_name)
        return tool_execution(ids.thread_id, row, store.keys, bound)

    async def aget_tool_execution(
        self, config: dict[str, Any], tool_call_id: str
    ) -> ToolExecution | None:
        """The ledger record of a tool call, or None (also for another user's thread)."""
        store = self._store
        ids = store.ids(config)
        call_id = check_id("tool_call_id", tool_call_id)
        x, t = store.tables.tool_executions, store.tables.threads
        rows = await store.read(  # the thread's life joined in: what its values are sealed for
            select(*x.c, *store.life_columns)
            .join(t, t.c.thread_id == x.c.thread_id)
            .where(x.c.thread_id == ids.thread_id, store.owned(ids), x.c.tool_call_id == call_id)
        )
        if not rows:
            return None
        return tool_execution(ids.thread_id, rows[0], store.keys, life_of(rows[0]))

    async def alist_tool_executions(self, config: dict[str, Any]) -> list[ToolExecution]:
        """Every tool call of the thread, in the order they were first claimed."""
        store = self._store
        ids = store.ids(config)
        x, t = store.tables.tool_executions, store.tables.threads
        rows = await store.read(
            select(*x.c, *store.life_columns)
            .join(t, t.c.thread_id == x.c.thread_id)
            .where(x.c.thread_id == ids.thread_id, store.owned(ids))
            .order_by(x.c.started_at, x.c.tool_call_id)
        )
        return [tool_execution(ids.thread_id, row, store.keys, life_of(row)) for row in rows]

    async def arun_tool_once(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        tool_name: str,
        args: dict[str, Any],
        fn: Callable[..., Any],
    ) -> Any:
        """Claim, run ``fn(**args)``, record; replay the recorded outcome afterwards.

        See :meth:`tenxstore.CheckpointRepository.arun_tool_once`.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        ids = self._store.ids(config)
        call_id = check_id("tool_call_id", tool_call_id)
        claiming = self._begin(config, tool_call_id, tool_name, args)
        (record, claim), cancelled = await _to_the_end(claiming)
        if record.status == "succeeded":
            if record.result is None and record.error is not None:
                raise SerializationError(f"tool call {call_id!r} ran, but {record.error}")
            if cancelled:
                raise asyncio.CancelledError
            return record.result
        attempt: Claim = claim or (None, record.attempts)
        if cancelled:  # cancelled while claiming: give the claim back at once
            await self._record(ids, call_id, "failed", None, "cancelled before it ran", attempt)
            raise asyncio.CancelledError
        outcome = await self._run_body(ids, call_id, fn, args, attempt)
        return await self._record_result(ids, call_id, outcome, attempt)

    async def _run_body(
        self,
        ids: RunIds,
        call_id: str,
        fn: Callable[..., Any],
        args: dict[str, Any],
        attempt: Claim,
    ) -> Any:
        """``fn(**args)``, awaited when it gives an awaitable; a failure or a
        cancellation is recorded (the claim given back) and raised again."""
        try:
            outcome = fn(**args)
            if inspect.isawaitable(outcome):
                outcome = await outcome
        except asyncio.CancelledError:
            await self._record(ids, call_id, "failed", None, "cancelled while it ran", attempt)
            raise
        except Exception as exc:
            callers_own(exc)  # the tool's own exception: through the boundary as it is
            why = f"{type(exc).__name__}: {exc}"
            if await self._record(ids, call_id, "failed", None, why, attempt):
                raise asyncio.CancelledError from exc
            raise
        return outcome

    async def _record_result(self, ids: RunIds, call_id: str, outcome: Any, attempt: Claim) -> Any:
        """Record the body's result as the call's success; the result as stored."""
        # The body has run: from here its outcome is recorded even if we are cancelled.
        # A result the store refuses — not JSON, or too large for the server (MySQL's
        # max_allowed_packet, SQLite's length limit) — is recorded as a success without
        # it: running the body again could never store it either, and a claim left
        # "started" would run it again, and again, each time its lease ran out.
        refused: SerializationError
        cancelled = False
        try:
            text = encode(outcome, "result")
        except SerializationError as exc:
            refused = exc
        else:
            try:
                done, cancelled = await _to_the_end(
                    self._finish(ids, call_id, "succeeded", text, None, attempt)
                )
            except SerializationError as exc:
                refused = exc
            except asyncio.CancelledError as exc:
                if not isinstance(exc.__cause__, SerializationError):
                    raise
                refused, cancelled = exc.__cause__, True
            else:
                if cancelled:
                    raise asyncio.CancelledError
                return done.result
        why = f"{UNSTORABLE}: {refused}"
        if await self._record(ids, call_id, "succeeded", None, why, attempt) or cancelled:
            raise asyncio.CancelledError from refused
        raise SerializationError(f"tool call {call_id!r} ran, but {why}") from refused

    async def _record(
        self,
        ids: RunIds,
        call_id: str,
        status: ToolStatus,
        result: str | None,
        error: str,
        attempt: Claim,
    ) -> bool:
        """Record an outcome of :meth:`arun_tool_once` to the end, whatever happens to
        the caller; whether a cancellation arrived meanwhile. A failure to record is
        logged, and the caller's own error goes on."""
        try:
            _, cancelled = await _to_the_end(
                self._finish(ids, call_id, status, result, encode(error), attempt)
            )
        except TenxStoreError as exc:
            which = f" {call_id!r}" if telemetry.record_ids() else ""
            log.warning("tool call%s: could not record %s (%s)", which, status, type(exc).__name__)
            return False
        return cancelled
