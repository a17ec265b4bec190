"""What every database mode provides, and the machinery the modes share.

A :class:`Backend` owns one engine and everything that differs by database mode:
how the engine is made and prepared, how a read runs, how a write transaction
begins, takes the thread's lock and commits, which failures are retried, how driver
errors become tenxstore's, and the statements that have a faster form on that
database. The repository builds SQL once and hands it to its backend; nothing
outside ``tenxstore/backends`` asks which database it is talking to.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, Protocol

import asyncpg
from sqlalchemy import String, Table, event, func, select
from sqlalchemy.engine import URL, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool, QueuePool, StaticPool
from sqlalchemy.sql import Executable
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.util import greenlet_spawn

from .. import telemetry
from ..errors import (
    ConfigError,
    ConnectionLost,
    DatabaseUnavailable,
    LockTimeout,
    StatementCancelled,
    TenxStoreError,
)
from ..loops import PerLoop, shut_down
from ..models import Tables
from ..validate import masked_url
from .driver import DriverStatement, causes
from .memory_sql import KeywordSearch
from .retry import RetryPolicy

if TYPE_CHECKING:
    from ..store import Store

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "OPENING_ERRORS",
    "Backend",
    "Borrowed",
    "DialectName",
    "EngineSet",
    "Footprint",
    "Head",
    "HeadWrite",
    "StateWrite",
    "TableSizes",
    "give_back",
    "on_every_connection",
    "sqlite_code",
    "timeout_ms",
]

log = logging.getLogger(__name__)

DialectName = Literal["postgresql", "sqlite", "mysql"]
# SQLite's primary result codes that tenxstore acts on, and the messages SQLite gives
# them (sqlite3_errmsg: a locked table or schema may name itself after a colon).
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_CANTOPEN = 5, 6, 14
_SQLITE_MESSAGES = (
    ("database is locked", SQLITE_BUSY),
    ("database table is locked", SQLITE_LOCKED),
    ("database schema is locked", SQLITE_LOCKED),
    ("unable to open database file", SQLITE_CANTOPEN),
)
DEFAULT_LOCK_TIMEOUT_S = 30.0
# What opening a connection may raise. SQLAlchemy 2.1 wraps the driver's refusal in
# DBAPIError; 2.0 (the line Python 3.10 gets) lets asyncpg's own error through.
OPENING_ERRORS: tuple[type[BaseException], ...] = (
    DBAPIError,
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
)
_FOREVER_MS = 2**31 - 1


def sqlite_code(exc: BaseException | None) -> int | None:
    """SQLite's primary result code behind a :mod:`sqlite3` error, or None.

    Python 3.11+ gives it as ``sqlite_errorcode`` (perhaps extended: the low byte is
    the primary code); Python 3.10 gives only SQLite's message, which names the codes
    above exactly as SQLite words them."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    message = str(exc)
    for words, primary in _SQLITE_MESSAGES:
        if message.startswith(words):
            return primary
    return None


def timeout_ms(lock_timeout: float | None) -> int:
    """A lock timeout in whole milliseconds (None: as long as the database allows)."""
    return _FOREVER_MS if lock_timeout is None else max(1, int(lock_timeout * 1000))


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, wherever SQLAlchemy's wrapping put it."""
    for seen in causes(exc):
        code = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if isinstance(code, str):
            return code
    return None


_REFUSALS = {
    "3D000": "no such database: create it, or fix the database name in the URL",
    "28000": "authentication failed: no such role, or it may not log in (check the user)",
    "28P01": "authentication failed: wrong password",
    "57P03": "the server is starting up or shutting down: try again shortly",
    "53300": "the server has no connection slot left (max_connections): use a pooler",
}


def _refusal(exc: BaseException) -> str | None:
    """Why a connection could not be opened, in words; None when an opened connection
    broke instead (that is ConnectionLost, not DatabaseUnavailable)."""
    if isinstance(exc, socket.gaierror):
        return "unknown host: check the host name in the URL"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused: is the server running, and on this host and port?"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timed out: the server does not answer (a firewall, a wrong host?)"
    state = _sqlstate(exc)
    if state in _REFUSALS:
        return _REFUSALS[state]
    if sqlite_code(getattr(exc, "orig", None)) == SQLITE_CANTOPEN:
        return "SQLite cannot open the file: does its directory exist, and may we write it?"
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
        return f"cannot connect ({exc.strerror or exc})"
    return None


