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
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from sqlalchemy import String, Table, bindparam, delete, event, func, null, select
from sqlalchemy.engine import URL, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool, StaticPool
from sqlalchemy.sql import Executable
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import ColumnElement

from ..errors import (
    ConfigError,
    ConnectionLost,
)
from ..loops import PerLoop, shut_down
from ..models import Tables
from ..types import ReadSource
from ..validate import masked_url
from .codes import OPENING_ERRORS
from .connections import ASYNCPG, DriverOps, EngineSet, give_back, reset_or_discard
from .driver import DriverStatement
from .failures import Failures
from .memory_sql import KeywordSearch
from .records import Footprint, Head, HeadWrite, LangGraphFastPath, StateWrite, TableSizes
from .replicas import PRIMARY, ReplicaSet, Writes, lag_tolerated
from .retry import RetryPolicy

if TYPE_CHECKING:
    from ..store import Store
    from .records import MemoryFastPath

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "Backend",
    "DialectName",
    "timeout_ms",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DialectName = Literal["postgresql", "sqlite", "mysql"]
DEFAULT_LOCK_TIMEOUT_S = 30.0
_FOREVER_MS = 2**31 - 1


def timeout_ms(lock_timeout: float | None) -> int:
    """A lock timeout in whole milliseconds (None: as long as the database allows)."""
    return _FOREVER_MS if lock_timeout is None else max(1, int(lock_timeout * 1000))


