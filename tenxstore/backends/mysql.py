"""MySQL 8 and MariaDB 10.6+ through asyncmy.

* InnoDB tables in ``utf8mb4`` with a binary, no-pad collation (``utf8mb4_nopad_bin``
  on MariaDB, ``utf8mb4_0900_bin`` on MySQL 8): ids compare byte for byte, so ``"A"``
  and ``"a"`` (and ``"a"`` and ``"a "``) are different threads, as on PostgreSQL;
* every connection runs ``READ COMMITTED`` (a writer's ``SELECT ... FOR UPDATE``
  reads the newest committed row either way; READ COMMITTED takes no gap locks,
  so two writers creating different threads never wait for each other), a strict
  ``sql_mode`` (a value too long for its column is an error, never truncated), UTC
  as the session time zone, and ``innodb_lock_wait_timeout``;
* ``innodb_lock_wait_timeout`` is in whole seconds: ``lock_timeout`` is rounded UP to
  the next second (0.2 s waits 1 s) and an expired wait (error 1205) is
  :class:`~tenxstore.errors.LockTimeout`;
* a deadlock (error 1213) rolls the whole transaction back on the server: it is
  raised as :class:`~tenxstore.errors.LockTimeout` (nothing was written; retrying
  is safe) and never replayed behind the caller's back;
* there is no ``UPDATE ... RETURNING`` and no data-modifying CTE: a write runs
  its statements one by one under the thread's row lock (:meth:`update_returning`
  reads the row back under that lock);
* the database in the URL is the schema: ``schema=`` is refused;
* a lost connection (errors 2006, 2013, ...) is
  :class:`~tenxstore.errors.ConnectionLost` as on the other databases;
* a statement the server interrupted (``KILL QUERY``: 1317, ``max_statement_time``:
  1969, MySQL's ``max_execution_time``: 3024) is
  :class:`~tenxstore.errors.StatementCancelled`;
* a statement over ``max_allowed_packet`` is refused before it is sent (its size
  checked against the server's value, read once per connection), or when the server
  refuses it (1153), as :class:`~tenxstore.errors.SerializationError`.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    String,
    Table,
    UniqueConstraint,
    bindparam,
    column,
    event,
    func,
    inspect,
    literal_column,
    select,
    text,
)
from sqlalchemy import table as catalog_table
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.engine import Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import ColumnElement

from ..errors import ConfigError, SerializationError, TenxStoreError
from .base import Backend
from .connections import on_every_connection
from .driver import causes
from .memory_sql import MysqlKeywords
from .mysql_hotpath import MYSQL, SESSION_FACTS, MysqlHotPath, record_session
from .mysql_hotpath import PACKET as _PACKET
from .records import Footprint, Head, HeadWrite, TableSizes

log = logging.getLogger(__name__)

__all__ = ["MysqlBackend", "lock_wait_seconds", "mysql_code", "statement_size"]

ER_LOCK_WAIT_TIMEOUT = 1205
ER_LOCK_DEADLOCK = 1213
ER_NET_PACKET_TOO_LARGE = 1153
# The catalog's columns: the id columns' declared types for the schema check.
_COLUMNS = catalog_table(
    "COLUMNS",
    column("TABLE_SCHEMA"),
    column("TABLE_NAME"),
    column("COLUMN_NAME"),
    column("DATA_TYPE"),
    schema="information_schema",
)
#: A statement the server interrupted with the connection kept: KILL QUERY (1317),
#: MariaDB's max_statement_time (1969), MySQL 8's max_execution_time (3024).
_CANCELLED = (1317, 1969, 3024)
_GONE = (2006, 4031)  # CR_SERVER_GONE_ERROR; ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
#: innodb_lock_wait_timeout's largest value (MySQL 8 and MariaDB): "no bound".
MAX_LOCK_WAIT_S = 1073741824
#: Seconds a setup() waits for another process's migration (GET_LOCK).
MIGRATION_LOCK_WAIT_S = 600
_SQL_MODE = (
    "STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
    "NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO"
)
_REFUSALS = {
    1044: "access denied to the database: grant the user its privileges",
    1045: "authentication failed: wrong user or password",
    1049: "no such database: create it, or fix the database name in the URL",
    1040: "the server has no connection slot left (max_connections)",
    1203: "the user has no connection slot left (max_user_connections)",
    2003: "connection refused: is the server running, and on this host and port?",
    2005: "unknown host: check the host name in the URL",
}


def mysql_code(exc: BaseException | None) -> int | None:
    """The server's (or client library's) error number behind a driver error."""
    for seen in causes(exc):
        args = getattr(seen, "args", ())
        if args and isinstance(args[0], int):
            return args[0]
    return None


def lock_wait_seconds(lock_timeout: float | None) -> int:
    """``innodb_lock_wait_timeout`` for a lock timeout: whole seconds, rounded up."""
    if lock_timeout is None:
        return MAX_LOCK_WAIT_S
    return min(MAX_LOCK_WAIT_S, max(1, math.ceil(lock_timeout)))


class MysqlBackend(Backend):
    """A MySQL 8 or MariaDB 10.6+ database (asyncmy)."""

    name = "mysql"
    dialect = "mysql"

    def json_text(self, document: Any, key: Any, path: Any) -> ColumnElement[Any]:
        """``JSON_UNQUOTE(JSON_EXTRACT(document, path))``: MySQL's JSON_EXTRACT gives
        JSON (a text member ``"quoted"``)."""
        return func.json_unquote(func.json_extract(document, path), type_=String())

    keywords = MysqlKeywords()

    @classmethod
    def connect_args(cls, lock_timeout: float | None) -> dict[str, Any]:
        return {"charset": "utf8mb4"}

    @classmethod
    def pool_args(cls) -> dict[str, Any]:
        # The server closes connections idle for wait_timeout (8 h by default): recycle
        # well before, and ping a connection that sat idle (pool_pre_ping is cheap here).
        return {"pool_size": 10, "max_overflow": 10, "pool_recycle": 1800}

    @classmethod
    def prepare(cls, engine: AsyncEngine, lock_timeout: float | None) -> None:
        """The session's settings on every connection the engine opens (once per engine):
        the lock wait, READ COMMITTED, a strict sql_mode and UTC."""
        sync = engine.sync_engine
        if getattr(sync, "_tenxstore_prepared", False):
            return
        sync._tenxstore_prepared = True  # type: ignore[attr-defined]  # a marker of ours
        wait = lock_wait_seconds(lock_timeout)

        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(
                    f"SET SESSION innodb_lock_wait_timeout = {wait}, "
                    f"sql_mode = '{_SQL_MODE}', time_zone = '+00:00'"
                )
                cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                cursor.execute(f"SELECT @@max_allowed_packet, {SESSION_FACTS}")
                packet, thread, server, booted = cursor.fetchone()
                _record.info[_PACKET] = int(packet)
                record_session(_record.info, thread, server, booted)
            finally:
                cursor.close()
            # SQLAlchemy read the server's default (REPEATABLE READ) before this ran, and
            # puts a connection whose level an execution option changed (a snapshot) back
            # to it when it returns to the pool: make READ COMMITTED that default, or
            # writers would take gap locks and deadlock creating the same new thread.
            sync.dialect.default_isolation_level = "READ COMMITTED"

        on_every_connection(sync, _on_connect)

        @event.listens_for(sync, "before_cursor_execute")
        def _fits(
            conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, many: bool
        ) -> None:
            rows = parameters if many else [parameters]
            for row in rows or ():
                cls.refuse_oversize(conn.info, statement, row)

    @staticmethod
    def refuse_oversize(info: dict[str, Any], statement: str, parameters: Any) -> None:
        """Raise SerializationError, before anything is sent, when ``statement`` with
        ``parameters`` would exceed the connection's ``max_allowed_packet`` (recorded
        in its pool record's ``info`` as it opened)."""
        limit = info.get(_PACKET)
        if limit is None:
            return
        size = statement_size(statement, parameters, limit)
        if size > limit:
            log.warning("a statement of %d bytes exceeds max_allowed_packet", size)
            raise SerializationError(
                f"a value is too large for the server: the statement would be "
                f"~{size} bytes, over max_allowed_packet ({limit} bytes; a sealed "
                "value is ~4/3 its size); nothing was written"
            )

    # -- the hot path: one prepared statement each (:mod:`.mysql_hotpath`) ------------

    driver_ops = MYSQL

    def bind(self, sql: Any) -> None:
        super().bind(sql)
        self._hot = MysqlHotPath(self, sql)

    async def read_head(self, thread_id: Any, user_id: Any) -> Head | None:
        """One prepared SELECT on a borrowed connection (see :mod:`.mysql_hotpath`)."""
        return await self._hot.read_head(thread_id, user_id)

    async def commit_head(self, write: HeadWrite) -> Head | None:
        """One prepared CALL of ``tenx_commit_head`` (see :mod:`.mysql_hotpath`)."""
        return await self._hot.commit_head(write)

    def hot_error(self, code: int | None) -> Exception | None:
        """tenxstore's error for a server error number the hot path met (the
        procedure rolled back whatever it did), or None."""
        if code == ER_LOCK_WAIT_TIMEOUT:
            return self.lock_timed_out()
        if code == ER_LOCK_DEADLOCK:
            return self.deadlocked()
        if code == ER_NET_PACKET_TOO_LARGE:
            return SerializationError(
                "a value is too large for the server: over max_allowed_packet (a sealed "
                "value is ~4/3 its size); nothing was written"
            )
        return None

    def insert(self, table: Table) -> Any:
        return mysql_insert(table)

    def prune(self, tables: Any) -> Executable:
        """The prune by the unique key of ``states(thread_id, version)``, named (a
        multi-table DELETE takes an index hint): a young table's statistics may have it
        scan every row, waiting on other threads' rows, and writers of different threads
        deadlock."""
        s = tables.states
        key = next(
            c.name
            for c in s.constraints
            if isinstance(c, UniqueConstraint)
            and [col.name for col in c.columns]
            == [
                "thread_id",
                "version",
            ]
        )
        return text(
            f"DELETE pruned FROM {s.name} AS pruned FORCE INDEX (`{key}`) "
            "WHERE pruned.thread_id = :b_thread AND pruned.version <= :b_upto"
        ).bindparams(
            bindparam("b_thread", type_=s.c.thread_id.type),
            bindparam("b_upto", type_=s.c.version.type),
        )

    def insert_ignore(self, table: Table, *conflict: str) -> Insert:
        """``INSERT ... ON DUPLICATE KEY UPDATE key = key``: a duplicate writes nothing.
        (Not ``INSERT IGNORE``, which would also turn every other error into a warning.)"""
        key = conflict[0]
        stmt: Insert = mysql_insert(table).on_duplicate_key_update({key: table.c[key]})
        return stmt

    def upsert(self, table: Table, *conflict: str) -> Insert:
        """``INSERT ... ON DUPLICATE KEY UPDATE`` of every other column."""
        stmt = mysql_insert(table)
        others = {c.name: stmt.inserted[c.name] for c in table.c if c.name not in conflict}
        done: Insert = stmt.on_duplicate_key_update(others)
        return done

    async def update_returning(
        self, conn: AsyncConnection, stmt: Update, table: Table, *key: ColumnElement[bool]
    ) -> Row[Any]:
        """No ``UPDATE ... RETURNING`` here: the update, then the row read back (the
        caller's transaction holds its lock, so it is the row as this update left it)."""
        await conn.execute(stmt)
        return (await conn.execute(select(*table.c).where(*key))).one()

    def died_before_sending(self, exc: DBAPIError) -> bool:
        """The connection was found gone before the statement ran (error 2006, or MySQL
        8's 4031 for one it closed as idle): a pooled connection the server dropped
        (a restart, ``wait_timeout``). The write starts again on a fresh connection;
        one lost while its statement ran (2013) is ConnectionLost, never replayed."""
        return bool(exc.connection_invalidated) and mysql_code(exc.orig) in _GONE

    def is_lock_timeout(self, exc: DBAPIError) -> bool:
        return mysql_code(exc.orig) in (ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK)

    def is_cancelled(self, exc: DBAPIError) -> bool:
        return mysql_code(exc.orig) in _CANCELLED

    def translate(self, exc: DBAPIError, committing: bool) -> Exception:
        if mysql_code(exc.orig) == ER_NET_PACKET_TOO_LARGE and not committing:
            # What the size check before sending missed: the server refused it whole.
            return SerializationError(
                "a value is too large for the server: over max_allowed_packet (a sealed "
                "value is ~4/3 its size); nothing was written"
            )
        return super().translate(exc, committing)

    def is_deadlock(self, exc: DBAPIError) -> bool:
        return mysql_code(exc.orig) == ER_LOCK_DEADLOCK

    def opening_failed(self, exc: BaseException) -> TenxStoreError:
        from ..errors import DatabaseUnavailable

        why = _REFUSALS.get(mysql_code(exc) or 0)
        if why is None:
            return super().opening_failed(exc)
        where = self.describe()
        log.warning("cannot use the database %s: %s", where, why)
        return DatabaseUnavailable(f"cannot use the database {where}: {why}")

    async def snapshot_options(self, conn: AsyncConnection) -> None:
        # A consistent read view for the whole transaction (READ COMMITTED takes one
        # per statement); SQLAlchemy restores the level when the connection returns.
        await conn.execution_options(isolation_level="REPEATABLE READ")

    async def clock(self, conn: AsyncConnection) -> datetime:
        """The server's ``UTC_TIMESTAMP(6)``: every worker's leases on one clock."""
        now: datetime = (await conn.execute(text("SELECT UTC_TIMESTAMP(6)"))).scalar_one()
        return now.replace(tzinfo=timezone.utc)

    def identity_columns(self, schema: str | None) -> list[ColumnElement[Any]]:
        """The server as it names itself (``@@server_id``, ``@@hostname``, ``@@port``)
        and the database's name: the same by every route to it (another host name, a
        proxy), different in a copy on another server or under another name."""
        return [
            literal_column("@@server_id"),
            func.database(),
            literal_column("@@hostname"),
            literal_column("@@port"),
        ]

    def identity_text(self, values: Sequence[Any]) -> str:
        return f"{values[0]}/{values[2]}:{values[3]}/{values[1]}"

    def declared_type(self, of: Table, name: str, schema: str | None) -> ColumnElement[Any]:
        c = _COLUMNS.c
        where = (c["TABLE_SCHEMA"] == func.database(), c["TABLE_NAME"] == of.name)
        found = select(c["DATA_TYPE"]).where(*where, c["COLUMN_NAME"] == name)
        return found.scalar_subquery()

    async def footprint(
        self, conn: AsyncConnection, schema: str | None, tables: Sequence[Table], exact: bool
    ) -> Footprint:
        """Sizes and estimated rows from ``information_schema.TABLES`` (InnoDB's
        statistics), rows counted with ``exact``; ``DATA_FREE`` as free bytes."""
        rows = {
            row[0]: row
            for row in await conn.execute(
                text(
                    "SELECT TABLE_NAME, TABLE_ROWS, DATA_LENGTH, INDEX_LENGTH, DATA_FREE"
                    " FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
                )
            )
        }
        found = {}
        for table in tables:
            row = rows.get(table.name)
            live = None if row is None else row[1]
            if exact or live is None:
                live = (await conn.execute(select(func.count()).select_from(table))).scalar_one()
            if row is None:
                found[table.name] = TableSizes(live, None, None, None)
            else:
                found[table.name] = TableSizes(live, row[2], row[3], None)
        total = sum((r[2] or 0) + (r[3] or 0) for r in rows.values())
        free = sum(r[4] or 0 for r in rows.values())
        return Footprint(found, total, free)

    @asynccontextmanager
    async def migration_connection(self) -> AsyncIterator[AsyncConnection]:
        """A connection holding the named lock ``GET_LOCK('tenxstore.migrate:<db>')``:
        MySQL's DDL commits as it goes, so a transaction cannot serialize concurrent
        migrations; the named lock is the server's, held until released (or until
        the connection ends)."""
        async with self.connect() as conn:
            database = (await conn.execute(text("SELECT DATABASE()"))).scalar()
            if not database:
                raise ConfigError("a MySQL URL must name its database (mysql://host/db)")
            # GET_LOCK names are at most 64 characters: a database name may be as long.
            key = f"tenxstore.migrate:{zlib.crc32(str(database).encode()):08x}:{database}"[:64]
            got = (
                await conn.execute(
                    text("SELECT GET_LOCK(:key, :wait)"),
                    {"key": key, "wait": MIGRATION_LOCK_WAIT_S},
                )
            ).scalar()
            await conn.commit()
            if got != 1:
                raise self.lock_timed_out()
            try:
                async with conn.begin():
                    yield conn
            finally:
                await conn.execute(text("SELECT RELEASE_LOCK(:key)"), {"key": key})
                await conn.commit()