@dataclass(frozen=True, slots=True)
class HeadWrite:
    """A state write that a backend's hot path may commit in one step.

    It commits only the common case — the thread exists, ``user_id`` owns it exactly
    (when ``owned``: None is a thread of no user), its version is ``expected`` and its
    incarnation ``incarnation`` (when given) — and otherwise writes nothing: the
    repository then takes the locked path, which creates threads and raises the precise
    error. A sealed write is ``owned`` whether isolation applies or not: its payloads
    were sealed for that owner and that incarnation before the write began, so they
    may be stored only in the thread's life that has both.
    """

    thread_id: Any
    user_id: Any
    owned: bool
    expected: int | None
    incarnation: int | None
    state: str
    meta: str | None
    now: datetime
    messages: list[dict[str, Any]]
    history_limit: int


class Head(NamedTuple):
    """A thread's head: version, incarnation, owner (the row's ``user_id``), and the
    state's text (None when it has no state, or when not read)."""

    version: int
    incarnation: int
    user_id: Any
    state: str | None


class TableSizes(NamedTuple):
    """One table as the database accounts for it (None: it cannot say)."""

    rows: int | None
    table_bytes: int | None
    index_bytes: int | None
    dead_rows: int | None


class Footprint(NamedTuple):
    """The store's tables on disk (see :meth:`Backend.footprint`)."""

    tables: dict[str, TableSizes]
    database_bytes: int | None
    free_bytes: int | None


StateWrite = dict[str, Any]
"""Parameters of one state write: ``b_thread``, ``b_version``, ``b_state``, ``b_meta``,
``b_now``, ``b_upto`` and ``messages`` (rows of ``message_id``, ``role``, ``payload``)."""


