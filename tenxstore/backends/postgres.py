"""PostgreSQL through asyncpg, in session mode (:class:`PostgresBackend`).

    * single-statement reads run in AUTOCOMMIT, saving the BEGIN/ROLLBACK round trips;
    * a writer sends its own ``BEGIN``, then locks the thread row with
      ``SELECT ... FOR UPDATE``; a ``BEGIN`` that fails on a connection found dead
      never started a transaction and is tried once more on a fresh connection;
    * the state write is ONE statement of data-modifying CTEs;
    * ``lock_timeout`` is a session setting, set when a connection opens, with
      ``client_connection_check_interval`` (PostgreSQL 14+): a statement whose client
      is gone is ended by the server, not left to commit when its lock frees.

Behind a transaction pooler: :mod:`.pgbouncer`. asyncpg's connections and errors:
:mod:`.asyncpg_driver`; the one-round-trip state write's statements:
:mod:`.postgres_writes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy import (
    String,
    Table,
    Text,
    bindparam,
    cast,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from ..errors import ConfigError, ConnectionLost
from ..models import Tables
from . import postgres_catalog as catalog
from .asyncpg_driver import lost_error, open_uninterrupted, unsent_error
from .base import Backend, timeout_ms
from .codes import OPENING_ERRORS
from .connections import Borrowed, borrow, on_every_connection
from .driver import DriverStatement
from .lost_writes import after_a_lost_write, new_write_id, to_the_end, unknown_outcome
from .memory_sql import PostgresKeywords
from .pgoptions import asyncpg_options
from .postgres_memory import OneStatement as OneStatementMemory
from .postgres_writes import hot_writes, write_values
from .records import Footprint, Head, HeadWrite, LangGraphFastPath, StateWrite

log = logging.getLogger(__name__)

__all__ = ["PostgresBackend"]

_LOCK_NOT_AVAILABLE = "55P03"
#: The server broke a deadlock by rolling this transaction back.
_DEADLOCK_DETECTED = "40P01"
#: A statement cancelled (``pg_cancel_backend``, ``statement_timeout``).
_QUERY_CANCELED = "57014"
#: read_only_sql_transaction: a write sent to a standby (or a primary being demoted).
_READ_ONLY = "25006"
#: How often (ms) the server looks whether the client of a running statement is
#: still there (``client_connection_check_interval``, PostgreSQL 14+).
CLIENT_CHECK_MS = 1000
_BORROWED = "_tenxstore_borrowed"

if TYPE_CHECKING:
    from ..store import Store
    from .records import MemoryFastPath


class PostgresBackend(Backend):
    """PostgreSQL in session mode (a direct connection, or a session-pooling proxy)."""

    name = "postgresql"
    dialect = "postgresql"
    dml_in_ctes = True
    supports_schema = True
    keywords = PostgresKeywords()
    vector_extension = True
    opening_errors = (
        *OPENING_ERRORS,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        asyncpg.TargetServerAttributeNotMatched,  # several hosts, none of them the primary
    )
    driver_hot_path: bool = True
    """Whether the head read and the common state write go straight to asyncpg."""

    @classmethod
    def create_engine(
        cls, url: URL, options: dict[str, Any], lock_timeout: float | None
    ) -> AsyncEngine:
        """The engine, with the URL's libpq options (``sslmode``, ``application_name``...)
        said to asyncpg as it takes them (see :mod:`.pgoptions`; the caller's own
        ``connect_args`` win), whose connections open uninterrupted by a cancel."""
        url, libpq = asyncpg_options(url)
        options = {**options, "connect_args": {**libpq, **options.get("connect_args", {})}}
        engine = super().create_engine(url, options, lock_timeout)
        open_uninterrupted(engine.sync_engine)
        return engine

    # -- the hot path, at driver level -------------------------------------------------

    def bind(self, sql: Any) -> None:
        super().bind(sql)
        dialect = self.engine.dialect
        self._read_any = DriverStatement(sql.head_state, dialect)
        self._read_own = DriverStatement(sql.head_state_of_user, dialect)
        self._writes, self._verify = hot_writes(sql.tables, dialect)
        self._opening_errors: tuple[type[BaseException], ...] = (
            *self.opening_errors,  # asyncpg's own: a connection that ended as it opened
            dialect.loaded_dbapi.Error,  # raised as is from the pool's connect event
        )

    async def read_head(self, thread_id: Any, user_id: Any) -> Head | None:
        """One prepared SELECT on a borrowed asyncpg connection (retried once on a
        connection found dead: reads are idempotent)."""
        if not self.driver_hot_path:
            return await super().read_head(thread_id, user_id)
        args: tuple[Any, ...]
        if user_id is None:
            stmt, args = self._read_any, (thread_id,)
        else:
            stmt, args = self._read_own, (thread_id, user_id)
        row = await self._hot(stmt.sql, args, idempotent=True)
        return None if row is None else Head(row[0], row[1], row[3], row[2])

    async def commit_head(self, write: HeadWrite) -> Head | None:
        """ONE statement in autocommit: an ``UPDATE ... RETURNING`` that takes the
        thread's row lock and compare-and-swaps its version (and owner, and
        incarnation), with data-modifying CTEs that insert the state and the new
        messages and prune, all from the row it returned: when it matches nothing,
        nothing is written. A lost connection raises ConnectionLost(committed=None):
        the statement may have committed."""
        if not self.driver_hot_path or write.expected is None:
            # A write on top of whatever is there takes the locked path: its prune must
            # see the states a writer it waited for committed (one statement's snapshot
            # predates the lock wait; a compare-and-swap write never waits on a commit
            # it would not fail on).
            return None
        key = (write.owned, write.expected is not None, write.incarnation is not None)
        stmt = self._writes[key]
        write_id = new_write_id()
        args = stmt.args(write_values(write, write_id))
        server: list[int] = []  # the backend that ran it, to end it if the link breaks
        try:
            row = await self._hot(stmt.sql, args, idempotent=False, fresh=True, server=server)
        except ConnectionLost:  # ended and looked into even if the caller is cancelled
            return await to_the_end(self._after_a_lost_write(write, write_id, server))
        return None if row is None else Head(row[0], row[1], row[2], None)

    @property
    def one_statement_writes(self) -> bool:  # type: ignore[override]
        return self.driver_hot_path

    lateral_lookups = True
    strict_union_types = True

    def json_text(self, document: Any, key: Any, path: Any) -> ColumnElement[Any]:
        """``document::jsonb ->> key``."""
        return cast(document, JSONB).op("->>", return_type=String())(key)

    def langgraph_fast_path(self, store: Store) -> LangGraphFastPath | None:
        """One statement each, at driver level (:mod:`.postgres_langgraph`)."""
        if not self.one_statement_writes:
            return None
        from .postgres_langgraph import OneStatement

        return OneStatement(store)

    def memory_fast_path(self, store: Store) -> MemoryFastPath | None:
        """One statement each, at driver level (:mod:`.postgres_memory`)."""
        return OneStatementMemory(store) if self.one_statement_writes else None

    async def run_here(
        self, stmt: DriverStatement, values: Mapping[str, Any], *, write: bool, many: bool = False
    ) -> Any:
        """On a borrowed asyncpg connection, prepared (see :meth:`_hot`): a read is sent
        again once on a connection found dead, a write only when it was never sent."""
        return await self._hot(
            stmt.sql, stmt.args(values), idempotent=not write, fresh=write, many=many
        )

    async def _after_a_lost_write(
        self, write: HeadWrite, write_id: int, server: list[int]
    ) -> Head | None:
        """The connection broke while the write was in flight (a server that dropped an
        idle connection, a restart, a broken link): look, on a fresh connection, at
        what it did.

        First the backend that ran it is ended and gone (the server may not have
        noticed the broken link: a statement waiting for the row lock would commit
        later); if that cannot be made sure of, the outcome is unknown
        (``committed=None``). Then see :func:`~.lost_writes.after_a_lost_write`: its own
        state row (by ``write_id``) there: it committed, and the call succeeds; else
        ConnectionLost with ``committed=False`` when nothing moved, None when it cannot
        be told, or the locked path's precise error.
        """
        expected = write.expected
        assert expected is not None
        values = {"b_thread": write.thread_id, "b_expected": expected, "b_write_id": write_id}
        try:
            ended = bool(server) and await self._ended(server[0])
            seen = None
            if ended:
                seen = await self._hot(self._verify.sql, self._verify.args(values), idempotent=True)
        except Exception as exc:  # the look itself failed: the outcome is unknown
            raise self.lost(unknown_outcome()) from exc
        if not ended:  # the server may still run it, and commit it later
            raise self.lost(unknown_outcome())
        return after_a_lost_write(self, write, seen)

    async def _ended(self, pid: int) -> bool:
        """End a server backend and make sure it is gone (PostgreSQL 14+ waits for it)."""
        try:
            await self._hot("SELECT pg_terminate_backend($1, 5000)", (pid,), idempotent=True)
            gone = await self._hot(
                "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)",
                (pid,),
                idempotent=True,
            )
        except Exception:
            return False
        return bool(gone[0])

    async def _hot(
        self,
        sql: str,
        args: tuple[Any, ...],
        *,
        idempotent: bool,
        fresh: bool = False,
        server: list[int] | None = None,
        many: bool = False,
    ) -> Any:
        """Run one statement on a borrowed asyncpg connection; its first row (``many``:
        its rows).

        A statement the driver refused to send (its connection was found closed) is
        sent again on a fresh connection; a read also when the connection broke
        mid-statement. A cancelled statement is cancelled on the server by asyncpg,
        and the call waits until it has, however often it is cancelled meanwhile, so
        it cannot commit after the call has ended; a broken connection is discarded.
        ``server`` receives the backend process id that ran the statement.
        """
        borrowed = (await self._engines.get()).borrowed
        for attempt in self.retry.tries():
            taken = await borrow(self, borrowed, attempt, self._opening_errors)
            if taken is None:
                continue  # it broke while being set up: nothing was sent
            fairy, since = taken
            driver = fairy.driver_connection
            if (
                fresh
                and driver.is_closed() is False
                and await self._closed_while_idle(borrowed, taken, attempt)
            ):
                continue  # another connection is tried: nothing was sent
            if server is not None:
                server[:] = [driver.get_server_pid()]
            try:
                self._sent(sql)  # inside: whatever a listener raises, the connection goes back
                row = await (driver.fetch if many else driver.fetchrow)(sql, *args)
            except asyncio.CancelledError:
                settled = asyncio.ensure_future(borrowed.settle(fairy, since))
                while not settled.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(settled)
                raise
            except Exception as exc:
                await self._after_failure(exc, borrowed, taken, attempt, idempotent)
                continue
            await borrowed.give(fairy, since)
            return row
        raise AssertionError("unreachable")

    async def _closed_while_idle(
        self, borrowed: Borrowed, taken: tuple[Any, float], attempt: int
    ) -> bool:
        """Whether a connection a write is about to use was closed while it sat idle
        (then it is discarded, and another is to be tried). A write is never sent
        twice: let the loop take in what the server said meanwhile (a restart, a
        killed backend)."""
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:  # nothing was sent: the connection is fine
            borrowed.give_later(*taken)
            raise
        if not taken[0].driver_connection.is_closed():
            return False
        borrowed.discard(taken[0])
        borrowed.after_disconnect()
        if await self.retry.again(attempt, log, self.name, "a pooled connection was found closed"):
            return True
        raise self.lost(ConnectionLost("every connection tried was closed; nothing was written"))

    async def _after_failure(
        self, exc: Exception, borrowed: Borrowed, taken: tuple[Any, float], attempt: int, idem: bool
    ) -> None:
        """After a statement failed: its connection discarded (broken) or given back;
        returns when it is to be sent again (it was never sent, or it is a read
        and the connection broke), else raises tenxstore's error."""
        unsent, lost = unsent_error(exc), lost_error(exc)
        read_only = getattr(exc, "sqlstate", None) == _READ_ONLY  # not a writer's server
        if unsent or lost or read_only:
            borrowed.discard(taken[0])
            borrowed.after_disconnect()
        else:
            await borrowed.give(*taken)
        if (unsent or (lost and idem)) and await self.retry.again(
            attempt, log, self.name, "a connection broke; nothing was written"
        ):
            return
        raise self._driver_error(exc, lost, unsent or idem) from exc

    def _driver_error(self, exc: Exception, lost: bool, nothing_written: bool) -> Exception:
        """An asyncpg error of the hot path as tenxstore's error (by class and SQLSTATE)."""
        if lost or unsent_error(exc):
            if nothing_written:
                return self.lost(ConnectionLost("the connection was lost; nothing was written"))
            return self.lost(
                ConnectionLost(
                    "the connection was lost while the write ran; it may have been applied: "
                    "re-read the thread before writing again",
                    committed=None,
                )
            )
        if getattr(exc, "sqlstate", None) == _DEADLOCK_DETECTED:
            return self.deadlocked()  # one statement: rolled back whole
        if getattr(exc, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
            return self.lock_timed_out()
        if getattr(exc, "sqlstate", None) == _QUERY_CANCELED:
            return self.cancelled(committing=False)  # one statement: nothing applied
        if getattr(exc, "sqlstate", None) == _READ_ONLY:
            return self.read_only()
        return exc

    @classmethod
    def pool_args(cls) -> dict[str, Any]:
        return {"pool_size": 10, "max_overflow": 10, "pool_recycle": 1800}

    @classmethod
    def prepare(cls, engine: AsyncEngine, lock_timeout: float | None) -> None:
        """Set the session's settings on every connection the engine opens (once per
        engine), in one statement: ``lock_timeout``, and on PostgreSQL 14+
        ``client_connection_check_interval``, so that a statement whose client is gone
        (a broken link while it waits for a row lock) is ended by the server within
        :data:`CLIENT_CHECK_MS` instead of committing whenever the lock frees."""
        sync = engine.sync_engine
        if getattr(sync, "_tenxstore_prepared", False):
            return
        sync._tenxstore_prepared = True  # type: ignore[attr-defined]  # a marker of ours
        settings = {} if lock_timeout is None else {"lock_timeout": timeout_ms(lock_timeout)}

        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            wanted = dict(settings)
            if dbapi_connection.driver_connection.get_server_version().major >= 14:
                wanted["client_connection_check_interval"] = CLIENT_CHECK_MS
            if not wanted:
                return
            sets = ", ".join(f"set_config('{name}', '{ms}', false)" for name, ms in wanted.items())
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(f"SELECT {sets}")
            finally:
                cursor.close()
            # The adapter ran it in a transaction of its own: end it, so the connection
            # enters the pool idle (driver-level statements run in autocommit).
            dbapi_connection.commit()

        on_every_connection(sync, _on_connect)

    def read_options(self) -> dict[str, Any]:
        return {"isolation_level": "AUTOCOMMIT"}

    def insert(self, table: Table) -> Any:
        return pg_insert(table)

    def is_lock_timeout(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE

    def is_cancelled(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) == _QUERY_CANCELED

    def is_deadlock(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) == _DEADLOCK_DETECTED

    def is_read_only(self, exc: DBAPIError) -> bool:
        return getattr(exc.orig, "sqlstate", None) == _READ_ONLY

    async def snapshot_options(self, conn: AsyncConnection) -> None:
        await conn.execution_options(isolation_level="REPEATABLE READ")

    def identity_columns(self, schema: str | None) -> list[ColumnElement[Any]]:
        return catalog.identity_columns(schema)

    def identity_text(self, values: Sequence[Any]) -> str:
        return catalog.identity_text(values)

    def declared_type(self, of: Table, name: str, schema: str | None) -> ColumnElement[Any]:
        return catalog.declared_type(of, name, schema)

    async def footprint(
        self, conn: AsyncConnection, schema: str | None, tables: Sequence[Table], exact: bool
    ) -> Footprint:
        return await catalog.table_footprint(conn, schema, tables, exact)

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
            for attempt in self.retry.tries():
                async with self.connect(read=True) as conn:
                    try:
                        await conn.exec_driver_sql("BEGIN")
                    except DBAPIError as exc:
                        if exc.connection_invalidated and await self.retry.again(
                            attempt, log, self.name, "BEGIN found its connection dead"
                        ):
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