class Backend(Failures, ABC):
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
    """Whether connections belong to an event loop (not one in-memory SQLite's)."""
    keywords: ClassVar[KeywordSearch]
    """This database's full-text engine over the memories' keyword index
    (:mod:`tenxstore.backends.memory_sql`)."""
    vector_extension: ClassVar[bool] = False
    """Whether the database may hold pgvector's index of the memories' vectors
    (:mod:`tenxstore.backends.pgvector`); elsewhere search by meaning is exact."""
    driver_ops: ClassVar[DriverOps] = ASYNCPG
    opening_errors: ClassVar[tuple[type[BaseException], ...]] = OPENING_ERRORS
    """What opening a connection may raise (a mode adds its driver's own)."""
    """How the connections borrowed for hot statements are told apart and readied."""

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
        self.writes = Writes()
        """When this process last wrote (what a replica must hold to serve its reads)."""
        # asyncpg and aiosqlite connections belong to one event loop: an engine this
        # backend created gets a twin for a loop that runs beside the first one, and
        # each is disposed of when its loop shuts down (tenxstore.loops).
        self._engines = PerLoop(
            EngineSet(engine, self.read_options(), self.driver_ops),
            make=None
            if make_engine is None
            else lambda: EngineSet(make_engine(), self.read_options(), self.driver_ops),
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
            kwargs["pool_reset_on_return"] = None  # reset by reset_or_discard instead
        engine = create_async_engine(url, connect_args=connect_args, **kwargs)
        if quiet_reset:
            reset_or_discard(engine.sync_engine, cls.name)
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

    def died_before_sending(self, exc: DBAPIError) -> bool:
        """Whether the driver refused to send a statement on a connection found dead."""
        return False

    def prune(self, tables: Tables) -> Executable:
        """Delete a thread's states up to ``b_upto`` (``b_thread``)."""
        s = tables.states
        return delete(s).where(
            s.c.thread_id == bindparam("b_thread"), s.c.version <= bindparam("b_upto")
        )

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

    async def begin_write(self, conn: AsyncConnection) -> None:  # a hook most modes leave empty
        """Prepare a connection for a write transaction (before it begins)."""

    async def write_begun(self, conn: AsyncConnection) -> None:  # a hook most modes leave empty
        """Run once a write transaction has begun, before the lock is taken."""

    # a hook most modes leave empty
    async def snapshot_options(self, conn: AsyncConnection) -> None:
        """Make ``conn``'s next transaction see one snapshot of the database."""

    async def clock(self, conn: AsyncConnection) -> datetime:
        """The database's time, for leases: every worker measures them on one clock.
        (An embedded database's clock is this host's.)"""
        return datetime.now(timezone.utc)

    def identity_columns(self, schema: str | None) -> list[ColumnElement[Any]]:
        """What tells this database apart from a copy (a copied file, a restore) yet is
        the same by every route to it, as columns of the schema check (:mod:`.schema_facts`):
        a copy has its original's store id, and the two together name one store."""
        return []

    def identity_text(self, values: Sequence[Any]) -> str:
        """The identity the values of :meth:`identity_columns` make ("": none)."""
        return ""

    def declared_type(self, of: Table, name: str, schema: str | None) -> ColumnElement[Any]:
        """The declared type of a column as the catalog names it, as a scalar subquery
        of the schema check's statement (NULL where this database cannot tell: the
        check then takes the slow way)."""
        return null()

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
        if self.replicas is not None:
            self.replicas.bind(sql)

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
            rows = await self.read_here(sql.head_state, {"b_thread": thread_id})
        else:
            rows = await self.read_here(
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

    def memory_fast_path(self, store: Store) -> MemoryFastPath | None:
        """This database's one-step memory put and get, or None (the locked path)."""
        return None

    async def run_statement(
        self, stmt: DriverStatement, values: Mapping[str, Any], *, write: bool, many: bool = False
    ) -> Any:
        """Run one compiled statement in autocommit at driver level; its first row (or
        None; ``many``: a list of its rows). Only where :attr:`one_statement_writes`
        says so. A read runs on a replica when the call's reads tolerate lag and one is
        within bound.

        Raises:
            ConnectionLost: The connection broke (a write: ``committed=None``).
        """
        if write:
            try:
                return await self.run_here(stmt, values, write=True, many=many)
            finally:
                self.writes.wrote()  # committed or not: a replica must hold it to serve
        after = lag_tolerated()
        if self.replicas is None or after is None:
            return await self.run_here(stmt, values, write=False, many=many)
        found, _ = await self.replicas.serve(
            lambda b, _: b.run_here(stmt, values, write=False, many=many), after=after
        )
        return found

    async def run_here(
        self, stmt: DriverStatement, values: Mapping[str, Any], *, write: bool, many: bool = False
    ) -> Any:
        """:meth:`run_statement` on this database."""
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
            except self.opening_errors as exc:
                failure = self.opening_failed(exc)
                # Nothing of the caller's work was sent: a connection that broke while it
                # was being set up is opened again; a refusal is final.
                if not isinstance(failure, ConnectionLost) or not await self.retry.again(
                    attempt, log, self.name, "a connection broke while it was opened"
                ):
                    raise failure from exc
        try:
            yield conn
        except DBAPIError as exc:
            if self.is_read_only(exc):  # a standby, or a demoted primary: not for writes
                await conn.invalidate()
            raise
        finally:
            await give_back(conn, self.name)

    def describe(self) -> str:
        """The database's URL without its password or driver, for messages."""
        url = self.engine.url
        return masked_url(url.set(drivername=url.get_backend_name()))

    replicas: ReplicaSet | None = None
    """The standbys that serve the reads that tolerate lag (``replica_urls``), or None."""

    async def read(
        self, stmt: Executable, params: dict[str, Any] | None = None
    ) -> Sequence[Row[Any]]:
        """Run one read statement (:meth:`read_here`), on a replica when the call's reads
        tolerate lag (:func:`~.replicas.tolerating_lag`) and one is within bound."""
        after = lag_tolerated()
        if self.replicas is None or after is None:
            return await self.read_here(stmt, params)
        rows, _ = await self.replicas.serve(lambda b, _: b.read_here(stmt, params), after=after)
        return rows

    async def lagging(
        self,
        work: Callable[[Backend, bool], Awaitable[T]],
        accept: Callable[[T], bool] | None = None,
        after: float = float("-inf"),
    ) -> tuple[T, ReadSource]:
        """``work(backend, on_replica)`` on a replica within bound that holds what was
        written before ``after`` and whose result ``accept`` takes (see
        :meth:`.replicas.ReplicaSet.serve`), else here."""
        if self.replicas is None:
            return await work(self, False), PRIMARY
        return await self.replicas.serve(work, accept, after)

    async def read_here(
        self, stmt: Executable, params: dict[str, Any] | None = None
    ) -> Sequence[Row[Any]]:
        """Run one read statement on this database; retried once on a connection found
        dead.

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

    def snapshot(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A read transaction that sees one snapshot of the database (of a replica within
        bound when the call's reads tolerate lag)."""
        after = lag_tolerated()
        if self.replicas is None or after is None:
            return self.snapshot_here()
        return self.replicas.snapshot(lambda backend: backend.snapshot_here(), after)

    @asynccontextmanager
    async def snapshot_here(self) -> AsyncIterator[AsyncConnection]:
        """A read transaction that sees one snapshot of this database."""
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

    # -- schema and lifecycle -----------------------------------------------------------

    @asynccontextmanager
    async def migration_connection(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a write transaction that serializes concurrent migrations."""
        async with self.connect() as conn:
            await self.begin_write(conn)
            async with conn.begin():
                yield conn

    def create_schema_on_first_use(  # a hook most modes leave empty
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
        (a pool of another loop is closed when that loop shuts down), and its
        replicas'."""
        if self.replicas is not None:
            await self.replicas.aclose()
        if self.pool_per_loop:
            await self._engines.aclose_current()
        elif self.owns_engine:
            await self._engines.first.engine.dispose()