class Borrowed:
    """Connections borrowed from SQLAlchemy's pool for driver-level hot statements,
    kept between calls so a hot call pays no checkout.

    A hot call takes one (the last one given back, or a new checkout), runs its
    statement on the driver connection, and gives it back. At most ``capacity`` (the
    pool's size) are borrowed at once; a hot call beyond that waits here and is handed
    the next one given back, without a trip through the pool. The pool still owns
    every one: its limits bound them, and they go back to it at the loop's shutdown,
    at ``aclose()``, and after :data:`HOLD_SECONDS` (so the pool can recycle them).

    SQLAlchemy's own checkouts never starve: they count themselves as waiting
    (:meth:`checkout`), a connection given back while one waits goes to the pool
    (which serves its waiters in turn), and one that finds the pool empty first
    returns an idle connection to it.
    """

    HOLD_SECONDS = 300.0

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        pool = engine.sync_engine.pool
        self.capacity = pool.size() if isinstance(pool, QueuePool) else 0
        self._idle: list[tuple[Any, float]] = []
        self._held = 0  # borrowed now: in use by hot calls, or idle here
        self._waiting = 0  # checkouts waiting for the pool (hot and SQLAlchemy's)
        self._sqlalchemy_waiting = 0  # of which SQLAlchemy's own
        self._queue: collections.deque[asyncio.Future[tuple[Any, float] | None]] = (
            collections.deque()
        )
        self._giving: set[asyncio.Task[None]] = set()

    async def take(self) -> tuple[Any, float]:
        """A pooled connection (its driver connection is ``.driver_connection``) and the
        time it was checked out."""
        while True:
            now = time.monotonic()
            while self._idle:
                fairy, since = self._idle.pop()
                driver = fairy.driver_connection
                if driver.is_closed() or driver.is_in_transaction():
                    self.discard(fairy)
                elif now - since > self.HOLD_SECONDS:
                    await self._to_pool(fairy)
                else:
                    return fairy, since
            if self._held < self.capacity or not self.capacity:
                return await self._checkout(now)
            handed: asyncio.Future[tuple[Any, float] | None]
            handed = asyncio.get_running_loop().create_future()
            self._queue.append(handed)
            try:
                got = await handed
            except asyncio.CancelledError:
                if handed in self._queue:
                    self._queue.remove(handed)
                elif handed.done() and not handed.cancelled():
                    given = handed.result()
                    if given is not None:  # handed over as we were cancelled: pass it on
                        self.give_later(*given)
                    else:
                        self._wake()  # a slot came free: pass that on too
                raise
            if got is not None:
                return got
            # None: a borrowed connection left (closed or broken): check one out

    async def _checkout(self, now: float) -> tuple[Any, float]:
        self._held += 1
        self._waiting += 1
        try:
            fairy = await self.engine.raw_connection()
        except BaseException:
            self._held -= 1
            self._wake()
            raise
        finally:
            self._waiting -= 1
        driver: Any = fairy.driver_connection
        if driver.is_in_transaction():  # pragma: no cover - a bug
            self.discard(fairy)
            raise AssertionError("a pooled connection arrived inside a transaction")
        return fairy, now

    def _wake(self) -> None:
        """A borrowed connection left: a hot call waiting here may check one out."""
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _to_pool(self, fairy: Any) -> None:
        self._held -= 1
        self._wake()
        await greenlet_spawn(fairy.close)

    async def give(self, fairy: Any, since: float) -> None:
        """Back after a call that left it healthy: to SQLAlchemy when a checkout of its
        waits, else to a hot call waiting here, else idle (or to the pool when enough
        are idle)."""
        if not self._sqlalchemy_waiting:
            while self._queue:
                waiter = self._queue.popleft()
                if not waiter.done():
                    waiter.set_result((fairy, since))
                    return
            if not self._waiting and len(self._idle) < self.capacity:
                self._idle.append((fairy, since))
                return
        await self._to_pool(fairy)

    def give_later(self, fairy: Any, since: float) -> None:
        """:meth:`give`, from a caller that may not await (it is being cancelled)."""
        task = asyncio.ensure_future(self.give(fairy, since))
        self._giving.add(task)
        task.add_done_callback(self._giving.discard)

    @asynccontextmanager
    async def checkout(self) -> AsyncIterator[None]:
        """Around a SQLAlchemy checkout: an empty pool first gets an idle connection
        back, and while the checkout waits, connections given back go to the pool."""
        self._waiting += 1
        self._sqlalchemy_waiting += 1
        try:
            if self._idle and not self.engine.sync_engine.pool.checkedin():  # type: ignore[attr-defined]
                fairy, _ = self._idle.pop(0)  # the oldest: the newest stay warm
                await self._to_pool(fairy)
            yield
        finally:
            self._waiting -= 1
            self._sqlalchemy_waiting -= 1

    async def settle(self, fairy: Any, since: float) -> None:
        """After a cancelled statement: the driver cancels it on the server, and the
        connection's next statement waits until that is done; once it has run, the
        cancelled statement can no longer commit, and the connection is back.
        (Closing it at once would leave the statement running, to commit later.)"""
        try:
            await fairy.driver_connection.fetchval("SELECT 1")
        except Exception:
            self.discard(fairy)
            return
        await self.give(fairy, since)

    def discard(self, fairy: Any) -> None:
        """Never use it again (broken); no await needed."""
        self._held -= 1
        self._wake()
        fairy.invalidate()
        fairy.close()

    def after_disconnect(self) -> None:
        """A connection was found dead: the idle ones (borrowed and pooled) likely died
        with it (a restarted server), so none is reused. The borrowed ones are
        discarded; the pool recycles every connection it opened until now at its next
        checkout (closed, and opened anew), as SQLAlchemy does after a disconnect of
        its own (``Pool._invalidate``, here for all of them, whatever their age).

        The pool is not replaced (``engine.dispose()``): a connection in use meanwhile
        (another call's) would go back to the old pool, which nothing closes, and be
        left unclosed to the garbage collector, still open on the server until then."""
        idle, self._idle = self._idle, []
        for fairy, _ in idle:
            self.discard(fairy)
        self.engine.sync_engine.pool._invalidate_time = time.time()

    async def release_all(self) -> None:
        """Give every idle connection back to the pool."""
        idle, self._idle = self._idle, []
        for fairy, _ in idle:
            await self._to_pool(fairy)

    def forget(self) -> list[Any]:
        """Drop them without a word: their event loop is gone, so they cannot be closed
        (nor terminated). Each is detached from the pool, which forgets it; their
        driver connections are returned, to be ended by their sockets."""
        idle, self._idle = self._idle, []
        drivers = [fairy.driver_connection for fairy, _ in idle]
        for fairy, _ in idle:
            fairy.detach()
        self._held = 0
        self._queue.clear()
        return drivers


class EngineSet:
    """The engine of one event loop, its view for single-statement reads, and the
    connections borrowed from its pool for hot statements."""

    __slots__ = ("borrowed", "engine", "read")

    def __init__(self, engine: AsyncEngine, read_options: dict[str, Any]) -> None:
        self.engine = engine
        self.read = engine.execution_options(**read_options)
        self.borrowed = Borrowed(engine)


_SESSION_READY = "tenxstore_session_ready"


