"""PostgreSQL behind a transaction-pooling PgBouncer (:class:`PgBouncerBackend`).

A statement outside a transaction may be parsed and executed on different server
connections, and a session setting lands on whichever server connection serves it:
no statement caches, unique prepared-statement names, every SQLAlchemy statement inside
a transaction, and ``SET LOCAL lock_timeout`` in each write transaction.

The hot path (the head read and the common state write) takes the simple query
protocol instead, which the pooler routes one Query message at a time: values written
into the SQL as literals, rows returned as binary ``COPY ... TO STDOUT``
(:mod:`.simple_query`; PgBouncer 1.18 has no prepared statements in transaction mode):

* the read: ONE round trip, ``COPY (<the head read>) TO STDOUT``;
* the write: TWO round trips, ``BEGIN; SET LOCAL lock_timeout = ...; COPY (<the
  session mode's one-statement write>) TO STDOUT``, then ``COMMIT`` (``ROLLBACK`` when
  the compare-and-swap matched nothing: None, and the repository's locked path).

Why two for the write. One round trip (the statement in the Query's implicit
transaction, ``SET LOCAL`` before it) works and saves one pooler round trip per
write, but its outcome cannot be settled when the link breaks: the process id asyncpg
sees is PgBouncer's, so the server backend running it cannot be ended, and a Query
still between PgBouncer and the server may run, and commit, after any look taken on a
fresh connection. It would raise ConnectionLost(committed=None) and might commit after
the call ended. With an explicit transaction, a link lost before COMMIT is sent leaves
a transaction that never commits (PgBouncer ends the server connection of a client gone
mid-transaction, which rolls it back): committed=False, proven. A link lost while
COMMIT is in flight is settled by waiting, on a fresh connection, for the thread's row
lock (the write holds it until its transaction ends; at most :data:`SETTLE_MS`) and
then looking: committed True or False; a wait that times out says None. A cancelled
call rolls back (cancelled during COMMIT, it waits for COMMIT's end) before it ends:
it cannot commit afterwards. Session settings do not survive the pooler:
``lock_timeout`` is ``SET LOCAL`` in the same Query.

Values written as literals reach the server's statement log and ``pg_stat_activity``
in the statement's text (bound values reach its log too, as parameters). LangGraph's
and the memory store's one-statement paths stay off (:attr:`one_statement_writes` is
False): they run prepared statements outside a transaction.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from sqlalchemy import bindparam, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable

from ..errors import ConnectionLost
from .asyncpg_driver import asyncpg_error, lost_error, unsent_error
from .base import timeout_ms
from .connections import Borrowed, borrow
from .lost_writes import after_a_lost_write, new_write_id, to_the_end, unknown_outcome
from .postgres import PostgresBackend
from .postgres_writes import did_it_apply, write_values
from .records import Head, HeadWrite
from .simple_query import LiteralStatement, copy_rows, decoders

__all__ = ["SETTLE_MS", "PgBouncerBackend", "transaction_pooling_args"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

SETTLE_MS = 5000
"""How long (ms; ``lock_timeout`` when longer) the look after a COMMIT lost in flight
waits for the thread's row lock, that is for the write's transaction to end."""


def _statement_name() -> str:
    return f"__tenx_{uuid.uuid4().hex}__"


def transaction_pooling_args() -> dict[str, Any]:
    """asyncpg connect arguments for a transaction-pooling PgBouncer.

    A transaction pooler hands each transaction to any server connection, so a
    statement prepared in one transaction cannot be found in the next: no statement
    cache (asyncpg's or SQLAlchemy's), and a unique name for every statement
    SQLAlchemy prepares, so two clients never collide on one server connection. Pass
    them as ``connect_args`` to an engine of your own.
    """
    return {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": _statement_name,
    }


def _collect(into: list[bytes]) -> Callable[[bytes], Awaitable[None]]:
    """A COPY sink that keeps what it is given."""

    async def sink(chunk: bytes) -> None:
        into.append(bytes(chunk))

    return sink


class PgBouncerBackend(PostgresBackend):
    """PostgreSQL behind a transaction-pooling PgBouncer (``pool_mode="transaction"``).

    The session mode's prepared hot path is off (``driver_hot_path``): without
    prepared-statement caches a statement outside a transaction is parsed and executed
    in two exchanges, which the pooler may send to two server connections. The head
    read and the common state write take the simple query protocol instead (see the
    module's docstring); everything else runs in SQLAlchemy transactions.
    """

    name = "pgbouncer"
    driver_hot_path = False
    simple_hot_path: bool = True
    """Whether the head read and the common state write take the simple query protocol
    (False: SQLAlchemy transactions, as every other statement)."""

    @classmethod
    def connect_args(cls, lock_timeout: float | None) -> dict[str, Any]:
        return transaction_pooling_args()

    @classmethod
    def prepare(cls, engine: AsyncEngine, lock_timeout: float | None) -> None:
        """Nothing per connection: a session setting would land on any server connection."""

    def read_options(self) -> dict[str, Any]:
        # A transaction pins a statement's Parse and Bind to one server connection.
        return {}

    def write(
        self, lock: Executable, params: dict[str, Any]
    ) -> AbstractAsyncContextManager[tuple[AsyncConnection, Any]]:
        # asyncpg's own BEGIN is a simple query: the pooler sees the transaction start.
        return self._block_write(lock, params)

    async def write_begun(self, conn: AsyncConnection) -> None:
        if self.lock_timeout is not None:
            wait = timeout_ms(self.lock_timeout)
            await conn.exec_driver_sql(f"SET LOCAL lock_timeout = {wait}")

    def died_before_sending(self, exc: DBAPIError) -> bool:
        """asyncpg raises its client-side ``InterfaceError`` when a pooled connection that
        the server dropped while idle is used again: nothing reached the server. A
        connection lost in the middle of a statement is a ``PostgresConnectionError``
        instead, and what it did is not known."""
        if not exc.connection_invalidated:
            return False
        from asyncpg.exceptions import PostgresError
        from asyncpg.exceptions._base import InterfaceError

        cause = asyncpg_error(exc)
        return isinstance(cause, InterfaceError) and not isinstance(cause, PostgresError)

    # -- the hot path, over the simple query protocol ----------------------------------

    def bind(self, sql: Any) -> None:
        super().bind(sql)
        import asyncpg

        t = sql.tables.threads
        self._reads: tuple[LiteralStatement, ...] = ()
        self._literal_writes: dict[tuple[bool, ...], LiteralStatement] = {}
        try:
            self._read_fields = decoders(list(sql.head_state.selected_columns))
            self._write_fields = decoders([t.c.version, t.c.incarnation, t.c.user_id])
            self._reads = (LiteralStatement(self._read_any), LiteralStatement(self._read_own))
            self._literal_writes = {
                k: LiteralStatement(self._writes[k])
                for k in itertools.product((False, True), repeat=3)
            }
        except ValueError:  # a column or statement it cannot take: the bound path
            log.debug("%s: the simple-protocol hot path is off", self.name, exc_info=True)
        self._simple = (
            self.simple_hot_path
            and bool(self._literal_writes)
            and hasattr(asyncpg.Connection, "_copy_out")
        )
        wait = (
            ""
            if self.lock_timeout is None
            else f" SET LOCAL lock_timeout = {timeout_ms(self.lock_timeout)};"
        )
        self._begin = f"BEGIN;{wait}"

    async def read_head(self, thread_id: Any, user_id: Any) -> Head | None:
        """ONE simple Query (``COPY``), sent again once on a connection found dead (reads
        are idempotent); SQLAlchemy's transaction when a value is not written as a
        literal."""
        if self._simple:
            literal = self._reads[user_id is not None]
            stmt = literal.statement
            sql = literal.render(stmt.args({"b_thread": thread_id, "b_user": user_id}))
            if sql is not None:
                rows = await self._copy(sql, stmt.sql)
                if not rows:
                    return None
                version, incarnation, state, owner = rows[0]
                return Head(version, incarnation, owner, state)
        return await super().read_head(thread_id, user_id)

    async def _copy(self, sql: str, shown: str) -> list[tuple[Any, ...]]:
        """The head read's rows over ONE simple Query (``shown``: its SQL for listeners,
        without the values)."""
        borrowed = (await self._engines.get()).borrowed
        for attempt in self.retry.tries():
            taken = await borrow(self, borrowed, attempt, self._opening_errors)
            if taken is None:
                continue  # it broke while being set up: nothing was sent
            data: list[bytes] = []
            try:
                self._sent(shown)  # inside: whatever a listener raises, the connection goes back
                await taken[0].driver_connection.copy_from_query(
                    sql, output=_collect(data), format="binary"
                )
            except asyncio.CancelledError:
                await to_the_end(self._settle(borrowed, taken, "SELECT 1"))
                raise
            except Exception as exc:
                await self._after_failure(exc, borrowed, taken, attempt, True)
                continue
            await borrowed.give(*taken)
            return copy_rows(b"".join(data), self._read_fields)
        raise AssertionError("unreachable")

    async def commit_head(self, write: HeadWrite) -> Head | None:
        """TWO simple Queries: ``BEGIN; SET LOCAL ...; COPY (<the one-statement write>)``,
        then ``COMMIT`` (see the module's docstring). None — nothing written, the
        repository's locked path — when the compare-and-swap matches nothing, when no
        version is expected, or when a value is not written as a literal."""
        if not self._simple or write.expected is None:
            return None
        literal = self._literal_writes[(write.owned, True, write.incarnation is not None)]
        write_id = new_write_id()
        sql = literal.render(literal.statement.args(write_values(write, write_id)))
        if sql is None:
            return None  # the bound path takes the value (or refuses it, as it always did)
        query = f"{self._begin} COPY ({sql}) TO STDOUT (FORMAT binary)"
        borrowed = (await self._engines.get()).borrowed
        for attempt in self.retry.tries():
            taken = await borrow(self, borrowed, attempt, self._opening_errors)
            if taken is None:
                continue
            driver = taken[0].driver_connection
            if driver.is_closed() is False and await self._closed_while_idle(
                borrowed, taken, attempt
            ):
                continue  # another connection is tried: nothing was sent
            data: list[bytes] = []
            try:
                self._sent(literal.statement.sql)
                await driver._copy_out(query, _collect(data), None)
            except asyncio.CancelledError:  # rolled back before the call ends
                await to_the_end(self._settle(borrowed, taken, "ROLLBACK"))
                raise
            except Exception as exc:
                await self._before_commit(exc, borrowed, taken, attempt)
                continue
            return await to_the_end(self._end(write, write_id, borrowed, taken, data))
        raise AssertionError("unreachable")

    async def _before_commit(
        self, exc: Exception, borrowed: Borrowed, taken: tuple[Any, float], attempt: int
    ) -> None:
        """The write's first Query failed: COMMIT was never sent, so nothing was written.
        Returns when it is to be sent again (it never was), else raises tenxstore's error."""
        unsent, lost = unsent_error(exc), lost_error(exc)
        if not (unsent or lost):
            await to_the_end(self._settle(borrowed, taken, "ROLLBACK"))
            raise self._driver_error(exc, False, True) from exc
        borrowed.discard(taken[0])
        borrowed.after_disconnect()
        if unsent and await self.retry.again(
            attempt, log, self.name, "a connection broke; nothing was written"
        ):
            return
        # A transaction of its own that never saw COMMIT: PgBouncer ends the server
        # connection of a client gone mid-transaction, and it rolls back.
        raise self.lost(
            ConnectionLost(
                "the connection was lost before the write's COMMIT was sent; nothing was written",
                committed=False,
            )
        ) from exc

    async def _settle(self, borrowed: Borrowed, taken: tuple[Any, float], verb: str) -> None:
        """``verb`` (``ROLLBACK``, ``SELECT 1``) as a simple query: asyncpg sends it once a
        cancelled statement has ended; the connection goes back, or is discarded when
        it fails."""
        try:
            await taken[0].driver_connection.execute(verb)
        except Exception:
            borrowed.discard(taken[0])
            return
        await borrowed.give(*taken)

    async def _end(
        self,
        write: HeadWrite,
        write_id: int,
        borrowed: Borrowed,
        taken: tuple[Any, float],
        data: list[bytes],
    ) -> Head | None:
        """COMMIT a write whose compare-and-swap matched (ROLLBACK one that matched
        nothing: None); a COMMIT whose answer never came is settled by a look."""
        try:
            rows = copy_rows(b"".join(data), self._write_fields)
            self._sent("COMMIT" if rows else "ROLLBACK")
        except BaseException:
            await self._settle(borrowed, taken, "ROLLBACK")
            raise
        if not rows:
            await self._settle(borrowed, taken, "ROLLBACK")
            return None
        from asyncpg.exceptions import PostgresError

        try:
            await taken[0].driver_connection.execute("COMMIT")
        except PostgresError as exc:  # the server answered: rolled back
            if not lost_error(exc):
                await borrowed.give(*taken)
                raise self._driver_error(exc, False, True) from exc
            borrowed.discard(taken[0])
            return await self._after_a_lost_commit(write, write_id)
        except Exception:
            borrowed.discard(taken[0])
            borrowed.after_disconnect()
            return await self._after_a_lost_commit(write, write_id)
        await borrowed.give(*taken)
        version, incarnation, owner = rows[0]
        return Head(version, incarnation, owner, None)

    async def _after_a_lost_commit(self, write: HeadWrite, write_id: int) -> Head | None:
        """COMMIT may have been sent, and its answer never came: on a fresh connection,
        wait for the thread's row lock (the write holds it until its transaction ends,
        committed or rolled back), then look for its ``write_id``
        (:func:`~.lost_writes.after_a_lost_write`). A wait longer than
        :data:`SETTLE_MS` (or ``lock_timeout``), or a look that fails, leaves the outcome
        unknown: ``committed=None``."""
        t = self._sql.tables.threads
        lock = select(t.c.version).where(t.c.thread_id == bindparam("b_thread")).with_for_update()
        wait = max(SETTLE_MS, 0 if self.lock_timeout is None else timeout_ms(self.lock_timeout))
        values = {"b_thread": write.thread_id, "b_expected": write.expected, "b_write_id": write_id}
        try:
            async with self.connect() as conn:
                await conn.exec_driver_sql(f"SET LOCAL lock_timeout = {wait}")
                await conn.execute(lock, values)
                seen = (await conn.execute(did_it_apply(self._sql.tables), values)).first()
                await conn.rollback()
        except Exception as exc:
            raise self.lost(unknown_outcome()) from exc
        return after_a_lost_write(self, write, seen)
