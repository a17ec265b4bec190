"""PostgreSQL through asyncpg: in session mode, and behind a transaction-pooling PgBouncer.

Session mode (:class:`PostgresBackend`):
    * single-statement reads run in AUTOCOMMIT, saving the BEGIN/ROLLBACK round trips;
    * a writer sends its own ``BEGIN``, then locks the thread row with
      ``SELECT ... FOR UPDATE``; a ``BEGIN`` that fails on a connection found dead
      never started a transaction and is tried once more on a fresh connection;
    * the state write is ONE statement of data-modifying CTEs;
    * ``lock_timeout`` is a session setting, set when a connection opens.

Behind a transaction pooler (:class:`PgBouncerBackend`) a statement outside a
transaction may be parsed and executed on different server connections, and a
session setting lands on whichever server connection serves it: no statement
caches, unique prepared-statement names, every statement inside a transaction, and
``SET LOCAL lock_timeout`` in each write transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Table, Text, bindparam, delete, event, func, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import BindParameter

from ..errors import ConfigError
from ..models import Tables
from .base import Backend, StateWrite, timeout_ms

__all__ = ["PgBouncerBackend", "PostgresBackend", "transaction_pooling_args"]

_LOCK_NOT_AVAILABLE = "55P03"
_BORROWED = "_tenxstore_borrowed"


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


def _driver_error(exc: DBAPIError) -> BaseException | None:
    """asyncpg's own exception behind SQLAlchemy's (it sits under the adapter's)."""
    seen: BaseException | None = exc.orig
    for _ in range(4):
        if seen is None or type(seen).__module__.startswith("asyncpg"):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class PostgresBackend(Backend):
    """PostgreSQL in session mode (a direct connection, or a session-pooling proxy)."""

    name = "postgresql"
    dialect = "postgresql"
    supports_schema = True

    @classmethod
    def pool_args(cls) -> dict[str, Any]:
        return {"pool_size": 10, "max_overflow": 10, "pool_recycle": 1800}

    @classmethod
    def prepare(cls, engine: AsyncEngine, lock_timeout: float | None) -> None:
        """Set ``lock_timeout`` on every connection the engine opens (once per engine)."""
        sync = engine.sync_engine
        if getattr(sync, "_tenxstore_prepared", False) or lock_timeout is None:
            return
        sync._tenxstore_prepared = True  # type: ignore[attr-defined]  # a marker of ours
        wait_ms = timeout_ms(lock_timeout)

        @event.listens_for(sync, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(f"SET lock_timeout = {wait_ms}")
            finally:
                cursor.close()

    def read_options(self) -> dict[str, Any]:
        return {"isolation_level": "AUTOCOMMIT"}

    def insert_ignore(self, table: Table, *conflict: str) -> Insert:
        return pg_insert(table).on_conflict_do_nothing(index_elements=list(conflict))

    def is_lock_timeout(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE

    async def snapshot_options(self, conn: AsyncConnection) -> None:
        await conn.execution_options(isolation_level="REPEATABLE READ")

    async def clock(self, conn: AsyncConnection) -> datetime:
        """The server's ``clock_timestamp()``: every worker's leases on one clock."""
        now: datetime = (await conn.execute(select(func.clock_timestamp()))).scalar_one()
        return now

    def build_state_write(self, tables: Tables) -> Executable:
        """The state insert, message inserts, version bump and prune in ONE statement
        (data-modifying CTEs), sent once the thread row is locked.

        Messages travel as parallel arrays through ``unnest(...) WITH ORDINALITY`` so the
        statement is the same for any number of them (one prepared statement) and their
        sequence numbers follow the caller's order. The prune's CTE reads the snapshot
        taken before the insert, and only ever deletes versions below the new one.
        """
        t, s, m = tables.threads, tables.states, tables.messages
        thread: BindParameter[Any] = bindparam("b_thread")
        now: BindParameter[Any] = bindparam("b_now")
        new_state = insert(s).values(
            thread_id=thread,
            version=bindparam("b_version"),
            state_data=bindparam("b_state"),
            meta=bindparam("b_meta"),
            created_at=now,
        )
        batch = func.unnest(
            bindparam("b_ids", type_=ARRAY(Text())),
            bindparam("b_roles", type_=ARRAY(Text())),
            bindparam("b_payloads", type_=ARRAY(Text())),
        ).table_valued("message_id", "role", "payload", with_ordinality="ord")
        batch = batch.render_derived(name="batch")
        new_messages = (
            pg_insert(m)
            .from_select(
                ["thread_id", "message_id", "role", "payload", "created_at"],
                select(
                    thread.label("thread_id"),
                    batch.c.message_id,
                    batch.c.role,
                    batch.c.payload,
                    now.label("created_at"),
                ).order_by(batch.c.ord),
            )
            .on_conflict_do_nothing(index_elements=["thread_id", "message_id"])
        )
        prune = delete(s).where(s.c.thread_id == thread, s.c.version <= bindparam("b_upto"))
        return (
            update(t)
            .where(t.c.thread_id == thread)
            .values(version=bindparam("b_version"), updated_at=now)
            .add_cte(new_state.cte("new_state"))
            .add_cte(new_messages.cte("new_messages"))
            .add_cte(prune.cte("pruned"))
        )

    async def write_state(
        self, conn: AsyncConnection, sql: Any, params: StateWrite, prune: bool
    ) -> None:
        messages = params["messages"]
        await conn.execute(
            sql.state_write,
            {
                **{k: v for k, v in params.items() if k != "messages"},
                "b_ids": [r["message_id"] for r in messages],
                "b_roles": [r["role"] for r in messages],
                "b_payloads": [r["payload"] for r in messages],
            },
        )

    def write(
        self, lock: Executable, params: dict[str, Any]
    ) -> AbstractAsyncContextManager[tuple[AsyncConnection, Any]]:
        return self._session_write(lock, params)

    @asynccontextmanager
    async def _session_write(
        self, lock: Executable, params: dict[str, Any]
    ) -> AsyncIterator[tuple[AsyncConnection, Any]]:
        """``BEGIN``, lock, yield, ``COMMIT`` on an autocommit connection: SQLAlchemy
        starts no transaction of its own, and the lock is the first statement."""
        committing = False
        try:
            for attempt in (1, 2):
                async with self.connect(read=True) as conn:
                    try:
                        await conn.exec_driver_sql("BEGIN")
                    except DBAPIError as exc:
                        if attempt == 1 and exc.connection_invalidated:
                            continue  # dead on arrival: no transaction ever started
                        raise
                    try:
                        row = (await conn.execute(lock, params)).first()
                        yield conn, row
                    except BaseException:
                        await self._rollback(conn)
                        raise
                    committing = True
                    try:
                        await conn.exec_driver_sql("COMMIT")
                    except BaseException:
                        self._discard(conn)  # its state is unknown: never pooled again
                        raise
                    return
        except DBAPIError as exc:
            raise self.translate(exc, committing) from exc

    @classmethod
    async def _rollback(cls, conn: AsyncConnection) -> None:
        """Roll back a transaction begun with ``BEGIN``. A connection that cannot —
        broken, or the rollback itself cancelled — is discarded, so it never returns
        to the pool inside a transaction (its autocommit reset would not end it)."""
        if conn.invalidated:
            return
        try:
            await conn.exec_driver_sql("ROLLBACK")
        except Exception:
            cls._discard(conn)
        except BaseException:
            cls._discard(conn)
            raise

    @staticmethod
    def _discard(conn: AsyncConnection) -> None:
        """Invalidate a connection without awaiting (safe inside a cancellation)."""
        if not conn.invalidated:
            conn.sync_connection.invalidate()  # type: ignore[union-attr]  # open here

    def setup_engine(self) -> AsyncEngine:
        if getattr(self.engine.sync_engine, _BORROWED, False):
            raise ConfigError(
                "setup() cannot borrow from an asyncpg pool outside its event loop; "
                "call `await checkpointer.asetup()` on that loop"
            )
        base = self.engine
        private = AsyncEngine(Engine(base.sync_engine.pool.recreate(), base.dialect, base.url))
        self.prepare(private, self.lock_timeout)
        return private


class PgBouncerBackend(PostgresBackend):
    """PostgreSQL behind a transaction-pooling PgBouncer (``pool_mode="transaction"``)."""

    name = "pgbouncer"

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

        cause = _driver_error(exc)
        return isinstance(cause, InterfaceError) and not isinstance(cause, PostgresError)