def on_every_connection(engine: Any, setup: Callable[[Any, Any], None]) -> None:
    """Run ``setup(dbapi_connection, connection_record)`` on every connection of a (sync)
    engine: as it is made, and — for one its pool held before tenxstore took the engine
    over (an application's engine, already used) — at its first checkout. Without that,
    such a connection kept the server's session defaults (no ``lock_timeout`` on
    PostgreSQL; REPEATABLE READ and a 50 s lock wait on MySQL; the driver's implicit
    transactions on SQLite)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        try:
            setup(dbapi_connection, record)
        except BaseException:
            # SQLAlchemy's pool lets go of a connection whose connect event failed
            # without closing it (the driver then warns of it, unclosed, when it is
            # collected: a backend ended while its session was set up, say).
            with contextlib.suppress(Exception):
                dbapi_connection.close()
            raise
        record.info[_SESSION_READY] = True

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if not record.info.get(_SESSION_READY):
            setup(dbapi_connection, record)
            record.info[_SESSION_READY] = True


def _one_line(exc: BaseException) -> str:
    """An error in one line: its class and its first line (for a WARNING)."""
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__


def _reset_or_discard(engine: Any, name: str) -> None:
    """Reset each connection as it goes back to the pool (SQLAlchemy's rollback, which
    ``pool_reset_on_return=None`` turns off), and discard one that cannot be reset.

    A connection the server ended while it was checked out (a ``KILL``, a restart, an
    idle timeout) fails its rollback; SQLAlchemy's own reset logs that at ERROR with a
    traceback, for what is neither an error of the caller (its work was done, or
    failed, before) nor of tenxstore. It is one WARNING line here; the connection is
    discarded as SQLAlchemy would, and the pool opens a new one when it needs one."""

    @event.listens_for(engine, "reset")
    def _reset(dbapi_connection: Any, record: Any, state: Any) -> None:
        if state.transaction_was_reset or not state.asyncio_safe:
            return  # rolled back already / a garbage-collected connection: no I/O allowed
        try:
            dbapi_connection.rollback()
        except Exception as exc:
            log.warning(
                "%s: a connection could not be reset on its way back to the pool (%s); "
                "it is discarded",
                name,
                _one_line(exc),
            )
            if record is not None:
                record.invalidate(exc)


async def give_back(conn: AsyncConnection, name: str) -> None:
    """Close a connection (back to the pool), to the end even when the caller is
    cancelled meanwhile, then re-raise the cancellation.

    A close cancelled halfway leaves its reset (a rollback) undone: SQLAlchemy logs
    that at ERROR and discards the connection. A close that fails (the server ended
    the connection: its rollback cannot be sent) is not the caller's error: the work
    on it was done, or had failed, before; the connection is discarded (one WARNING).
    """
    closing = asyncio.ensure_future(conn.close())
    cancelled: asyncio.CancelledError | None = None
    while not closing.done():
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError as exc:
            cancelled = exc
    try:
        closing.result()
    except DBAPIError as exc:
        log.warning(
            "%s: a connection could not be closed cleanly (%s); it is discarded",
            name,
            _one_line(exc.orig or exc),
        )
    if cancelled is not None:
        raise cancelled


class LangGraphFastPath(Protocol):
    """A backend's one-round-trip LangGraph paths (see :meth:`Backend.langgraph_fast_path`):
    each commits only the common case, or writes nothing and says so, and the portable
    locked path of :mod:`tenxstore.langgraph.tables` then does the work."""

    @property
    def available(self) -> bool:
        """Whether the paths may be taken now."""

    async def put(self, scoped: bool, values: dict[str, Any]) -> tuple[int, Any] | None:
        """A checkpoint put: ``(incarnation, the checkpoint probed or None)``, or None
        when it wrote nothing."""

    async def put_writes(self, scoped: bool, values: dict[str, Any]) -> bool:
        """A task's writes: whether they were stored."""

    async def read(self, scoped: bool, values: dict[str, Any]) -> Mapping[str, Any] | None:
        """One checkpoint with its writes and value chains, or None."""

    async def fetch(self, stmt: DriverStatement, values: Mapping[str, Any]) -> Sequence[Any]:
        """The rows of one read-only statement, in one round trip."""


