"""The core of :class:`~tenxstore.CheckpointRepository`: construction, lifecycle,
transactions, the statements of the hot path and the helpers every part shares.

The repository is ONE class that holds all SQL; it is assembled from this core and
the mixins of :mod:`tenxstore._ledger`, :mod:`tenxstore._export` and
:mod:`tenxstore._langgraph_sql`, one module per concern so each stays readable.
Every public method validates its input first (``ConfigError`` /
``SerializationError`` before any I/O), then runs ONE transaction and hands the
connection to helpers that never begin, commit or roll back.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    URL,
    ColumnElement,
    Text,
    and_,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Engine, Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Executable
from sqlalchemy.sql.elements import BindParameter

from . import _dialect, migrate
from .config import (
    IdType,
    RunIds,
    check_id,
    check_id_type,
    read_config,
)
from .errors import (
    ConfigError,
    ConnectionLost,
    LockTimeout,
    SerializationError,
    ThreadOwnershipError,
)
from .models import Tables, tables_for
from .serde import decode, encode
from .types import StateSnapshot, ThreadInfo, ToolExecution

__all__ = ["RepositoryCore"]


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a non-negative int, not {value!r}")
    return value


def _check_limit(value: object) -> int | None:
    return None if value is None else _check_count("limit", value)


def _check_positive_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number, not {value!r}")
    return float(value)


def _role(message: dict[str, Any]) -> str | None:
    role = message.get("role")
    return role if isinstance(role, str) else None


def _message_id(value: object) -> str:
    try:
        result: str = check_id("message id", value)
    except ConfigError as exc:
        raise SerializationError(str(exc)) from None
    return result


class _HotStatements:
    """The statements of the hot path, built once per repository.

    Building a Core statement and computing its cache key costs more than the round
    trip of a one-row SELECT on loopback; built once with ``bindparam`` values, each
    call only binds parameters and hits SQLAlchemy's compiled cache.
    """

    def __init__(self, tables: Tables, dialect: _dialect.DialectName) -> None:
        t, s, m = tables.threads, tables.states, tables.messages
        thread: BindParameter[Any] = bindparam("b_thread")
        self.lock = (
            select(t.c.user_id, t.c.version)
            .where(t.c.thread_id == thread)
            .with_for_update()  # dropped on SQLite, where BEGIN IMMEDIATE serializes
        )
        self.new_thread = _dialect.insert_ignore(dialect, t, "thread_id").values(
            thread_id=thread,
            user_id=bindparam("b_user"),
            version=0,
            created_at=bindparam("b_now"),
            updated_at=bindparam("b_now"),
        )
        self.insert_state = insert(s)
        self.insert_messages = _dialect.insert_ignore(dialect, m, "thread_id", "message_id")
        self.bump = (
            update(t)
            .where(t.c.thread_id == thread)
            .values(version=bindparam("b_version"), updated_at=bindparam("b_now"))
        )
        self.prune = delete(s).where(s.c.thread_id == thread, s.c.version <= bindparam("b_upto"))
        self.write_all = self._write_all(tables) if dialect == "postgresql" else None
        head = select(t.c.version, s.c.state_data).select_from(
            t.outerjoin(s, and_(s.c.thread_id == t.c.thread_id, s.c.version == t.c.version))
        )
        self.head_state = head.where(t.c.thread_id == thread)
        self.head_state_of_user = head.where(
            t.c.thread_id == thread, t.c.user_id == bindparam("b_user")
        )

    @staticmethod
    def _write_all(tables: Tables) -> Executable:
        """PostgreSQL: the state insert, message inserts, version bump and prune in ONE
        statement (data-modifying CTEs), sent once the thread row is locked.

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