#: What the driver escapes in a literal (one more byte each).
_ESCAPED = (b"\\", b"'", b'"', b"\0", b"\n", b"\r", b"\x1a")


def statement_size(statement: str, parameters: Any, limit: int) -> int:
    """About the bytes the driver sends for ``statement`` with one row of
    ``parameters`` inlined (asyncmy interpolates them client-side), at least: the
    values encoded and escaped — measured only when they could come near ``limit``
    (below, an upper bound is returned)."""
    values = parameters.values() if isinstance(parameters, dict) else (parameters or ())
    sized = [v for v in values if isinstance(v, (str, bytes, bytearray, memoryview))]
    most = len(statement) + sum(4 * len(v) + 16 for v in sized)  # 4 bytes a character
    if 2 * most < limit:  # the usual statement: nothing encoded twice to measure it
        return most
    raw = [v.encode("utf-8", "surrogatepass") if isinstance(v, str) else bytes(v) for v in sized]
    size = len(statement) + sum(len(v) + 16 for v in raw)
    if 2 * size < limit:  # escapes at most double it: not worth counting them
        return size
    return size + sum(v.count(c) for v in raw for c in _ESCAPED)


# -- what env.py runs the migrations with (their DDL's types: alembic/frozen_ddl.py) -----


def is_mysql(bind: Any) -> bool:
    """Whether a connection (or dialect) is MySQL or MariaDB."""
    dialect = getattr(bind, "dialect", bind)
    return dialect.name in ("mysql", "mariadb")


