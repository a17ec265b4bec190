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

How connections are opened and set up is :mod:`.sqlite_driver`'s; the file's
one-hop reads and writes are :mod:`.sqlite_hotpath`'s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import ColumnElement, Table, event, func, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.expression import Executable

from .. import telemetry
from ..loops import CrossLoopLock
from .base import Backend, timeout_ms
from .codes import SQLITE_CANTOPEN, sqlite_code
from .connections import give_back
from .driver import DriverStatement
from .memory_sql import SqliteKeywords
from .records import Footprint, Head, HeadWrite, LangGraphFastPath, MemoryFastPath, TableSizes
from .sqlite_driver import (
    busy,
    file_identity,
    is_memory,
    open_through_driver,
    set_pragmas_on_connect,
)
from .sqlite_hotpath import (
    HotPath,
    Ticket,  # noqa: F401  # tests/contract/test_cancellation.py imports it from here
)
from .sqlite_memory import OneHop as OneHopMemory

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


class SqliteBackend(Backend):
    """A SQLite database file."""

    name = "sqlite"
    dialect = "sqlite"
    keywords = SqliteKeywords()
    _hot: HotPath | None = None

    def identity_columns(self, schema: str | None) -> list[ColumnElement[Any]]:
        """The database file's path, whose device and inode are the identity."""
        files = func.pragma_database_list().table_valued("name", "file")
        return [select(files.c.file).where(files.c.name == "main").scalar_subquery()]

    def identity_text(self, values: Sequence[Any]) -> str:
        return file_identity(values[0])

    def declared_type(self, of: Table, name: str, schema: str | None) -> ColumnElement[Any]:
        info = func.pragma_table_info(of.name).table_valued("name", "type")
        return select(info.c.type).where(info.c.name == name).scalar_subquery()

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

    async def fetch_in_thread(self, stmt: DriverStatement, values: Mapping[str, Any]) -> Any:
        """The first row of one read statement (or None), in one thread hop."""
        assert self._hot is not None
        try:
            return await self._hot.fetch_in_thread(stmt, values)
        except sqlite3.Error as exc:
            raise self._driver_error(exc) from exc

    def memory_fast_path(self, store: Store) -> MemoryFastPath | None:
        """One thread hop each on the file's driver-level path (:mod:`.sqlite_memory`);
        None without one."""
        return None if self._hot is None else OneHopMemory(self, store)

    def _driver_error(self, exc: sqlite3.Error) -> Exception:
        if busy(exc):
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
        open_through_driver(sync)
        set_pragmas_on_connect(sync, lock_timeout)

        @event.listens_for(sync, "begin")
        def _on_begin(conn: Connection) -> None:
            immediate = conn.get_execution_options().get(_WRITE, False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    def insert(self, table: Table) -> Any:
        return sqlite_insert(table)

    def is_lock_timeout(self, exc: DBAPIError) -> bool:
        return busy(exc.orig)

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
