"""What differs by dialect: URLs, engine arguments, write-transaction begin, upsert.

PostgreSQL (asyncpg):
    * writers lock the thread row with ``SELECT ... FOR UPDATE``;
    * single-statement reads run in AUTOCOMMIT, saving the BEGIN/ROLLBACK round trips;
    * ``schema_translate_map={None: schema}`` places the schema-less tables.

SQLite (aiosqlite):
    * ``with_for_update()`` is silently dropped by SQLAlchemy's SQLite compiler, so
      writers take the database write lock up front with ``BEGIN IMMEDIATE``
      instead; a deferred transaction that later writes would fail with
      SQLITE_BUSY without waiting on the busy timeout;
    * the driver's own implicit transaction handling is turned off (SQLAlchemy's
      documented recipe) so that BEGIN is emitted by us and when we say;
    * file databases use WAL (readers never block the writer) and a busy timeout;
    * ``:memory:`` databases live in one connection (``StaticPool``); the
      repository serializes its transactions on it.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from sqlalchemy import Table, event, make_url
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.dml import Insert

from .errors import ConfigError

__all__ = [
    "POOL_MODES",
    "WRITE_OPTION",
    "DialectName",
    "PoolMode",
    "async_url",
    "dialect_of",
    "died_before_sending",
    "insert_ignore",
    "is_lock_timeout",
    "is_memory",
    "make_engine",
    "prepare_engine",
    "read_options",
    "timeout_ms",
    "transaction_pooling_args",
]

DialectName = Literal["postgresql", "sqlite"]
PoolMode = Literal["session", "transaction"]
POOL_MODES: tuple[str, ...] = ("session", "transaction")
WRITE_OPTION = "tenxstore_write"
DEFAULT_LOCK_TIMEOUT_S = 30.0
_FOREVER_MS = 2**31 - 1
_PREPARED = "_tenxstore_prepared"
_PG_LOCK_NOT_AVAILABLE = "55P03"
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


def async_url(url: str | URL) -> URL:
    """Return ``url`` with the async driver of its dialect.

    Raises:
        ConfigError: The URL is not PostgreSQL or SQLite.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError; any parse failure is bad input
        raise ConfigError(f"not a database URL: {url!r}") from exc
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg")
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite")
    raise ConfigError(f"unsupported database {backend!r}: use postgresql:// or sqlite://")


def dialect_of(engine: AsyncEngine) -> DialectName:
    """The dialect of an engine, refusing the ones tenxstore does not support."""
    name = engine.dialect.name
    if name not in ("postgresql", "sqlite"):
        raise ConfigError(f"unsupported database {name!r}: use PostgreSQL or SQLite")
    if name == "postgresql" and engine.dialect.driver != "asyncpg":
        raise ConfigError(f"PostgreSQL needs the asyncpg driver, not {engine.dialect.driver!r}")
    return name  # type: ignore[return-value]  # narrowed by the test above


def is_memory(url: URL) -> bool:
    """Whether a SQLite URL names an in-memory database."""
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database


def timeout_ms(lock_timeout: float | None) -> int:
    return _FOREVER_MS if lock_timeout is None else max(1, int(lock_timeout * 1000))


def _statement_name() -> str:
    return f"__tenx_{uuid.uuid4().hex}__"


def transaction_pooling_args() -> dict[str, Any]:
    """asyncpg connect arguments for a transaction-pooling PgBouncer.

    A transaction pooler hands each transaction to any server connection, so a
    statement prepared in one transaction cannot be found in the next: no statement
    cache (asyncpg's or SQLAlchemy's), and a unique name for every statement
    SQLAlchemy prepares, so two clients never collide on one server connection.
    """
    return {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": _statement_name,
    }


