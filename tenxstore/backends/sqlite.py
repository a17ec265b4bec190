"""SQLite through aiosqlite: a database file, and an in-memory database.

* ``with_for_update()`` is silently dropped by SQLAlchemy's SQLite compiler, so a
  writer takes the database's write lock up front with ``BEGIN IMMEDIATE``; a
  deferred transaction that later writes would fail with SQLITE_BUSY without
  waiting on the busy timeout;
* the driver's own implicit transaction handling is turned off (SQLAlchemy's
  documented recipe) so that BEGIN is emitted by us and when we say;
* a file database uses WAL (readers never block the writer) and a busy timeout,
  which bounds how long a writer waits for the lock (``lock_timeout``);
* an in-memory database (:class:`MemoryBackend`) lives in one connection
  (``StaticPool``): its transactions take turns, and its schema is created on
  first use (it is new with every checkpointer).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

import aiosqlite
from sqlalchemy import Table, bindparam, create_engine, event, func, insert, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.expression import Executable

from .. import telemetry
from ..loops import CrossLoopLock
from .base import Backend, LangGraphFastPath, timeout_ms
from .codes import SQLITE_BUSY, SQLITE_CANTOPEN, SQLITE_LOCKED, sqlite_code
from .connections import give_back, on_every_connection
from .driver import DriverStatement
from .memory_sql import SqliteKeywords
from .records import Footprint, Head, HeadWrite, TableSizes

log = logging.getLogger(__name__)

_T = TypeVar("_T")

__all__ = ["MemoryBackend", "SqliteBackend", "is_memory"]

SchemaHook = Callable[[AsyncConnection], Awaitable[None]]
# A new in-memory database's schema as the migrations left it, per id types (see
# MemoryBackend._first_use): a private in-memory copy each, for this process.
_TEMPLATES: dict[Hashable, sqlite3.Connection] = {}
_TEMPLATES_LOCK = threading.Lock()
_WRITE = "tenxstore_write"  # execution option: this connection's next BEGIN is IMMEDIATE

if TYPE_CHECKING:
    from ..store import Store


def _busy(exc: BaseException | None) -> bool:
    """Whether a SQLite error is a lock that another connection holds (busy or locked)."""
    return sqlite_code(exc) in (SQLITE_BUSY, SQLITE_LOCKED)


def is_memory(url: URL) -> bool:
    """Whether a SQLite URL names an in-memory database."""
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database


def _set_pragmas_on_connect(engine: Engine, lock_timeout: float | None) -> None:
    """Every connection the engine opens: transactions ours (the driver's implicit ones
    off), foreign keys on, the busy timeout, and WAL for a file."""
    wait_ms = timeout_ms(lock_timeout)
    wal = not is_memory(engine.url)

    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={wait_ms}")
            if wal:
                _into_wal(cursor)
        finally:
            cursor.close()

    on_every_connection(engine, _on_connect)


class _EndingConnection(sqlite3.Connection):
    """A pysqlite connection whose ``close()`` releases every lock it holds first.

    SQLAlchemy invalidates, and so closes, the connection of a call cancelled in the
    middle of a statement. SQLite closes a connection that still has a statement in
    progress (the cursor the cancelled call left mid-result) as a "zombie" that keeps
    its transaction, and so the file's write lock (or, in a shared-cache database, its
    table locks), until that statement is finalized: whenever the garbage collector
    frees the cursor. Every writer meanwhile waits out its ``lock_timeout``. So the
    close first resets the statements of its cursors and rolls back: the close is
    then a real one. It runs where the close runs: on the connection's own thread
    (aiosqlite's, or the hot path's worker).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cursors: weakref.WeakSet[sqlite3.Cursor] = weakref.WeakSet()

    def cursor(self, *args: Any, **kwargs: Any) -> Any:  # execute() makes its cursor here too
        made = super().cursor(*args, **kwargs)
        self._cursors.add(made)
        return made

    def close(self) -> None:
        try:
            for cursor in list(self._cursors):
                cursor.close()  # resets its statement: a read in progress holds locks too
            if self.in_transaction:
                self.rollback()
        except sqlite3.Error:
            pass  # closed already, or a broken file: close() is all that is left to do
        super().close()


def _open_through_driver(engine: Engine) -> None:
    """Every aiosqlite connection the engine opens goes through :func:`_open_aiosqlite`,
    as an :class:`_EndingConnection`."""

    @event.listens_for(engine, "do_connect")
    def _do_connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        cparams = {"factory": _EndingConnection, **cparams}
        return dialect.dbapi.connect(*cargs, async_creator_fn=_open_aiosqlite, **cparams)


