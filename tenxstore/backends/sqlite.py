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
import functools
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.dml import Insert

from .base import Backend, StateWrite, timeout_ms

__all__ = ["MemoryBackend", "SqliteBackend", "is_memory"]

SchemaHook = Callable[[AsyncConnection], Awaitable[None]]
_WRITE = "tenxstore_write"  # execution option: this connection's next BEGIN is IMMEDIATE
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


def is_memory(url: URL) -> bool:
    """Whether a SQLite URL names an in-memory database."""
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database


class SqliteBackend(Backend):
    """A SQLite database file."""

    name = "sqlite"
    dialect = "sqlite"

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
        wait_ms = timeout_ms(lock_timeout)
        wal = not is_memory(engine.url)

        @event.listens_for(sync, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # Hand transaction control to SQLAlchemy's begin event below.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.execute(f"PRAGMA busy_timeout={wait_ms}")
                if wal:
                    cursor.execute("PRAGMA journal_mode=WAL")
            finally:
                cursor.close()

        @event.listens_for(sync, "begin")
        def _on_begin(conn: Connection) -> None:
            immediate = conn.get_execution_options().get(_WRITE, False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    def insert_ignore(self, table: Table, *conflict: str) -> Insert:
        return sqlite_insert(table).on_conflict_do_nothing(index_elements=list(conflict))

    def is_lock_timeout(self, exc: DBAPIError) -> bool:
        code = getattr(exc.orig, "sqlite_errorcode", None)  # Python 3.11+
        return isinstance(code, int) and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)

    async def begin_write(self, conn: AsyncConnection) -> None:
        await conn.execution_options(**{_WRITE: True})

    async def write_state(
        self, conn: AsyncConnection, sql: Any, params: StateWrite, prune: bool
    ) -> None:
        """Separate statements: on SQLite a statement costs no round trip."""
        thread, now = params["b_thread"], params["b_now"]
        await conn.execute(
            sql.insert_state,
            {
                "thread_id": thread,
                "version": params["b_version"],
                "state_data": params["b_state"],
                "meta": params["b_meta"],
                "created_at": now,
            },
        )
        if params["messages"]:
            rows = [{**row, "thread_id": thread, "created_at": now} for row in params["messages"]]
            await conn.execute(sql.insert_messages, rows)
        await conn.execute(
            sql.bump, {"b_thread": thread, "b_version": params["b_version"], "b_now": now}
        )
        if prune:
            await conn.execute(sql.prune, {"b_thread": thread, "b_upto": params["b_upto"]})

    def setup_engine(self) -> AsyncEngine:
        base = self.engine
        private = AsyncEngine(Engine(base.sync_engine.pool.recreate(), base.dialect, base.url))
        self.prepare(private, self.lock_timeout)
        return private


class MemoryBackend(SqliteBackend):
    """An in-memory SQLite database: one connection, transactions in turn.

    The connection is not tied to a loop (aiosqlite runs it in a thread): every loop
    shares it, and only aclose() closes it (the database goes with it).
    """

    name = "memory"
    pool_per_loop = False
    _create_schema: SchemaHook | None = None

    @classmethod
    def connect_args(cls, lock_timeout: float | None) -> dict[str, Any]:
        return {**super().connect_args(lock_timeout), "check_same_thread": False}

    @classmethod
    def pool_args(cls) -> dict[str, Any]:
        return {"poolclass": StaticPool}

    @functools.cached_property
    def _turns(self) -> weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]:
        return weakref.WeakKeyDictionary()

    def _turn(self) -> asyncio.Lock:
        """The lock that makes this loop's transactions take turns on the connection."""
        loop = asyncio.get_running_loop()
        lock = self._turns.get(loop)
        if lock is None:
            lock = self._turns[loop] = asyncio.Lock()
        return lock

    @asynccontextmanager
    async def connect(self, *, read: bool = False) -> AsyncIterator[AsyncConnection]:
        """The one connection, in turn; the schema is created before its first use."""
        engine, read_engine = self._engines.first
        async with self._turn(), (read_engine if read else engine).connect() as conn:
            if self._create_schema is not None:
                create, self._create_schema = self._create_schema, None
                try:
                    await create(conn)
                except BaseException:
                    self._create_schema = create
                    raise
            yield conn

    def create_schema_on_first_use(self, hook: SchemaHook) -> None:
        self._create_schema = hook

    def setup_engine(self) -> None:  # type: ignore[override]  # the database is this engine
        return None