def make_engine(
    url: str | URL,
    options: dict[str, Any] | None = None,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT_S,
    pool_mode: PoolMode = "session",
) -> AsyncEngine:
    """Create an engine for ``url`` with tenxstore's defaults, overridable by ``options``."""
    parsed = async_url(url)
    kwargs: dict[str, Any] = {}
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        connect_args["timeout"] = timeout_ms(lock_timeout) / 1000
        if is_memory(parsed):
            kwargs["poolclass"] = StaticPool
            connect_args["check_same_thread"] = False
    else:
        kwargs.update(pool_size=10, max_overflow=10, pool_recycle=1800)
        if pool_mode == "transaction":
            connect_args.update(transaction_pooling_args())
    options = dict(options or {})
    kwargs["connect_args"] = {**connect_args, **options.pop("connect_args", {})}
    kwargs.update(options)
    engine = create_async_engine(parsed, **kwargs)
    prepare_engine(engine, lock_timeout, pool_mode)
    return engine


def prepare_engine(
    engine: AsyncEngine,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT_S,
    pool_mode: PoolMode = "session",
) -> None:
    """Install per-connection settings (once per engine).

    Both dialects bound how long a writer waits for a lock (``lock_timeout``; None
    waits as long as the database lets it): PostgreSQL's ``lock_timeout``, SQLite's
    busy timeout. SQLite also gets its transaction and pragma hooks. Behind a
    transaction pooler a session setting would land on whichever server connection
    serves it, so there the repository sets ``lock_timeout`` per transaction instead.
    """
    if getattr(engine.sync_engine, _PREPARED, False):
        return
    setattr(engine.sync_engine, _PREPARED, True)
    wait_ms = timeout_ms(lock_timeout)
    if engine.dialect.name == "postgresql":
        if lock_timeout is not None and pool_mode == "session":

            @event.listens_for(engine.sync_engine, "connect")
            def _on_pg_connect(dbapi_connection: Any, _record: Any) -> None:
                cursor = dbapi_connection.cursor()
                try:
                    cursor.execute(f"SET lock_timeout = {wait_ms}")
                finally:
                    cursor.close()

        return
    memory = is_memory(engine.url)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Hand transaction control to SQLAlchemy's begin event below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={wait_ms}")
            if not memory:
                cursor.execute("PRAGMA journal_mode=WAL")
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _driver_error(exc: DBAPIError) -> BaseException | None:
    """The driver's own exception behind SQLAlchemy's (asyncpg's sits under the adapter's)."""
    seen: BaseException | None = exc.orig
    for _ in range(4):
        if seen is None or type(seen).__module__.startswith("asyncpg"):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def died_before_sending(exc: DBAPIError) -> bool:
    """Whether the driver refused to send because the connection was already closed.

    asyncpg raises its client-side ``InterfaceError`` when a pooled connection that
    the server dropped while idle is used again: nothing reached the server. A
    connection lost in the middle of a statement is a ``PostgresConnectionError``
    instead, and what it did is not known.
    """
    if not exc.connection_invalidated:
        return False
    try:
        from asyncpg.exceptions import PostgresError
        from asyncpg.exceptions._base import InterfaceError
    except ImportError:  # pragma: no cover - asyncpg is a dependency
        return False
    cause = _driver_error(exc)
    return isinstance(cause, InterfaceError) and not isinstance(cause, PostgresError)


def is_lock_timeout(exc: DBAPIError) -> bool:
    """Whether a driver error is a lock wait that ran out (by SQLSTATE / SQLite code)."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE:
        return True
    code = getattr(orig, "sqlite_errorcode", None)  # Python 3.11+
    return isinstance(code, int) and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


def insert_ignore(dialect: DialectName, table: Table, *conflict: str) -> Insert:
    """``INSERT ... ON CONFLICT (conflict) DO NOTHING`` for ``dialect``."""
    if dialect == "postgresql":
        return pg_insert(table).on_conflict_do_nothing(index_elements=list(conflict))
    return sqlite_insert(table).on_conflict_do_nothing(index_elements=list(conflict))


def read_options(dialect: DialectName, pool_mode: PoolMode = "session") -> dict[str, Any]:
    """Execution options for a connection that runs one read statement."""
    # PostgreSQL: no BEGIN/ROLLBACK round trips around a single SELECT — except behind
    # a transaction pooler, which may move a statement's Bind to another server
    # connection than its Parse unless a transaction pins them together.
    # SQLite: keep the default; switching its isolation level re-enables the driver's
    # implicit transactions when the connection returns to the pool.
    if dialect == "postgresql" and pool_mode == "session":
        return {"isolation_level": "AUTOCOMMIT"}
    return {}