async def _open_aiosqlite(*args: Any, **kwargs: Any) -> Any:
    """An aiosqlite connection, opened; one that fails to open has ended its thread.

    aiosqlite's clean-up of a connection that failed to open (a folder where the file
    should be, a file we may not read) queues the stop of its thread without waiting:
    the thread then posts the stop's result to the caller's event loop. Raised at once,
    the error can end the caller and its loop first (a test's loop closes as the test
    ends), and the thread's post fails with "Event loop is closed" in that thread (what
    pytest reported at the end of the whole suite). So the error waits for the thread.
    """
    connection = aiosqlite.connect(*args, **kwargs)
    # The thread: aiosqlite 0.22 keeps it in ``_thread``; before, the connection was one.
    thread = cast(threading.Thread, getattr(connection, "_thread", connection))
    thread.daemon = True  # as SQLAlchemy sets it: a connection never closed ends with us
    try:
        return await connection
    except BaseException:
        if thread.is_alive():
            await asyncio.shield(asyncio.to_thread(thread.join))
        raise


def _into_wal(cursor: Any) -> None:
    """WAL is a property of the file: set it once. Switching needs the file to itself,
    so a process that races another one's switch (several processes setting up at
    once) accepts the file already in WAL rather than failing its connection."""
    if _journal_mode(cursor) == "wal":
        return
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError:
        if _journal_mode(cursor) != "wal":
            raise


def _journal_mode(cursor: Any) -> str:
    cursor.execute("PRAGMA journal_mode")
    return str(cursor.fetchone()[0]).lower()


async def _file_identity(conn: AsyncConnection) -> str:
    """The database file's device and inode: the same by every path to it, different
    in a copy (an in-memory database has none)."""
    rows: list[Any] = list(await conn.exec_driver_sql("PRAGMA database_list"))
    path = next((row[2] for row in rows if row[1] == "main"), "")
    if not path:
        return ""
    found = os.stat(path)
    return f"{found.st_dev}:{found.st_ino}"


class _Ticket:
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
                "factory": _EndingConnection,
            },
            pool_size=self.WORKERS + self.READERS,
        )
        _set_pragmas_on_connect(self.engine, self.SLICE)
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
                if not _busy(exc) or (deadline is not None and time.monotonic() >= deadline):
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
        ticket = _Ticket()
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

    def commit(self, write: HeadWrite, ticket: _Ticket | None = None) -> Head | None:
        """The common state write (see :class:`HeadWrite`) under the write lock."""
        return self.write(lambda cursor: self._commit(cursor, write), ticket)

    def write(self, work: Callable[[Any], _T | None], ticket: _Ticket | None = None) -> _T | None:
        """``work(cursor)`` under the write lock: committed when it returns a value."""
        connection = self.engine.raw_connection()
        driver = connection.driver_connection
        assert driver is not None
        ticket = ticket or _Ticket()
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

    def _take_turn(self, ticket: _Ticket) -> bool:
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

    def _begin(self, cursor: Any, ticket: _Ticket) -> bool:
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
                if not _busy(exc) or (deadline is not None and time.monotonic() >= deadline):
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