class RepositoryCore:
    """Construction, lifecycle, transactions and shared helpers of the repository."""

    def __init__(
        self,
        url_or_engine: str | URL | AsyncEngine,
        *,
        schema: str | None = None,
        state_history_limit: int = 20,
        enforce_user_isolation: bool = True,
        id_type: str = "string",
        user_id_type: str = "string",
        engine_options: dict[str, Any] | None = None,
        tool_lease_seconds: float = 900,
        lock_timeout: float | None = _dialect.DEFAULT_LOCK_TIMEOUT_S,
        pool_mode: str = "session",
    ) -> None:
        if pool_mode not in _dialect.POOL_MODES:
            raise ConfigError(f"pool_mode must be 'session' or 'transaction', not {pool_mode!r}")
        self.pool_mode: _dialect.PoolMode = pool_mode  # type: ignore[assignment]  # checked
        if lock_timeout is not None:
            lock_timeout = _check_positive_number("lock_timeout", lock_timeout)
        self.lock_timeout = lock_timeout
        if isinstance(state_history_limit, bool) or not isinstance(state_history_limit, int):
            raise ConfigError(f"state_history_limit must be an int, not {state_history_limit!r}")
        if state_history_limit < 1:
            raise ConfigError(f"state_history_limit must be at least 1, not {state_history_limit}")
        if not isinstance(enforce_user_isolation, bool):
            raise ConfigError("enforce_user_isolation must be a bool")
        self._id_type: IdType = check_id_type("id_type", id_type)
        self._user_id_type: IdType = check_id_type("user_id_type", user_id_type)
        self._lease = timedelta(
            seconds=_check_positive_number("tool_lease_seconds", tool_lease_seconds)
        )
        if schema is not None and (not isinstance(schema, str) or not schema):
            raise ConfigError(f"schema must be a non-empty str, not {schema!r}")
        if engine_options is not None and not isinstance(engine_options, dict):
            raise ConfigError("engine_options must be a dict")

        if isinstance(url_or_engine, AsyncEngine):
            if engine_options:
                raise ConfigError("engine_options apply only to engines tenxstore creates")
            engine, self._owns_engine = url_or_engine, False
            _dialect.prepare_engine(engine, lock_timeout, self.pool_mode)
        elif isinstance(url_or_engine, (str, URL)):
            engine = _dialect.make_engine(
                url_or_engine, engine_options, lock_timeout, self.pool_mode
            )
            self._owns_engine = True
        else:
            raise ConfigError(
                f"url_or_engine must be a URL or an AsyncEngine, not {type(url_or_engine).__name__}"
            )
        self._dialect = _dialect.dialect_of(engine)
        if schema is not None and self._dialect == "sqlite":
            raise ConfigError("schema= is a PostgreSQL option; SQLite has no schemas")
        if self.pool_mode == "transaction" and self._dialect != "postgresql":
            raise ConfigError("pool_mode='transaction' is for PostgreSQL behind PgBouncer")
        self._engine = engine
        # PostgreSQL: reads are single statements in autocommit, and writes send their
        # own BEGIN/COMMIT (see _write), so SQLAlchemy starts no transaction of its own.
        self._autocommit_engine = self._engine.execution_options(
            **_dialect.read_options(self._dialect, self.pool_mode)
        )
        self.schema = schema
        self.state_history_limit = state_history_limit
        self.enforce_user_isolation = enforce_user_isolation
        self.tool_lease_seconds = self._lease.total_seconds()
        self._t = tables_for(self._id_type, self._user_id_type, schema)
        self._hot = _HotStatements(self._t, self._dialect)
        # An in-memory SQLite database is one connection: its transactions take turns.
        self._memory = self._dialect == "sqlite" and _dialect.is_memory(engine.url)
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._memory_ready = False

    @property
    def engine(self) -> AsyncEngine:
        """The engine."""
        return self._engine

    @property
    def id_type(self) -> IdType:
        """Type of ``thread_id``: ``"string"``, ``"int"`` or ``"bigint"``."""
        return self._id_type

    @property
    def user_id_type(self) -> IdType:
        """Type of ``user_id``."""
        return self._user_id_type

    @property
    def dialect(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        return self._dialect

    async def asetup(self) -> None:
        """Migrate the schema to head (creating the PostgreSQL schema when absent).

        Idempotent, and safe when many processes call it at once.

        Raises:
            ConfigError: The schema was created with other ``id_type`` /
                ``user_id_type`` values.
        """
        async with self._turn():
            await self._migrate(self._engine)
            self._memory_ready = self._memory

    async def _migrate(self, engine: AsyncEngine) -> None:
        await migrate.upgrade(
            engine, schema=self.schema, id_type=self._id_type, user_id_type=self._user_id_type
        )

    def setup(self) -> None:
        """Synchronous :meth:`asetup`; works with or without a running event loop.

        The migration runs on a private event loop with its own connections, closed
        before this returns, so the checkpointer is then usable from any loop.

        Raises:
            ConfigError: The engine borrows from an asyncpg pool, which belongs to
                its own event loop: call ``await asetup()`` there instead.
        """
        if getattr(self._engine.sync_engine, "_tenxstore_borrowed", False):
            raise ConfigError(
                "setup() cannot borrow from an asyncpg pool outside its event loop; "
                "call `await checkpointer.asetup()` on that loop"
            )

        async def run() -> None:
            if self._memory:  # the database is the one connection: use it
                await self.asetup()
                return
            base = self._engine
            private = AsyncEngine(Engine(base.sync_engine.pool.recreate(), base.dialect, base.url))
            _dialect.prepare_engine(private, self.lock_timeout)
            try:
                await self._migrate(private)
            finally:
                await private.dispose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(run())
            return
        # Called from async code: run on a private loop in a worker thread.
        outcome: list[BaseException] = []

        def worker() -> None:
            try:
                asyncio.run(run())
            except BaseException as exc:  # re-raised in the caller's thread
                outcome.append(exc)

        thread = threading.Thread(target=worker, name="tenxstore-setup")
        thread.start()
        thread.join()
        if outcome:
            raise outcome[0]

    async def aclose(self) -> None:
        """Close the connection pool if this repository created it."""
        if self._owns_engine:
            await self._engine.dispose()

    def _turn(self) -> Any:
        """Serialize transactions on a single-connection (in-memory) database."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is not None and not self._memory and self._owns_engine:
                # Pooled asyncpg connections are bound to the loop that opened them.
                self._engine.sync_engine.dispose(close=False)
            self._loop = loop
        if not self._memory:
            return nullcontext()
        lock = self._turns.get(loop)
        if lock is None:
            lock = self._turns[loop] = asyncio.Lock()
        return lock

    @asynccontextmanager
    async def _connect(self, engine: AsyncEngine | None = None) -> AsyncIterator[AsyncConnection]:
        """A connection, in turn on a single-connection database."""
        async with self._turn():
            if self._memory and not self._memory_ready:
                # An in-memory database is new with every checkpointer: create its schema.
                await self._migrate(self._engine)
                self._memory_ready = True
            async with (engine or self._engine).connect() as conn:
                yield conn

    @asynccontextmanager
    async def _write(self, thread_id: Any) -> AsyncIterator[tuple[AsyncConnection, Any]]:
        """One write transaction that has locked the thread's row (None: no such row).

        SQLite takes the database's write lock with ``BEGIN IMMEDIATE`` (its busy
        timeout bounds the wait). PostgreSQL sends ``BEGIN`` itself, then the lock
        (``SELECT ... FOR UPDATE``) as the first statement. A ``BEGIN`` that fails
        because the pooled connection is dead never started a transaction, so it is
        tried once more on a fresh connection (the disconnect has marked the pool's
        older connections invalid). Once it has started, a lost connection raises
        :class:`ConnectionLost` — including a writer killed while it waits for the
        lock — and the write is never replayed.
        """
        committing = False
        try:
            if self._dialect == "postgresql" and self.pool_mode == "session":
                for attempt in (1, 2):
                    async with self._connect(self._autocommit_engine) as conn:
                        try:
                            await conn.exec_driver_sql("BEGIN")
                        except DBAPIError as exc:
                            if attempt == 1 and exc.connection_invalidated:
                                continue  # dead on arrival: no transaction ever started
                            raise
                        try:
                            row = (
                                await conn.execute(self._hot.lock, {"b_thread": thread_id})
                            ).first()
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
            # SQLite (its BEGIN IMMEDIATE comes from the begin event), and PostgreSQL
            # behind a transaction pooler, where a statement outside a transaction may
            # be parsed and executed on different server connections: asyncpg's own
            # BEGIN is a simple query. Only a driver that refused to send the lock
            # (the connection was already closed) is tried again.
            for attempt in (1, 2):
                yielded = False
                try:
                    async with self._connect() as conn:
                        if self._dialect == "sqlite":
                            await conn.execution_options(**{_dialect.WRITE_OPTION: True})
                        async with conn.begin():
                            if self._dialect == "postgresql" and self.lock_timeout is not None:
                                wait = _dialect.timeout_ms(self.lock_timeout)
                                await conn.exec_driver_sql(f"SET LOCAL lock_timeout = {wait}")
                            row = (
                                await conn.execute(self._hot.lock, {"b_thread": thread_id})
                            ).first()
                            yielded = True
                            yield conn, row
                            committing = True  # the block's exit commits
                    return
                except DBAPIError as exc:
                    if yielded or attempt == 2 or not _dialect.died_before_sending(exc):
                        raise
        except DBAPIError as exc:
            raise self._translate(exc, committing) from exc

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

    def _translate(self, exc: DBAPIError, committing: bool) -> Exception:
        """A driver error as the caller's error, by class and SQLSTATE/SQLite code."""
        if exc.connection_invalidated:
            if committing:
                return ConnectionLost(
                    "the connection was lost during COMMIT; the write may have been "
                    "applied: re-read the thread before writing again",
                    committed=None,
                )
            return ConnectionLost("the connection was lost before COMMIT; nothing was written")
        if _dialect.is_lock_timeout(exc):
            return LockTimeout(
                f"waited more than {self.lock_timeout:g}s for the thread's lock; "
                "nothing was written"
            )
        return exc

    async def _fetch(
        self, stmt: Executable, params: dict[str, Any] | None = None
    ) -> Sequence[Row[Any]]:
        """Run one read statement; retried once on a connection found dead.

        Reads are idempotent, so a pooled connection that died while idle (a restarted
        server, a killed backend) costs one retry; the driver's disconnect marks the
        pool's older connections invalid, so the retry gets a fresh one.
        """
        for attempt in (1, 2):
            try:
                async with self._connect(self._autocommit_engine) as conn:
                    return (await conn.execute(stmt, params)).all()
            except DBAPIError as exc:
                if attempt == 2 or not exc.connection_invalidated:
                    raise self._translate(exc, committing=False) from exc
        raise AssertionError("unreachable")

    def _ids(self, config: object, *, need_thread: bool = True) -> RunIds:
        return read_config(
            config,
            isolation=self.enforce_user_isolation,
            id_type=self._id_type,
            user_id_type=self._user_id_type,
            need_thread=need_thread,
        )

    @staticmethod
    def _now() -> datetime:
        return datetime.now(timezone.utc)

    def _owned(self, ids: RunIds) -> ColumnElement[bool]:
        """The thread row of this call, scoped to its owner when isolation applies."""
        t = self._t.threads
        clause: ColumnElement[bool] = t.c.thread_id == ids.thread_id
        if ids.isolated:
            clause = and_(clause, t.c.user_id == ids.user_id)
        return clause

    def _visible_thread(self, ids: RunIds) -> Any:
        """A subquery of the call's thread id, empty when the caller may not see it."""
        return select(self._t.threads.c.thread_id).where(self._owned(ids)).scalar_subquery()

    async def _claim_thread(
        self, conn: AsyncConnection, ids: RunIds, row: Any, now: datetime
    ) -> int:
        """Given the locked row (or None), create the thread if absent and check its
        owner; return its head version."""
        if row is None:
            key = {"b_thread": ids.thread_id}
            await conn.execute(self._hot.new_thread, {**key, "b_user": ids.user_id, "b_now": now})
            row = (await conn.execute(self._hot.lock, key)).one()
        self._check_owner(ids, row)
        version: int = row.version
        return version

    @staticmethod
    def _check_owner(ids: RunIds, row: Any) -> None:
        if ids.isolated and row.user_id != ids.user_id:
            raise ThreadOwnershipError(ids.thread_id, ids.user_id)

    @staticmethod
    def _encode_messages(messages: Iterable[Any]) -> list[dict[str, Any]]:
        """Validate and encode messages into rows, first content per id.

        Ids are assigned to the caller's dicts only once every message has encoded,
        so a message that fails leaves all of them untouched.
        """
        if isinstance(messages, (str, bytes, Mapping)):
            raise SerializationError("messages must be a sequence of dicts")
        rows: dict[str, dict[str, Any]] = {}
        assigned: list[tuple[dict[str, Any], str]] = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise SerializationError(
                    f"messages[{i}] must be a dict, not {type(message).__name__}"
                )
            given = message.get("id")
            if given is None:
                mid = uuid.uuid4().hex
                assigned.append((message, mid))
                payload = encode({**message, "id": mid}, "message")
            else:
                mid = _message_id(given)
                payload = encode(message, "message")
            rows.setdefault(mid, {"message_id": mid, "role": _role(message), "payload": payload})
        for message, mid in assigned:
            message["id"] = mid
        return list(rows.values())

    @staticmethod
    def _snapshot_of(row: Any) -> StateSnapshot:
        return StateSnapshot(
            version=row.version,
            state=decode(row.state_data),
            meta={} if row.meta is None else decode(row.meta),
            created_at=_utc(row.created_at),  # type: ignore[arg-type]  # never NULL
        )

    @staticmethod
    def _encode_object(value: object, what: str) -> str:
        if not isinstance(value, dict):
            raise SerializationError(f"{what} must be a dict, not {type(value).__name__}")
        return encode(value, what)

    def _thread_info(self, row: Row[Any]) -> ThreadInfo:
        return ThreadInfo(
            thread_id=row.thread_id,
            user_id=row.user_id,
            name=None if row.name is None else decode(row.name),
            metadata={} if row.metadata is None else decode(row.metadata),
            created_at=_utc(row.created_at),
            updated_at=_utc(row.updated_at),
            version=row.version,
        )

    def _tool_call_id(self, value: object) -> str:
        result: str = check_id("tool_call_id", value)
        return result

    def _tool_execution(self, thread_id: Any, row: Row[Any]) -> ToolExecution:
        return ToolExecution(
            thread_id=thread_id,
            tool_call_id=row.tool_call_id,
            tool_name=row.tool_name,
            args=decode(row.args),
            status=row.status,
            result=None if row.result is None else decode(row.result),
            error=None if row.error is None else decode(row.error),
            attempts=row.attempts,
            started_at=_utc(row.started_at),  # type: ignore[arg-type]  # never NULL
            finished_at=_utc(row.finished_at),
            lease_expires_at=_utc(row.lease_expires_at),
        )

    @asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[AsyncConnection]:
        """A read transaction that sees one snapshot (PostgreSQL: REPEATABLE READ)."""
        async with self._connect() as conn:
            if self._dialect == "postgresql":
                await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                yield conn

    async def _delete_thread(self, conn: AsyncConnection, thread_id: Any) -> None:
        # Children first and explicitly: no reliance on ON DELETE CASCADE being enforced.
        t, *children = self._t
        for child in children:
            await conn.execute(delete(child).where(child.c.thread_id == thread_id))
        await conn.execute(delete(t).where(t.c.thread_id == thread_id))
