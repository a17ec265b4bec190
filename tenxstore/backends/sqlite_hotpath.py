"""The one-round-trip hot path of a SQLite file: the head read and the common state
write (and the LangGraph saver's statements, :mod:`.sqlite_langgraph`), each in ONE
thread hop on a pysqlite connection, with the write lock taken in slices so that a
cancelled caller stops its write (:class:`HotPath`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import bindparam, create_engine, insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL

from .. import telemetry
from .codes import SQLITE_BUSY
from .driver import DriverStatement
from .records import Head, HeadWrite
from .sqlite_driver import EndingConnection, busy, set_pragmas_on_connect

# The backend's logger: the hot path's lines are the SQLite backend's, as they were
# when this module was part of it.
log = logging.getLogger("tenxstore.backends.sqlite")

_T = TypeVar("_T")

__all__ = ["HotPath"]


class Ticket:
    """One write in a worker thread, and the way to stop it: a cancelled caller sets
    ``cancelled`` and interrupts the connection, so the write rolls back instead of
    committing after the call has ended.

    The interrupt and the worker's :meth:`detach` take turns (a lock): once the worker
    has detached the connection (to roll back or commit, or to give it back to the
    pool), no interrupt of this ticket reaches it. Else a canceller that had read the
    connection just before could interrupt its COMMIT, or the statement of the next
    writer that took the connection from the pool: an error in an innocent call."""

    __slots__ = ("_lock", "cancelled", "connection")

    def __init__(self) -> None:
        self.cancelled = False
        self.connection: Any = None
        self._lock = threading.Lock()

    def attach(self, connection: Any) -> None:
        """The write runs on ``connection`` now: a cancel interrupts it."""
        with self._lock:
            self.connection = connection

    def detach(self) -> None:
        """Nothing of the write is left to interrupt on the connection."""
        with self._lock:
            self.connection = None

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self.connection is not None:
                self.connection.interrupt()  # a statement waiting for the lock stops now


class HotPath:
    """The head read and the common state write of a SQLite file, each in ONE thread
    hop: compiled statements run on a pysqlite connection from a synchronous
    SQLAlchemy pool of the same file, in small thread pools (aiosqlite would make a
    hop of every cursor, execute, fetch and close: 21 for a write). Reads have threads
    of their own, so writers waiting for another process's lock never hold them up;
    the pools are made again after :meth:`close`."""

    WORKERS = 4
    READERS = 2
    SLICE = 0.05
    """Seconds SQLite itself waits for the write lock at a time: between slices a
    writer sees whether its caller is gone (SQLite's busy wait cannot be interrupted)."""

    def __init__(self, url: URL, lock_timeout: float | None, sql: Any, sent: Any) -> None:
        self.lock_timeout = lock_timeout
        self.engine = create_engine(
            url.set(drivername="sqlite+pysqlite"),
            connect_args={
                "check_same_thread": False,
                "timeout": self.SLICE,
                "factory": EndingConnection,
            },
            pool_size=self.WORKERS + self.READERS,
        )
        set_pragmas_on_connect(self.engine, self.SLICE)
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._pools_lock = threading.Lock()
        # This process's writers take turns here, woken at once when the turn frees,
        # rather than in SQLite's busy wait (which sleeps 1, 2, 5, 10... ms between
        # looks); another process's writer is still waited for by SQLite.
        self._turn = threading.Lock()
        self._sent = sent
        dialect = self.engine.dialect
        t, s, m = sql.tables.threads, sql.tables.states, sql.tables.messages
        thread = bindparam("b_thread", type_=t.c.thread_id.type)
        now = bindparam("b_now", type_=t.c.updated_at.type)
        self.lock = DriverStatement(sql.lock, dialect)
        self.read_any = DriverStatement(sql.head_state, dialect)
        self.read_own = DriverStatement(sql.head_state_of_user, dialect)
        self.insert_state = DriverStatement(
            insert(s).values(
                thread_id=thread,
                version=bindparam("b_version"),
                state_data=bindparam("b_state"),
                meta=bindparam("b_meta"),
                created_at=now,
            ),
            dialect,
        )
        self.insert_message = DriverStatement(
            sqlite_insert(m)
            .values(
                thread_id=thread,
                message_id=bindparam("message_id"),
                role=bindparam("role"),
                payload=bindparam("payload"),
                created_at=now,
            )
            .on_conflict_do_nothing(index_elements=["thread_id", "message_id"]),
            dialect,
        )
        self.bump = DriverStatement(sql.bump, dialect)
        self.prune = DriverStatement(sql.prune, dialect)

    def _pool(self, kind: str) -> ThreadPoolExecutor:
        with self._pools_lock:
            pool = self._pools.get(kind)
            if pool is None:
                size = self.READERS if kind == "read" else self.WORKERS
                pool = ThreadPoolExecutor(size, thread_name_prefix=f"tenxstore-sqlite-{kind}")
                self._pools[kind] = pool
            return pool

    async def read_in_thread(self, thread_id: Any, user_id: Any) -> Head | None:
        """:meth:`read` in a reader thread: one hop."""
        loop = asyncio.get_running_loop()
        head: Head | None = await loop.run_in_executor(
            self._pool("read"), self.read, thread_id, user_id
        )
        return head

    async def commit_in_thread(self, write: HeadWrite) -> Head | None:
        """:meth:`commit` in a writer thread: one hop (see :meth:`write_in_thread`)."""
        return await self.write_in_thread(lambda cursor: self._commit(cursor, write))

    async def read_in_thread_with(self, work: Callable[[Any], _T]) -> _T:
        """``work(cursor)`` in a reader thread, in one read transaction (one snapshot):
        one hop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool("read"), self.read_with, work)

    async def fetch_in_thread(self, stmt: DriverStatement, values: Mapping[str, Any]) -> Any:
        """The first row of one read statement (or None) in a reader thread: one hop,
        no transaction (one statement reads one snapshot)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool("read"),
            self._reading,
            lambda cursor: self.execute(cursor, stmt, values).fetchone(),
        )

    def read_with(self, work: Callable[[Any], _T]) -> _T:
        """``work(cursor)`` in a read transaction (see :meth:`_reading`)."""

        def in_snapshot(cursor: Any) -> _T:
            self._sent("BEGIN")
            cursor.execute("BEGIN")
            try:
                return work(cursor)
            finally:
                cursor.execute("ROLLBACK")  # it wrote nothing: ends the snapshot

        return self._reading(in_snapshot)

    def _reading(self, work: Callable[[Any], _T]) -> _T:
        """``work(cursor)`` on a pooled connection. A WAL read never waits for the write
        lock; the rare busy moment (a checkpoint, a recovery) is waited out in slices up
        to ``lock_timeout``."""
        deadline = None if self.lock_timeout is None else time.monotonic() + self.lock_timeout
        while True:
            connection = self.engine.raw_connection()
            try:
                cursor = connection.cursor()
                try:
                    return work(cursor)
                finally:
                    cursor.close()
            except sqlite3.OperationalError as exc:
                if not busy(exc) or (deadline is not None and time.monotonic() >= deadline):
                    raise
                telemetry.retried(log, "sqlite", "a read found the database busy")
            finally:
                connection.close()

    async def write_in_thread(self, work: Callable[[Any], _T | None]) -> _T | None:
        """``work(cursor)`` under the write lock (``BEGIN IMMEDIATE``) in a writer
        thread: one hop. It commits what ``work`` did when it returns a value, and
        rolls back when it returns None or raises. A cancelled caller stops the
        write (it rolls back unless it had committed already) and waits for the
        thread to finish, so nothing commits after the call has ended."""
        ticket = Ticket()
        done: asyncio.Future[_T | None] = asyncio.get_running_loop().run_in_executor(
            self._pool("write"), functools.partial(self.write, work, ticket)
        )
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            ticket.cancel()
            while not done.done():
                with contextlib.suppress(BaseException):
                    await asyncio.shield(done)
            raise

    def read(self, thread_id: Any, user_id: Any) -> Head | None:
        """The head of a thread (as its caller may see it), or None (see :meth:`_reading`)."""
        values = {"b_thread": thread_id, "b_user": user_id}
        stmt = self.read_any if user_id is None else self.read_own
        row = self._reading(lambda cursor: self.execute(cursor, stmt, values).fetchone())
        return None if row is None else Head(row[0], row[1], row[3], row[2])

    def commit(self, write: HeadWrite, ticket: Ticket | None = None) -> Head | None:
        """The common state write (see :class:`HeadWrite`) under the write lock."""
        return self.write(lambda cursor: self._commit(cursor, write), ticket)

    def write(self, work: Callable[[Any], _T | None], ticket: Ticket | None = None) -> _T | None:
        """``work(cursor)`` under the write lock: committed when it returns a value."""
        connection = self.engine.raw_connection()
        driver = connection.driver_connection
        assert driver is not None
        ticket = ticket or Ticket()
        ticket.attach(driver)
        turn = False
        try:
            if ticket.cancelled:
                return None
            turn = self._take_turn(ticket)
            if not turn:
                return None  # the caller is gone: nothing was written
            cursor = connection.cursor()
            if not self._begin(cursor, ticket):
                return None  # the caller is gone: nothing was written
            try:
                result = work(cursor)
                if ticket.cancelled:  # the caller is gone: never commit after it
                    result = None
            except BaseException:
                ticket.detach()  # nothing to interrupt in the rollback
                if driver.in_transaction:
                    self._sent("ROLLBACK")
                    cursor.execute("ROLLBACK")
                raise
            ticket.detach()
            self._sent("COMMIT" if result is not None else "ROLLBACK")
            cursor.execute("COMMIT" if result is not None else "ROLLBACK")
            cursor.close()
            return result
        finally:
            ticket.detach()
            if turn:
                self._turn.release()
            connection.close()

    def _take_turn(self, ticket: Ticket) -> bool:
        """This process's turn to write, waited for up to ``lock_timeout`` (then
        LockTimeout, as SQLite's own wait would end); False when the caller is gone."""
        if self._turn.acquire(blocking=False):
            return True
        started = time.monotonic()
        deadline = None if self.lock_timeout is None else started + self.lock_timeout
        while not self._turn.acquire(timeout=self.SLICE):
            if ticket.cancelled:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                busy = sqlite3.OperationalError("database is locked (by a writer of this process)")
                busy.sqlite_errorcode = SQLITE_BUSY  # type: ignore[attr-defined]  # as SQLite's
                raise busy
        telemetry.lock_waited(log, "sqlite", time.monotonic() - started)
        return True

    def execute(self, cursor: Any, stmt: DriverStatement, values: Mapping[str, Any]) -> Any:
        """One compiled statement on a cursor of :meth:`write` or :meth:`read_with`."""
        self._sent(stmt.sql)
        return cursor.execute(stmt.sql, stmt.args(values))

    def execute_many(
        self, cursor: Any, stmt: DriverStatement, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        """One compiled statement for each of ``rows``."""
        self._sent(stmt.sql)
        cursor.executemany(stmt.sql, [stmt.args(row) for row in rows])

    def _begin(self, cursor: Any, ticket: Ticket) -> bool:
        """BEGIN IMMEDIATE, waiting for the write lock up to ``lock_timeout`` in slices;
        False when the caller is gone meanwhile."""
        started = time.monotonic()
        deadline = None if self.lock_timeout is None else started + self.lock_timeout
        waited = False
        while True:
            if ticket.cancelled:
                return False
            self._sent("BEGIN IMMEDIATE")
            try:
                cursor.execute("BEGIN IMMEDIATE")
                if waited:  # another process held the write lock
                    telemetry.lock_waited(log, "sqlite", time.monotonic() - started)
                return True
            except sqlite3.OperationalError as exc:
                if not busy(exc) or (deadline is not None and time.monotonic() >= deadline):
                    raise
                waited = True

    def _commit(self, cursor: Any, w: HeadWrite) -> Head | None:
        """Under the write lock: the common case only (see :class:`HeadWrite`)."""
        values: dict[str, Any] = {"b_thread": w.thread_id, "b_now": w.now}
        row = self.execute(cursor, self.lock, values).fetchone()
        if (
            row is None
            or (w.owned and row[0] != w.user_id)
            or (w.expected is not None and row[1] != w.expected)
            or (w.incarnation is not None and row[2] != w.incarnation)
        ):
            return None
        version = row[1] + 1
        values.update(b_version=version, b_state=w.state, b_meta=w.meta)
        self.execute(cursor, self.insert_state, values)
        if w.messages:
            self._sent(self.insert_message.sql)
            stmt = self.insert_message
            cursor.executemany(stmt.sql, [stmt.args({**values, **m}) for m in w.messages])
        self.execute(cursor, self.bump, values)
        if version > w.history_limit:
            self.execute(cursor, self.prune, {**values, "b_upto": version - w.history_limit})
        return Head(version, row[2], row[0], None)

    def close(self) -> None:
        """Let the threads go and close the idle connections; a later call makes new
        ones (another loop may still be using the checkpointer)."""
        with self._pools_lock:
            pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.shutdown(wait=False)
        self.engine.dispose()