class Backend(ABC):
    """One database mode. Subclasses say how; this class holds what they share.

    Args:
        engine: The engine; created from a URL by :func:`tenxstore.backends.open_backend`
            or given by the caller.
        owns_engine: Whether :meth:`aclose` disposes of it.
        lock_timeout: Seconds a writer waits for a thread's lock (None: no bound).
    """

    name: ClassVar[str]
    dialect: ClassVar[DialectName]
    supports_schema: ClassVar[bool] = False
    dml_in_ctes: ClassVar[bool] = False
    """Whether a statement may carry an INSERT/UPDATE/DELETE in a ``WITH`` clause
    (PostgreSQL): a write folded into a statement the call sends anyway costs no round
    trip of its own."""
    pool_per_loop: ClassVar[bool] = True
    """Whether connections belong to an event loop (not so: one in-memory SQLite
    connection that every loop shares, and that only aclose() closes)."""
    keywords: ClassVar[KeywordSearch]
    """This database's full-text engine over the memories' keyword index
    (:mod:`tenxstore.backends.memory_sql`)."""
    vector_extension: ClassVar[bool] = False
    """Whether the database may hold pgvector's index of the memories' vectors
    (:mod:`tenxstore.backends.pgvector`); elsewhere search by meaning is exact."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        owns_engine: bool,
        lock_timeout: float | None,
        make_engine: Callable[[], AsyncEngine] | None = None,
    ):
        self.owns_engine = owns_engine
        self.lock_timeout = lock_timeout
        self.retry = RetryPolicy()
        """What this backend tries again, how often and with what wait (set by the
        repository's ``retry=``)."""
        # asyncpg and aiosqlite connections belong to one event loop: an engine this
        # backend created gets a twin for a loop that runs beside the first one, and
        # each is disposed of when its loop shuts down (tenxstore.loops).
        self._engines = PerLoop(
            EngineSet(engine, self.read_options()),
            make=None
            if make_engine is None
            else lambda: EngineSet(make_engine(), self.read_options()),
            close=self._close_set,
            reset=self._reset if owns_engine and self.pool_per_loop else None,
            foreign=None if owns_engine else self._foreign,
        )

    async def _close_set(self, engines: EngineSet) -> None:
        """At its loop's shutdown: connections borrowed for hot statements go back to the
        pool, and a pool this backend created is disposed of."""
        await engines.borrowed.release_all()
        if self.owns_engine and self.pool_per_loop:
            await engines.engine.dispose()

    @staticmethod
    def _reset(engines: EngineSet) -> EngineSet:
        """The first loop closed without shutting down: its connections (borrowed, and
        idle in the pool) are ended on the server, and the pool starts anew."""
        pool = engines.engine.sync_engine.pool
        idle = getattr(getattr(pool, "_pool", None), "queue", ())  # QueuePool's idle records
        drivers = [*engines.borrowed.forget(), *(record.driver_connection for record in idle)]
        shut_down(getattr(driver, "_transport", None) for driver in drivers)
        engines.engine.sync_engine.dispose(close=False)
        return engines

    @staticmethod
    def _foreign(engines: EngineSet, loop: asyncio.AbstractEventLoop | None) -> None:
        """A caller's engine asked for on another loop than the one it was used on."""
        pool = engines.engine.sync_engine.pool
        if isinstance(pool, (NullPool, StaticPool)):
            return  # no connection outlives a checkout (or one that is not loop-bound)
        if loop is not None and not loop.is_closed():
            raise ConfigError(
                "the engine passed to tenxstore is in use on another event loop, and its "
                "pooled connections belong to that loop: give each loop its own engine, "
                "or pass a URL and tenxstore keeps one per loop"
            )
        if pool.checkedin():  # type: ignore[attr-defined]  # QueuePool and its kin
            raise ConfigError(
                "the engine passed to tenxstore holds connections of an event loop that "
                "has closed: `await engine.dispose()` before the loop ends, or pass a URL "
                "and tenxstore keeps one engine per loop"
            )

    @property
    def engine(self) -> AsyncEngine:
        """The engine of the running event loop (outside a loop: the first one)."""
        return self._engines.current().engine

    # -- how this mode runs things (hooks) -----------------------------------------

    @classmethod
    def create_engine(
        cls, url: URL, options: dict[str, Any], lock_timeout: float | None
    ) -> AsyncEngine:
        """An engine for ``url`` with this mode's defaults, overridable by ``options``."""
        options = dict(options)
        connect_args = {**cls.connect_args(lock_timeout), **options.pop("connect_args", {})}
        kwargs = {**cls.pool_args(), **options}
        quiet_reset = "pool_reset_on_return" not in kwargs  # a caller's own choice stands
        if quiet_reset:
            kwargs["pool_reset_on_return"] = None  # reset by _reset_or_discard instead
        engine = create_async_engine(url, connect_args=connect_args, **kwargs)
        if quiet_reset:
            _reset_or_discard(engine.sync_engine, cls.name)
        cls.prepare(engine, lock_timeout)
        return engine

    @classmethod
    def connect_args(cls, lock_timeout: float | None) -> dict[str, Any]:
        """Driver connect arguments this mode needs."""
        return {}

    @classmethod
    def pool_args(cls) -> dict[str, Any]:
        """``create_async_engine`` arguments of this mode's pool."""
        return {}

    @classmethod
    @abstractmethod
    def prepare(cls, engine: AsyncEngine, lock_timeout: float | None) -> None:
        """Install this mode's per-connection settings on an engine (once per engine)."""

    def read_options(self) -> dict[str, Any]:
        """Execution options of a connection that runs one read statement."""
        return {}

    @abstractmethod
    def insert(self, table: Table) -> Any:
        """This dialect's ``INSERT`` (with its ``ON CONFLICT`` clauses)."""

    def insert_ignore(self, table: Table, *conflict: str) -> Insert:
        """``INSERT ... ON CONFLICT (conflict) DO NOTHING`` on this database."""
        stmt: Insert = self.insert(table).on_conflict_do_nothing(index_elements=list(conflict))
        return stmt

    def upsert(self, table: Table, *conflict: str) -> Insert:
        """``INSERT ... ON CONFLICT (conflict) DO UPDATE`` of every other column."""
        stmt = self.insert(table)
        others = {c.name: stmt.excluded[c.name] for c in table.c if c.name not in conflict}
        done: Insert = stmt.on_conflict_do_update(index_elements=list(conflict), set_=others)
        return done

    async def update_returning(
        self, conn: AsyncConnection, stmt: Update, table: Table, *key: ColumnElement[bool]
    ) -> Row[Any]:
        """Run ``stmt``, an UPDATE of the one row ``key`` picks (locked by the caller's
        transaction), and return that row as updated (``UPDATE ... RETURNING``)."""
        return (await conn.execute(stmt.returning(*table.c))).one()

    @abstractmethod
    def is_lock_timeout(self, exc: DBAPIError) -> bool:
        """Whether a driver error is a lock wait that ran out."""

    def died_before_sending(self, exc: DBAPIError) -> bool:
        """Whether the driver refused to send a statement on a connection found dead."""
        return False

    def build_state_write(self, tables: Tables) -> Any:
        """A statement that writes a state in one round trip, or None (see write_state)."""
        return None

    async def write_state(
        self, conn: AsyncConnection, sql: Any, params: StateWrite, prune: bool
    ) -> None:
        """Insert the state and new messages, bump the head version, prune (under the
        lock), as separate statements: on SQLite a statement costs no round trip, and
        MySQL has no data-modifying CTE (PostgreSQL sends them as one)."""
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

    async def begin_write(self, conn: AsyncConnection) -> None:  # noqa: B027  # a hook most modes leave empty
        """Prepare a connection for a write transaction (before it begins)."""

    async def write_begun(self, conn: AsyncConnection) -> None:  # noqa: B027  # a hook most modes leave empty
        """Run once a write transaction has begun, before the lock is taken."""

    async def snapshot_options(self, conn: AsyncConnection) -> None:  # noqa: B027  # a hook most modes leave empty
        """Make ``conn``'s next transaction see one snapshot of the database."""

    async def clock(self, conn: AsyncConnection) -> datetime:
        """The database's time, for leases: every worker measures them on one clock.
        (An embedded database's clock is this host's.)"""
        return datetime.now(timezone.utc)

    async def identity(self, conn: AsyncConnection, schema: str | None) -> str:
        """What tells this database apart from a copy of it (a copied file, a database
        made from another as a template, a restore), yet is the same by every route
        to it. A store's id is written into the database, so a copy has its
        original's: the two together name one store. Empty when nothing can."""
        return ""

    async def footprint(
        self, conn: AsyncConnection, schema: str | None, tables: Sequence[Table], exact: bool
    ) -> Footprint:
        """The tables' rows and bytes, dead rows, the database's size and free space,
        as far as this database can tell (rows counted exactly where it cannot)."""
        found = {}
        for table in tables:
            rows = (await conn.execute(select(func.count()).select_from(table))).scalar_one()
            found[table.name] = TableSizes(rows, None, None, None)
        return Footprint(found, None, None)

    # -- the hot path: a head read and a state write -----------------------------------

    def bind(self, sql: Any) -> None:
        """Given the repository's statements (:class:`tenxstore.statements.Statements`),
        prepare this mode's hot path. Modes without one read and write through
        SQLAlchemy's execution layer with them."""
        self._sql = sql
        self._listeners: list[Callable[[str], None]] = []

    def on_statement(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(sql)`` for every statement this backend sends on the running
        loop's engine, hot path included (instrumentation, tests); returns a remover."""

        def relay(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            listener(statement)

        engine = self.engine.sync_engine
        event.listen(engine, "before_cursor_execute", relay)
        self._listeners.append(listener)

        def remove() -> None:
            event.remove(engine, "before_cursor_execute", relay)
            self._listeners.remove(listener)

        return remove

    def _sent(self, sql: str) -> None:
        for listener in self._listeners:
            listener(sql)

    async def read_head(self, thread_id: Any, user_id: Any) -> Head | None:
        """The head of a thread (scoped to ``user_id`` unless it is None), or None."""
        sql = self._sql
        if user_id is None:
            rows = await self.read(sql.head_state, {"b_thread": thread_id})
        else:
            rows = await self.read(
                sql.head_state_of_user, {"b_thread": thread_id, "b_user": user_id}
            )
        if not rows:
            return None
        row = rows[0]
        return Head(row.version, row.incarnation, row.user_id, row.state_data)

    one_statement_writes: bool = False
    """Whether :meth:`run_statement` runs a compiled statement at driver level (one
    round trip, autocommit): collaborators then build their own one-statement paths."""

    lateral_lookups: ClassVar[bool] = False
    """Whether a lookup of one row per outer row is best written as a LATERAL subquery
    with LIMIT 1 (the planner then runs it by the whole key), not a plain join."""

    strict_union_types: ClassVar[bool] = False
    """Whether the columns of a UNION must be of one type (an integer user id is then
    cast to text where it meets text)."""

    def json_text(self, document: Any, key: Any, path: Any) -> ColumnElement[Any]:
        """The text of ``document``'s (a JSON object, as text) member ``key`` — bound as
        the key itself, and as ``path``, its JSON path (``$."key"``) — or NULL. SQLite's
        ``json_extract`` (this default) gives a text member as text."""
        return func.json_extract(document, path, type_=String())

    def langgraph_fast_path(self, store: Store) -> LangGraphFastPath | None:
        """This database's one-round-trip paths for LangGraph's put, writes and read of
        ``store``'s tables, or None (this default): the portable paths then run."""
        return None

    async def run_statement(
        self, stmt: DriverStatement, values: Mapping[str, Any], *, write: bool, many: bool = False
    ) -> Any:
        """Run one compiled statement in autocommit at driver level; its first row (or
        None; ``many``: a list of its rows). Only where :attr:`one_statement_writes`
        says so.

        Raises:
            ConnectionLost: The connection broke (a write: ``committed=None``).
        """
        raise NotImplementedError(f"{self.name} runs no statement at driver level")

    async def commit_head(self, write: HeadWrite) -> Head | None:
        """Commit the common state write in one step, or write nothing and return None
        (this mode has no one-step write: the repository takes the locked path)."""
        return None

    # -- connections -----------------------------------------------------------------

    @asynccontextmanager
    async def connect(self, *, read: bool = False) -> AsyncIterator[AsyncConnection]:
        """A connection of the running loop's engine (``read``: set up for one read).

        Raises:
            DatabaseUnavailable: The database cannot be reached or refused us.
            ConnectionLost: The connection broke while it was being set up, twice
                (nothing of the caller's work was sent).
        """
        engines = await self._engines.get()
        for attempt in self.retry.tries():
            conn = (engines.read if read else engines.engine).connect()
            try:
                async with engines.borrowed.checkout():
                    await conn.start()
                break
            except OPENING_ERRORS as exc:
                failure = self.opening_failed(exc)
                # Nothing of the caller's work was sent: a connection that broke while it
                # was being set up is opened again; a refusal is final.
                if not isinstance(failure, ConnectionLost) or not await self.retry.again(
                    attempt, log, self.name, "a connection broke while it was opened"
                ):
                    raise failure from exc
        try:
            yield conn
        finally:
            await give_back(conn, self.name)

    def describe(self) -> str:
        """The database's URL without its password or driver, for messages."""
        url = self.engine.url
        return masked_url(url.set(drivername=url.get_backend_name()))

    def opening_failed(self, exc: BaseException) -> TenxStoreError:
        """A failure to open a connection as tenxstore's error, by class and SQLSTATE."""
        where = self.describe()
        why = _refusal(exc)
        if why is None:
            return ConnectionLost(
                f"the connection to {where} broke while it was being opened "
                f"({type(exc).__name__}); nothing was written"
            )
        log.warning("cannot use the database %s: %s", where, why)
        return DatabaseUnavailable(f"cannot use the database {where}: {why}")

    async def read(
        self, stmt: Executable, params: dict[str, Any] | None = None
    ) -> Sequence[Row[Any]]:
        """Run one read statement; retried once on a connection found dead.

        Reads are idempotent, so a pooled connection that died while idle (a restarted
        server, a killed backend) costs one retry; the driver's disconnect marks the
        pool's older connections invalid, so the retry gets a fresh one.
        """
        for attempt in self.retry.tries():
            try:
                async with self.connect(read=True) as conn:
                    return (await conn.execute(stmt, params)).all()
            except DBAPIError as exc:
                if not exc.connection_invalidated or not await self.retry.again(
                    attempt, log, self.name, "a read found its pooled connection dead"
                ):
                    raise self.translate(exc, committing=False) from exc
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[AsyncConnection]:
        """A read transaction that sees one snapshot of the database."""
        async with self.connect() as conn:
            await self.snapshot_options(conn)
            async with conn.begin():
                yield conn

    def write(
        self, lock: Executable, params: dict[str, Any]
    ) -> AbstractAsyncContextManager[tuple[AsyncConnection, Any]]:
        """One write transaction that has run ``lock`` (the thread's row lock) and yields
        its row (None: no such row). Committed when the block exits, rolled back when it
        raises; a lost connection raises :class:`ConnectionLost` and is never replayed."""
        return self._block_write(lock, params)

    @asynccontextmanager
    async def _block_write(
        self, lock: Executable, params: dict[str, Any]
    ) -> AsyncIterator[tuple[AsyncConnection, Any]]:
        """A write in SQLAlchemy's transaction block. Only a statement the driver
        refused to send (its connection was already closed) is tried again."""
        committing = False
        try:
            for attempt in self.retry.tries():
                yielded = False
                try:
                    async with self.connect() as conn:
                        await self.begin_write(conn)
                        async with conn.begin():
                            await self.write_begun(conn)
                            row = (await conn.execute(lock, params)).first()
                            yielded = True
                            yield conn, row
                            committing = True  # the block's exit commits
                    return
                except DBAPIError as exc:
                    if (
                        yielded
                        or not self.died_before_sending(exc)
                        or not await self.retry.again(
                            attempt, log, self.name, "a write found its connection dead"
                        )
                    ):
                        raise
        except DBAPIError as exc:
            raise self.translate(exc, committing) from exc

    def translate(self, exc: DBAPIError, committing: bool) -> Exception:
        """A driver error as the caller's error, by class and SQLSTATE/SQLite code."""
        if exc.connection_invalidated:
            if committing:
                return self.lost(
                    ConnectionLost(
                        "the connection was lost during COMMIT; the write may have been "
                        "applied: re-read the thread before writing again",
                        committed=None,
                    )
                )
            return self.lost(
                ConnectionLost("the connection was lost before COMMIT; nothing was written")
            )
        if self.is_deadlock(exc) and not committing:
            return self.deadlocked()
        if self.is_lock_timeout(exc):
            return self.lock_timed_out()
        if self.is_cancelled(exc):
            return self.cancelled(committing)
        return exc

    def is_deadlock(self, exc: DBAPIError) -> bool:
        """Whether the server broke a deadlock by rolling this transaction back."""
        return False

    def deadlocked(self) -> LockTimeout:
        """A deadlock: the server rolled the transaction back (nothing was written)."""
        log.warning("a write on %s was chosen as a deadlock victim", self.describe())
        return LockTimeout(
            "the write deadlocked with another one and was rolled back; nothing was "
            "written: retrying is safe"
        )

    def is_cancelled(self, exc: DBAPIError) -> bool:
        """Whether the server cancelled the statement (an operator's cancel or kill of
        the query, a statement timeout) and kept the connection."""
        return False

    def cancelled(self, committing: bool) -> StatementCancelled:
        """The error of a statement the server cancelled (logged as a WARNING)."""
        log.warning("the database %s cancelled a statement", self.describe())
        if committing:
            return StatementCancelled(
                "the database cancelled COMMIT; the write may have been applied: re-read "
                "the thread before writing again",
                committed=None,
            )
        return StatementCancelled(
            "the database cancelled the statement (a kill of the query, a statement "
            "timeout); nothing was written: retrying is safe"
        )

    def lost(self, error: ConnectionLost) -> ConnectionLost:
        """``error``, logged (a WARNING: a connection the database or the network
        dropped) and counted."""
        telemetry.connection_lost(log, self.name, error.committed)
        return error

    def lock_timed_out(self) -> LockTimeout:
        """The error of a write that waited longer than ``lock_timeout``."""
        wait = "forever" if self.lock_timeout is None else f"{self.lock_timeout:g}s"
        telemetry.lock_timed_out(log, self.name, wait)
        return LockTimeout(
            f"waited more than {wait} for the lock of the thread or memory it writes "
            "(another writer holds it); nothing was written"
        )

    # -- schema and lifecycle -----------------------------------------------------------

    @asynccontextmanager
    async def migration_connection(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a write transaction that serializes concurrent migrations."""
        async with self.connect() as conn:
            await self.begin_write(conn)
            async with conn.begin():
                yield conn

    def create_schema_on_first_use(  # noqa: B027  # a hook most modes leave empty
        self, hook: Callable[[AsyncConnection], Awaitable[None]], template: Hashable = None
    ) -> None:
        """Given how to create the schema on a connection: a database that is new with
        every checkpointer (in memory) runs it before its first use; others ignore it.
        ``template`` names what the schema depends on (the id types): databases of one
        template may be made as copies of the first one the hook set up."""

    def setup_engine(self) -> AsyncEngine | None:
        """A private engine for :meth:`CheckpointRepository.setup` on its own loop, or
        None when the migration must run on this backend's own connection."""
        return None

    async def aclose(self) -> None:
        """Close the connection pool of the running loop, if this backend created it
        (a pool of another loop is closed when that loop shuts down)."""
        if self.pool_per_loop:
            await self._engines.aclose_current()
        elif self.owns_engine:
            await self._engines.first.engine.dispose()