class SqliteBackend(Backend):
    """A SQLite database file."""

    name = "sqlite"
    dialect = "sqlite"
    keywords = SqliteKeywords()
    _hot: HotPath | None = None

    async def identity(self, conn: AsyncConnection, schema: str | None) -> str:
        return await _file_identity(conn)

    async def footprint(
        self, conn: AsyncConnection, schema: str | None, tables: Sequence[Table], exact: bool
    ) -> Footprint:
        """Rows counted; each table's and its indexes' pages from ``dbstat`` (a build
        option SQLite usually has; without it, only the file's pages); no dead rows
        (deleted rows' pages go to the free list, reported as free bytes)."""
        page_size = (await conn.exec_driver_sql("PRAGMA page_size")).scalar_one()
        pages = (await conn.exec_driver_sql("PRAGMA page_count")).scalar_one()
        free = (await conn.exec_driver_sql("PRAGMA freelist_count")).scalar_one()
        sizes: dict[str, int] | None
        try:  # a failed statement leaves a SQLite transaction as it was
            found_sizes: Any = await conn.exec_driver_sql(
                "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"
            )
            sizes = {str(row[0]): int(row[1]) for row in found_sizes}
        except DBAPIError:
            sizes = None
        indexes: dict[str, list[str]] = {}
        listed: Any = await conn.exec_driver_sql(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index'"
        )
        for row in listed:
            indexes.setdefault(str(row[1]), []).append(str(row[0]))
        found = {}
        for table in tables:
            rows = (await conn.execute(select(func.count()).select_from(table))).scalar_one()
            if sizes is None:
                found[table.name] = TableSizes(rows, None, None, None)
            else:
                index = sum(sizes.get(i, 0) for i in indexes.get(table.name, []))
                found[table.name] = TableSizes(rows, sizes.get(table.name, 0), index, None)
        return Footprint(found, page_size * pages, page_size * free)

    def bind(self, sql: Any) -> None:
        super().bind(sql)
        if self.owns_engine and self.pool_per_loop:  # a file, from a URL of ours
            self._hot = HotPath(self.engine.url, self.lock_timeout, sql, self._sent)

    async def read_head(self, thread_id: Any, user_id: Any) -> Head | None:
        if self._hot is None:
            return await super().read_head(thread_id, user_id)
        try:
            result: Head | None = await self._hot.read_in_thread(thread_id, user_id)
        except sqlite3.Error as exc:
            raise self._driver_error(exc) from exc
        return result

    async def commit_head(self, write: HeadWrite) -> Head | None:
        if self._hot is None:
            return None
        try:
            result: Head | None = await self._hot.commit_in_thread(write)
        except sqlite3.Error as exc:
            raise self._driver_error(exc) from exc
        return result

    @property
    def hot_path(self) -> HotPath | None:
        """The file's driver-level path (None for a database of another kind: an
        engine given by the caller, the in-memory database)."""
        return self._hot

    def langgraph_fast_path(self, store: Store) -> LangGraphFastPath | None:
        """One thread hop each on the file's driver-level path (:mod:`.sqlite_langgraph`);
        None without one."""
        if self._hot is None:
            return None
        from .sqlite_langgraph import OneHop

        return OneHop(store)

    async def write_in_thread(self, work: Callable[[Any], _T | None]) -> _T | None:
        """``work(cursor)`` under the write lock in one thread hop (see
        :meth:`HotPath.write_in_thread`), driver errors as tenxstore's."""
        assert self._hot is not None
        try:
            return await self._hot.write_in_thread(work)
        except sqlite3.Error as exc:
            raise self._driver_error(exc) from exc

    async def read_in_thread(self, work: Callable[[Any], _T]) -> _T:
        """``work(cursor)`` in one read transaction, in one thread hop."""
        assert self._hot is not None
        try:
            return await self._hot.read_in_thread_with(work)
        except sqlite3.Error as exc:
            raise self._driver_error(exc) from exc

    def _driver_error(self, exc: sqlite3.Error) -> Exception:
        if _busy(exc):
            return self.lock_timed_out()
        if sqlite_code(exc) == SQLITE_CANTOPEN:
            return self.opening_failed(exc)
        return exc

    async def aclose(self) -> None:
        await super().aclose()
        if self._hot is not None:
            self._hot.close()

    @classmethod
    def connect_args(cls, lock_timeout: float | None) -> dict[str, Any]:
        return {"timeout": timeout_ms(lock_timeout) / 1000}  # the busy timeout

    @classmethod
    def prepare(cls, engine: AsyncEngine, lock_timeout: float | None) -> None:
        """Install the pragma and transaction hooks (once per engine)."""
        sync = engine.sync_engine
        if getattr(sync, "_tenxstore_prepared", False):
            return
        sync._tenxstore_prepared = True  # type: ignore[attr-defined]  # a marker of ours
        _open_through_driver(sync)
        _set_pragmas_on_connect(sync, lock_timeout)

        @event.listens_for(sync, "begin")
        def _on_begin(conn: Connection) -> None:
            immediate = conn.get_execution_options().get(_WRITE, False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    def insert(self, table: Table) -> Any:
        return sqlite_insert(table)

    def is_lock_timeout(self, exc: DBAPIError) -> bool:
        return _busy(exc.orig)

    async def begin_write(self, conn: AsyncConnection) -> None:
        await conn.execution_options(**{_WRITE: True})

    @functools.cached_property
    def _writers(self) -> CrossLoopLock:
        """This process's writers take turns before SQLite's write lock: one that found
        it taken would sleep in SQLite's busy handler (1, 2, 5, 10... ms) instead of
        starting as the other commits (LangGraph writes a step's checkpoint and its
        tasks' writes at once)."""
        return CrossLoopLock()

    @asynccontextmanager
    async def _block_write(
        self, lock: Executable, params: dict[str, Any]
    ) -> AsyncIterator[tuple[AsyncConnection, Any]]:
        """The write transaction, once this process's writers before it are done
        (within ``lock_timeout``, as SQLite's own wait would be)."""
        waits, started = self._writers.locked(), time.monotonic()
        if self.lock_timeout is None:
            await self._writers.acquire()
        else:
            try:
                await asyncio.wait_for(self._writers.acquire(), self.lock_timeout)
            except asyncio.TimeoutError:
                raise self.lock_timed_out() from None
        if waits:
            telemetry.lock_waited(log, self.name, time.monotonic() - started)
        try:
            async with super()._block_write(lock, params) as locked:
                yield locked
        finally:
            self._writers.release()

    def setup_engine(self) -> AsyncEngine:
        base = self.engine
        private = AsyncEngine(Engine(base.sync_engine.pool.recreate(), base.dialect, base.url))
        self.prepare(private, self.lock_timeout)
        return private


class MemoryBackend(SqliteBackend):
    """An in-memory SQLite database: one connection, transactions in turn.

    The connection is not tied to a loop (aiosqlite runs it in a thread): every loop
    shares it, in turn (a lock across loops and threads). The database is a named one
    (``file:tenxstore-<id>?mode=memory&cache=shared``) that a second, idle connection
    keeps alive: when SQLAlchemy replaces the working connection (one it invalidated
    after a cancelled call) the new one opens the same database, not an empty one.
    Only aclose() closes both (the database goes with them).
    """

    name = "memory"
    pool_per_loop = False
    _create_schema: SchemaHook | None = None
    _template: Hashable = None

    @classmethod
    def create_engine(
        cls, url: URL, options: dict[str, Any], lock_timeout: float | None
    ) -> AsyncEngine:
        if url.database in (None, "", ":memory:"):
            name = f"file:tenxstore-{uuid.uuid4().hex}?mode=memory&cache=shared"
            url = url.set(database=name, query={"uri": "true"})
        return super().create_engine(url, options, lock_timeout)

    def __init__(self, engine: AsyncEngine, **kwargs: Any) -> None:
        super().__init__(engine, **kwargs)
        database = engine.url.database or ""
        self._keeper = (
            sqlite3.connect(database, uri=True, check_same_thread=False)
            if database.startswith("file:") and "mode=memory" in database
            else None
        )

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            if self._keeper is not None:
                self._keeper.close()

    @classmethod
    def connect_args(cls, lock_timeout: float | None) -> dict[str, Any]:
        return {**super().connect_args(lock_timeout), "check_same_thread": False}

    @classmethod
    def pool_args(cls) -> dict[str, Any]:
        return {"poolclass": StaticPool}

    @functools.cached_property
    def _turn(self) -> CrossLoopLock:
        """Makes transactions take turns on the one connection, whichever event loop
        (and thread) they run on."""
        return CrossLoopLock()

    @asynccontextmanager
    async def connect(self, *, read: bool = False) -> AsyncIterator[AsyncConnection]:
        """The one connection, in turn; the schema is created before its first use."""
        engines = self._engines.first
        async with self._turn:
            conn = await (engines.read if read else engines.engine).connect().start()
            try:
                if self._create_schema is not None:
                    create, self._create_schema = self._create_schema, None
                    try:
                        await self._first_use(conn, create)
                    except BaseException:
                        self._create_schema = create
                        raise
                yield conn
            finally:
                await give_back(conn, self.name)

    async def _first_use(self, conn: AsyncConnection, create: SchemaHook) -> None:
        """Create the schema: a copy of the one the migrations made for the first
        database of these id types in this process (sqlite3's backup, with a store id
        of its own), or the migrations themselves for that first one (~0.2 s: a test
        suite makes a checkpointer per test). The hook then finds it at head."""
        keeper, key = self._keeper, self._template
        with _TEMPLATES_LOCK:
            template = None if key is None else _TEMPLATES.get(key)
        if template is not None and keeper is not None:
            with _TEMPLATES_LOCK:  # one backup from the template at a time
                template.backup(keeper)
            keeper.execute("UPDATE tenxstore_store SET store_id = ?", (uuid.uuid4().hex,))
            keeper.commit()
        await create(conn)
        if template is None and key is not None and keeper is not None:
            copy = sqlite3.connect(":memory:", check_same_thread=False)
            keeper.backup(copy)
            with _TEMPLATES_LOCK:
                _TEMPLATES.setdefault(key, copy)

    def create_schema_on_first_use(self, hook: SchemaHook, template: Hashable = None) -> None:
        self._create_schema, self._template = hook, template

    def setup_engine(self) -> None:  # type: ignore[override]  # the database is this engine
        return None