def resumable(impl: Any) -> None:
    """Make an Alembic migration context's DDL on MySQL resumable.

    MySQL commits each DDL statement as it runs: a migration that failed halfway (a
    lost connection, a killed process) leaves its first tables and columns behind,
    and its revision unstamped. Run again, it would fail on what exists (or on what
    it already dropped). With this, creating a table, column or index that exists and
    dropping a table, column or index that does not are skipped, so the next run
    finishes the revision, upgrade or downgrade. (Only the DDL steps that tenxstore's
    migrations take; each revision's data steps are idempotent, and its raw SQL DDL
    checks what exists itself.)
    """
    base = type(impl)

    class Resumable(base):  # type: ignore[valid-type,misc]  # a subclass of impl's own
        def create_table(self, table: Any, **kw: Any) -> None:
            if _has_table(self.connection, table.name):
                log.info("table %s exists (an earlier run made it): kept", table.name)
                return
            # MySQL ignores a primary key's name, and says so in a warning the driver
            # logs for each table: leave it out.
            table.primary_key.name = None
            super().create_table(table, **kw)

        def drop_table(self, table: Any, **kw: Any) -> None:
            if not _has_table(self.connection, table.name):
                log.info("table %s is gone (an earlier run dropped it)", table.name)
                return
            super().drop_table(table, **kw)

        def add_column(self, table_name: str, column: Any, **kw: Any) -> None:
            if column.name in _column_names(self.connection, table_name):
                log.info("column %s.%s exists: kept", table_name, column.name)
                return
            super().add_column(table_name, column, **kw)

        def drop_column(self, table_name: str, column: Any, **kw: Any) -> None:
            if column.name not in _column_names(self.connection, table_name):
                log.info("column %s.%s is gone: an earlier run dropped it", table_name, column.name)
                return
            super().drop_column(table_name, column, **kw)

        def create_index(self, index: Any, **kw: Any) -> None:
            if index.name in _index_names(self.connection, index.table.name):
                return
            super().create_index(index, **kw)

        def drop_index(self, index: Any, **kw: Any) -> None:
            if index.name not in _index_names(self.connection, index.table.name):
                return
            super().drop_index(index, **kw)

    Resumable.__name__ = f"Resumable{base.__name__}"
    impl.__class__ = Resumable


def _has_table(connection: Any, table: str) -> bool:
    """Whether the table is there now."""
    return bool(inspect(connection).has_table(table))


def _column_names(connection: Any, table: str) -> set[str]:
    """The names of a table's columns, as the database has them now."""
    return {str(c["name"]) for c in inspect(connection).get_columns(table)}


def _index_names(connection: Any, table: str) -> set[str]:
    """The names of a table's indexes, as the database has them now."""
    return {str(i["name"]) for i in inspect(connection).get_indexes(table)}
