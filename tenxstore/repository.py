"""CheckpointRepository: the only module that builds SQL.

Every public method validates its input first (``ConfigError`` /
``SerializationError`` before any I/O), then runs ONE transaction and hands the
connection to helpers that never begin, commit or roll back. Statements are
SQLAlchemy Core on the declarative tables of :mod:`tenxstore.models`; rows never
leave this module, callers get the frozen values of :mod:`tenxstore.types`.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
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
from ._tools import run_tool_once
from .config import (
    IdType,
    RunIds,
    check_id,
    check_id_type,
    read_config,
    recorded_version,
    set_recorded_version,
)
from .errors import (
    ConfigError,
    ConnectionLost,
    ImportConflict,
    LockTimeout,
    SerializationError,
    StaleStateError,
    ThreadOwnershipError,
    ToolExecutionInProgress,
    ToolExecutionMismatch,
    ToolExecutionNotFound,
)
from .models import Tables, tables_for
from .serde import decode, encode, encode_state
from .types import MessageRecord, StateSnapshot, ThreadExport, ThreadInfo, ToolExecution

__all__ = ["CheckpointRepository"]


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


class CheckpointRepository:
    """Durable, versioned thread storage on PostgreSQL (asyncpg) or SQLite (aiosqlite).

    Args:
        url_or_engine: A database URL (``postgresql://``, ``sqlite:///path``, with or
            without the async driver) or an ``AsyncEngine`` the caller owns.
        schema: PostgreSQL schema holding the tables; ``None`` is the default schema.
        state_history_limit: State versions retained per thread (at least 1).
        enforce_user_isolation: Scope every call to ``config["user_id"]``.
        id_type: Column type of ``thread_id``: ``"string"``, ``"int"`` or ``"bigint"``.
        user_id_type: Column type of ``user_id``, likewise.
        engine_options: Keyword arguments for ``create_async_engine`` (pool size...).
        tool_lease_seconds: How long a tool-call claim is held before another worker
            may take it over.
        lock_timeout: Seconds a write waits for a thread's lock before it fails with
            :class:`LockTimeout` (PostgreSQL ``lock_timeout``, SQLite busy timeout,
            set on every connection tenxstore uses); ``None`` waits indefinitely.
        pool_mode: ``"transaction"`` when PostgreSQL is reached through a
            transaction-pooling PgBouncer: no prepared-statement caches and unique
            statement names (for engines tenxstore creates; pass
            ``transaction_pooling_args()`` as ``connect_args`` to your own), every
            statement inside a transaction, ``lock_timeout`` set per transaction.

    Raises:
        ConfigError: An argument is invalid (a ``ValueError``).
    """

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

    # -- lifecycle ---------------------------------------------------------------

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

    async def __aenter__(self) -> CheckpointRepository:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- transactions ------------------------------------------------------------

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

    # -- helpers -----------------------------------------------------------------

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

    # -- state -------------------------------------------------------------------

    async def aput_checkpoint(
        self,
        config: dict[str, Any],
        state: dict[str, Any],
        messages: Iterable[dict[str, Any]] = (),
        *,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Durably write a new state version and the messages not yet stored.

        One transaction: create the thread if absent, lock it, check its owner,
        compare the version the run recorded (if any) with the head version, insert
        the state at the next version, insert new messages (deduplicated by ``id``;
        a message without one gets one, written back into its dict), prune states
        beyond ``state_history_limit``, commit.

        Args:
            config: The run config; its recorded version is updated.
            state: A JSON object.
            messages: Dicts; each is stored once per ``id``, first content wins.
            meta: Optional JSON object stored beside the state (``StateSnapshot.meta``).

        Returns:
            The new version.

        Raises:
            StaleStateError: Another run committed since this run read the thread.
            ThreadOwnershipError: The thread belongs to another user.
            SerializationError: Something cannot be stored; nothing was written.
            ConfigError: The config is invalid.
        """
        ids = self._ids(config)
        expected = recorded_version(config)
        payload = encode_state(state)
        meta_text = None if meta is None else self._encode_object(meta, "meta")
        message_rows = self._encode_messages(messages)
        now = self._now()
        hot = self._hot
        async with self._write(ids.thread_id) as (conn, locked):
            head = await self._claim_thread(conn, ids, locked, now)
            if expected is not None and expected != head:
                raise StaleStateError(ids.thread_id, expected, head)
            version = head + 1
            if hot.write_all is not None:
                await conn.execute(
                    hot.write_all,
                    {
                        "b_thread": ids.thread_id,
                        "b_version": version,
                        "b_state": payload,
                        "b_meta": meta_text,
                        "b_now": now,
                        "b_ids": [r["message_id"] for r in message_rows],
                        "b_roles": [r["role"] for r in message_rows],
                        "b_payloads": [r["payload"] for r in message_rows],
                        "b_upto": version - self.state_history_limit,
                    },
                )
            else:
                await self._write_rows(conn, ids, version, payload, meta_text, message_rows, now)
        set_recorded_version(config, version)
        return version

    async def _write_rows(
        self,
        conn: AsyncConnection,
        ids: RunIds,
        version: int,
        payload: str,
        meta_text: str | None,
        message_rows: list[dict[str, Any]],
        now: datetime,
    ) -> None:
        """The state write as separate statements (SQLite, where a round trip is free)."""
        hot = self._hot
        await conn.execute(
            hot.insert_state,
            {
                "thread_id": ids.thread_id,
                "version": version,
                "state_data": payload,
                "meta": meta_text,
                "created_at": now,
            },
        )
        if message_rows:
            for row in message_rows:
                row["thread_id"], row["created_at"] = ids.thread_id, now
            await conn.execute(hot.insert_messages, message_rows)
        await conn.execute(
            hot.bump, {"b_thread": ids.thread_id, "b_version": version, "b_now": now}
        )
        if version > self.state_history_limit:
            await conn.execute(
                hot.prune,
                {"b_thread": ids.thread_id, "b_upto": version - self.state_history_limit},
            )

    async def aput_state(
        self, config: dict[str, Any], state: dict[str, Any], *, meta: dict[str, Any] | None = None
    ) -> int:
        """:meth:`aput_checkpoint` without messages."""
        return await self.aput_checkpoint(config, state, (), meta=meta)

    async def aget_state(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The latest durable state, or None; records its version (0 when none) in config."""
        ids = self._ids(config)
        if ids.isolated:
            rows = await self._fetch(
                self._hot.head_state_of_user, {"b_thread": ids.thread_id, "b_user": ids.user_id}
            )
        else:
            rows = await self._fetch(self._hot.head_state, {"b_thread": ids.thread_id})
        row = rows[0] if rows else None
        if row is None or row.state_data is None:
            set_recorded_version(config, 0 if row is None else row.version)
            return None
        set_recorded_version(config, row.version)
        state: dict[str, Any] = decode(row.state_data)
        return state

    async def aget_state_cache(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """Without a cache this is :meth:`aget_state`."""
        return await self.aget_state(config)

    async def aput_state_cache(
        self, config: dict[str, Any], state: dict[str, Any], version: int
    ) -> bool:
        """There is no cache here: validates the arguments and returns False."""
        self._ids(config)
        encode_state(state)
        _check_count("version", version)
        return False

    async def alist_states(
        self, config: dict[str, Any], limit: int | None = None
    ) -> list[StateSnapshot]:
        """The retained state versions, newest first."""
        ids = self._ids(config)
        limit = _check_limit(limit)
        s = self._t.states
        stmt = (
            select(s.c.version, s.c.state_data, s.c.meta, s.c.created_at)
            .where(s.c.thread_id == self._visible_thread(ids))
            .order_by(s.c.version.desc())
            .limit(limit)
        )
        return [self._snapshot_of(row) for row in await self._fetch(stmt)]

    @staticmethod
    def _snapshot_of(row: Any) -> StateSnapshot:
        return StateSnapshot(
            version=row.version,
            state=decode(row.state_data),
            meta={} if row.meta is None else decode(row.meta),
            created_at=_utc(row.created_at),  # type: ignore[arg-type]  # never NULL
        )

    async def aget_messages(
        self, config: dict[str, Any], limit: int | None = None, after_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Messages in insertion order.

        Args:
            config: The run config.
            limit: Keep the first ``limit`` messages of the range.
            after_id: Start after the message with this id (an unknown id gives ``[]``).
        """
        ids = self._ids(config)
        limit = _check_limit(limit)
        m = self._t.messages
        stmt = select(m.c.payload).where(m.c.thread_id == self._visible_thread(ids))
        if after_id is not None:
            after = (
                select(m.c.seq)
                .where(m.c.thread_id == ids.thread_id, m.c.message_id == _message_id(after_id))
                .scalar_subquery()
            )
            stmt = stmt.where(m.c.seq > after)
        stmt = stmt.order_by(m.c.seq).limit(limit)
        return [decode(row.payload) for row in await self._fetch(stmt)]

    # -- threads -----------------------------------------------------------------

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

    async def aput_thread(
        self,
        config: dict[str, Any],
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ThreadInfo:
        """Create or update the thread record; ``None`` leaves a field as it is.

        Never changes the state version.
        """
        ids = self._ids(config)
        values: dict[str, Any] = {}
        if name is not None:
            if not isinstance(name, str):
                raise SerializationError(f"name must be a str, not {type(name).__name__}")
            values["name"] = encode(name, "name")
        if metadata is not None:
            values["metadata"] = self._encode_object(metadata, "metadata")
        now = self._now()
        t = self._t.threads
        async with self._write(ids.thread_id) as (conn, locked):
            await self._claim_thread(conn, ids, locked, now)
            row = (
                await conn.execute(
                    update(t)
                    .where(t.c.thread_id == ids.thread_id)
                    .values(updated_at=now, **values)
                    .returning(*t.c)
                )
            ).one()
        return self._thread_info(row)

    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """The thread record, or None (also when another user owns it)."""
        ids = self._ids(config)
        t = self._t.threads
        rows = await self._fetch(select(*t.c).where(self._owned(ids)))
        return self._thread_info(rows[0]) if rows else None

    async def alist_threads(
        self, config: dict[str, Any], limit: int = 50, offset: int = 0
    ) -> list[ThreadInfo]:
        """The caller's threads, most recently updated first (all when isolation is off)."""
        ids = self._ids(config, need_thread=False)
        limit = _check_count("limit", limit)
        offset = _check_count("offset", offset)
        t = self._t.threads
        stmt = select(*t.c)
        if ids.isolated:
            stmt = stmt.where(t.c.user_id == ids.user_id)
        stmt = (
            stmt.order_by(t.c.updated_at.desc(), t.c.thread_id.desc()).limit(limit).offset(offset)
        )
        return [self._thread_info(row) for row in await self._fetch(stmt)]

    async def aclean_thread(self, config: dict[str, Any]) -> bool:
        """Delete the thread with its states, messages and tool executions.

        Returns:
            False when there was no such thread.

        Raises:
            ThreadOwnershipError: Another user owns the thread.
        """
        ids = self._ids(config)
        async with self._write(ids.thread_id) as (conn, locked):
            if locked is None:
                return False
            self._check_owner(ids, locked)
            await self._delete_thread(conn, ids.thread_id)
        return True

    # -- tool ledger -------------------------------------------------------------
    #
    # Every ledger change runs under the thread's row lock (PostgreSQL: FOR UPDATE on
    # the threads row; SQLite: BEGIN IMMEDIATE), the same lock that serializes state
    # writes, so "read the call's row, decide, write it" is atomic on both dialects
    # without relying on upsert semantics that differ between them.

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

    async def _call_row(
        self, conn: AsyncConnection, ids: RunIds, locked: Any, tool_call_id: str
    ) -> Row[Any]:
        """The call's row under the locked thread row, checking the owner first."""
        x = self._t.tool_executions
        row = None
        if locked is not None:
            self._check_owner(ids, locked)
            row = (
                await conn.execute(
                    select(*x.c).where(
                        x.c.thread_id == ids.thread_id, x.c.tool_call_id == tool_call_id
                    )
                )
            ).first()
        if row is None:
            raise ToolExecutionNotFound(
                f"tool call {tool_call_id!r} of thread {ids.thread_id!r} was never claimed"
            )
        return row

    async def abegin_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, tool_name: str, args: dict[str, Any]
    ) -> ToolExecution:
        """Claim a tool call.

        Of many workers racing on one call exactly one gets ``status="started"``. A call
        that already succeeded returns its stored record (do not run it again). A failed
        call, or a claim whose lease expired, is claimed again with ``attempts`` + 1.
        A claim on a thread that does not exist creates it for the caller.

        Raises:
            ToolExecutionInProgress: Another worker holds a live claim.
            ToolExecutionMismatch: The id was used for another tool name or arguments.
            ThreadOwnershipError: Another user owns the thread.
        """
        ids = self._ids(config)
        call_id = self._tool_call_id(tool_call_id)
        tool_name = check_id("tool_name", tool_name)
        args_text = self._encode_object(args, "args")
        now = self._now()
        x = self._t.tool_executions
        async with self._write(ids.thread_id) as (conn, locked):
            await self._claim_thread(conn, ids, locked, now)
            row = (
                await conn.execute(
                    select(*x.c).where(x.c.thread_id == ids.thread_id, x.c.tool_call_id == call_id)
                )
            ).first()
            claim = {
                "status": "started",
                "result": None,
                "error": None,
                "lease_expires_at": now + self._lease,
                "started_at": now,
                "finished_at": None,
            }
            if row is None:
                await conn.execute(
                    insert(x).values(
                        thread_id=ids.thread_id,
                        tool_call_id=call_id,
                        tool_name=tool_name,
                        args=args_text,
                        attempts=1,
                        **claim,
                    )
                )
                row = (
                    await conn.execute(
                        select(*x.c).where(
                            x.c.thread_id == ids.thread_id, x.c.tool_call_id == call_id
                        )
                    )
                ).one()
                return self._tool_execution(ids.thread_id, row)
            if row.tool_name != tool_name or decode(row.args) != decode(args_text):
                raise ToolExecutionMismatch(
                    f"tool call {call_id!r} of thread {ids.thread_id!r} was made as "
                    f"{row.tool_name!r} with {decode(row.args)!r}, "
                    f"not {tool_name!r} with {decode(args_text)!r}"
                )
            if row.status == "succeeded":
                return self._tool_execution(ids.thread_id, row)
            lease = _utc(row.lease_expires_at)
            if row.status == "started" and lease is not None and lease > now:
                raise ToolExecutionInProgress(ids.thread_id, call_id, lease)
            row = (
                await conn.execute(
                    update(x)
                    .where(x.c.thread_id == ids.thread_id, x.c.tool_call_id == call_id)
                    .values(attempts=x.c.attempts + 1, **claim)
                    .returning(*x.c)
                )
            ).one()
        return self._tool_execution(ids.thread_id, row)

    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any
    ) -> ToolExecution:
        """Record a tool call's result; the first success wins.

        Raises:
            ToolExecutionNotFound: The call was never claimed.
            SerializationError: ``result`` is not JSON; nothing was written.
        """
        ids = self._ids(config)
        call_id = self._tool_call_id(tool_call_id)
        result_text = encode(result, "result")
        return await self._finish(ids, call_id, "succeeded", result=result_text, error=None)

    async def afail_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, error: str | BaseException
    ) -> ToolExecution:
        """Record a tool call's failure (a succeeded call keeps its success).

        Raises:
            ToolExecutionNotFound: The call was never claimed.
        """
        ids = self._ids(config)
        call_id = self._tool_call_id(tool_call_id)
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}"
        if not isinstance(error, str):
            raise ConfigError(f"error must be a str or an exception, not {type(error).__name__}")
        return await self._finish(ids, call_id, "failed", result=None, error=encode(error))

    async def _finish(
        self, ids: RunIds, call_id: str, status: str, *, result: str | None, error: str | None
    ) -> ToolExecution:
        x = self._t.tool_executions
        async with self._write(ids.thread_id) as (conn, locked):
            row = await self._call_row(conn, ids, locked, call_id)
            if row.status != "succeeded":
                row = (
                    await conn.execute(
                        update(x)
                        .where(x.c.thread_id == ids.thread_id, x.c.tool_call_id == call_id)
                        .values(
                            status=status,
                            result=result,
                            error=error,
                            lease_expires_at=None,
                            finished_at=self._now(),
                        )
                        .returning(*x.c)
                    )
                ).one()
        return self._tool_execution(ids.thread_id, row)

    async def aget_tool_execution(
        self, config: dict[str, Any], tool_call_id: str
    ) -> ToolExecution | None:
        """The ledger record of a tool call, or None (also for another user's thread)."""
        ids = self._ids(config)
        call_id = self._tool_call_id(tool_call_id)
        x = self._t.tool_executions
        rows = await self._fetch(
            select(*x.c).where(
                x.c.thread_id == self._visible_thread(ids), x.c.tool_call_id == call_id
            )
        )
        return self._tool_execution(ids.thread_id, rows[0]) if rows else None

    async def arun_tool_once(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        tool_name: str,
        args: dict[str, Any],
        fn: Callable[..., Any],
    ) -> Any:
        """Run ``fn(**args)`` at most once per live claim; replay the stored result after.

        Once one run has succeeded, every later call — in any process, after any
        restart — returns the stored result without calling ``fn``. If ``fn`` raises,
        the failure is recorded and the exception re-raised; the next call claims the
        tool again. Across an expired lease the body may run again (at-least-once).

        Returns:
            The recorded result (as stored: JSON, so tuples come back as lists).

        Raises:
            ToolExecutionInProgress: Another worker is running this call now.
            SerializationError: ``fn`` returned something that is not JSON (recorded
                as a failure).
        """
        return await run_tool_once(self, config, tool_call_id, tool_name, args, fn)

    # -- whole threads: listing, export, import ----------------------------------
    #
    # Operator calls: no run config and no isolation. The CLI's export, import and
    # copy are built on them.

    async def alist_tool_executions(self, config: dict[str, Any]) -> list[ToolExecution]:
        """Every tool call of the thread, in the order they were first claimed."""
        ids = self._ids(config)
        x = self._t.tool_executions
        rows = await self._fetch(
            select(*x.c)
            .where(x.c.thread_id == self._visible_thread(ids))
            .order_by(x.c.started_at, x.c.tool_call_id)
        )
        return [self._tool_execution(ids.thread_id, row) for row in rows]

    async def aiter_threads(self, batch: int = 500) -> AsyncIterator[ThreadInfo]:
        """Every thread of every user, in ``thread_id`` order, read ``batch`` at a time."""
        batch = _check_count("batch", batch) or 1
        t = self._t.threads
        after: Any = None
        while True:
            stmt = select(*t.c).order_by(t.c.thread_id).limit(batch)
            if after is not None:
                stmt = stmt.where(t.c.thread_id > after)
            rows = await self._fetch(stmt)
            for row in rows:
                yield self._thread_info(row)
            if len(rows) < batch:
                return
            after = rows[-1].thread_id

    @asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[AsyncConnection]:
        """A read transaction that sees one snapshot (PostgreSQL: REPEATABLE READ)."""
        async with self._connect() as conn:
            if self._dialect == "postgresql":
                await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                yield conn

    async def _export(self, conn: AsyncConnection, thread_id: Any) -> ThreadExport | None:
        t, s, m, x = self._t[:4]
        row = (await conn.execute(select(*t.c).where(t.c.thread_id == thread_id))).first()
        if row is None:
            return None
        states = await conn.execute(
            select(s.c.version, s.c.state_data, s.c.meta, s.c.created_at)
            .where(s.c.thread_id == thread_id)
            .order_by(s.c.version.desc())
        )
        messages = await conn.execute(
            select(m.c.payload, m.c.created_at).where(m.c.thread_id == thread_id).order_by(m.c.seq)
        )
        calls = await conn.execute(
            select(*x.c)
            .where(x.c.thread_id == thread_id)
            .order_by(x.c.started_at, x.c.tool_call_id)
        )
        return ThreadExport(
            thread=self._thread_info(row),
            states=tuple(self._snapshot_of(r) for r in states),
            messages=tuple(
                MessageRecord(decode(r.payload), _utc(r.created_at))  # type: ignore[arg-type]
                for r in messages
            ),
            tool_executions=tuple(self._tool_execution(thread_id, r) for r in calls),
        )

    async def aexport_thread(self, config: dict[str, Any]) -> ThreadExport | None:
        """Everything stored of one thread, read in one snapshot; None when absent
        (or another user's while isolation applies)."""
        ids = self._ids(config)
        async with self._snapshot() as conn:
            export = await self._export(conn, ids.thread_id)
        if export is None or (ids.isolated and export.thread.user_id != ids.user_id):
            return None
        return export

    async def aimport_thread(self, export: ThreadExport, *, on_conflict: str = "fail") -> str:
        """Write an exported thread back, in one transaction.

        Importing what is already there changes nothing. A thread that exists with
        other content is a conflict: ``on_conflict="fail"`` raises
        :class:`ImportConflict`, ``"skip"`` leaves it, ``"replace"`` deletes it first.

        Returns:
            ``"created"``, ``"unchanged"``, ``"skipped"`` or ``"replaced"``.

        Raises:
            ImportConflict: The thread exists with other content (``"fail"``).
            SerializationError: Something in the export cannot be stored.
            ConfigError: Bad ids or ``on_conflict``.
        """
        if on_conflict not in ("fail", "skip", "replace"):
            raise ConfigError(f"on_conflict must be fail, skip or replace, not {on_conflict!r}")
        rows = self._import_rows(export)
        thread_id = rows["thread"]["thread_id"]
        async with self._write(thread_id) as (conn, locked):
            outcome = "created"
            if locked is not None:
                existing = await self._export(conn, thread_id)
                if existing is not None and self._import_rows(existing) == rows:
                    return "unchanged"
                if on_conflict == "skip":
                    return "skipped"
                if on_conflict == "fail":
                    raise ImportConflict(
                        f"thread {thread_id!r} exists with other content; "
                        "import with on_conflict='replace' or 'skip'"
                    )
                await self._delete_thread(conn, thread_id)
                outcome = "replaced"
            t, s, m, x = self._t[:4]
            await conn.execute(insert(t), [rows["thread"]])
            if rows["states"]:
                await conn.execute(insert(s), rows["states"])
            if rows["messages"]:
                await conn.execute(insert(m), rows["messages"])
            if rows["tool_executions"]:
                await conn.execute(insert(x), rows["tool_executions"])
        return outcome

    def _import_rows(self, export: ThreadExport) -> dict[str, Any]:
        """The rows an export becomes; validated and encoded before any I/O."""
        if not isinstance(export, ThreadExport):
            raise ConfigError(f"expected a ThreadExport, not {type(export).__name__}")
        info = export.thread
        thread_id = check_id("thread_id", info.thread_id, self._id_type)
        user_id = (
            None if info.user_id is None else check_id("user_id", info.user_id, self._user_id_type)
        )
        versions = [snapshot.version for snapshot in export.states]
        if len(set(versions)) != len(versions) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in versions
        ):
            raise ConfigError("state versions must be distinct positive ints")
        if versions and max(versions) != info.version:
            raise ConfigError(
                f"the newest state is version {max(versions)}, the thread is at {info.version}"
            )
        when = [info.created_at, info.updated_at]
        if any(not isinstance(w, datetime) for w in when):
            raise ConfigError("a thread needs created_at and updated_at")
        message_ids = [_message_id(r.message.get("id")) for r in export.messages]
        if len(set(message_ids)) != len(message_ids):
            raise ConfigError("message ids must be unique within a thread")
        return {
            "thread": {
                "thread_id": thread_id,
                "user_id": user_id,
                "name": None if info.name is None else encode(info.name, "name"),
                "metadata": self._encode_object(info.metadata, "metadata")
                if info.metadata
                else None,
                "version": info.version,
                "created_at": info.created_at,
                "updated_at": info.updated_at,
            },
            "states": [
                {
                    "thread_id": thread_id,
                    "version": snapshot.version,
                    "state_data": encode_state(snapshot.state),
                    "meta": self._encode_object(snapshot.meta, "meta") if snapshot.meta else None,
                    "created_at": snapshot.created_at,
                }
                for snapshot in sorted(export.states, key=lambda snapshot: snapshot.version)
            ],
            "messages": [
                {
                    "thread_id": thread_id,
                    "message_id": mid,
                    "role": r.message.get("role")
                    if isinstance(r.message.get("role"), str)
                    else None,
                    "payload": self._encode_object(r.message, "message"),
                    "created_at": r.created_at,
                }
                for mid, r in zip(message_ids, export.messages, strict=True)
            ],
            "tool_executions": [
                {
                    "thread_id": thread_id,
                    "tool_call_id": self._tool_call_id(call.tool_call_id),
                    "tool_name": check_id("tool_name", call.tool_name),
                    "args": self._encode_object(call.args, "args"),
                    "status": call.status,
                    "result": None if call.result is None else encode(call.result, "result"),
                    "error": None if call.error is None else encode(call.error, "error"),
                    "attempts": call.attempts,
                    "lease_expires_at": call.lease_expires_at,
                    "started_at": call.started_at,
                    "finished_at": call.finished_at,
                }
                for call in export.tool_executions
            ],
        }

    async def _delete_thread(self, conn: AsyncConnection, thread_id: Any) -> None:
        # Children first and explicitly: no reliance on ON DELETE CASCADE being enforced.
        t, *children = self._t
        for child in children:
            await conn.execute(delete(child).where(child.c.thread_id == thread_id))
        await conn.execute(delete(t).where(t.c.thread_id == thread_id))

    # -- LangGraph checkpoints (tenxstore.langgraph) ------------------------------
    #
    # The adapter's own tables, under the same thread row lock and ownership rules
    # as everything else. Values arrive serialized by LangGraph's serde.

    async def _lg_put(
        self,
        config: dict[str, Any],
        ns: str,
        checkpoint_id: str,
        parent_id: str | None,
        typed: tuple[str, bytes],
        metadata: str,
        history_limit: int | None,
    ) -> None:
        """Store one checkpoint. With a parent, that parent must be the namespace's
        newest checkpoint: a second writer from the same parent gets StaleStateError."""
        ids = self._ids(config)
        c, w = self._t.lg_checkpoints, self._t.lg_writes
        here = and_(c.c.thread_id == ids.thread_id, c.c.checkpoint_ns == ns)
        now = self._now()
        async with self._write(ids.thread_id) as (conn, locked):
            await self._claim_thread(conn, ids, locked, now)
            newest = (
                await conn.execute(
                    select(c.c.checkpoint_id)
                    .where(here)
                    .order_by(c.c.checkpoint_id.desc())
                    .limit(1)
                )
            ).scalar()
            if parent_id is not None and newest is not None and newest != parent_id:
                raise StaleStateError(ids.thread_id, parent_id, newest)
            await conn.execute(delete(c).where(here, c.c.checkpoint_id == checkpoint_id))
            await conn.execute(
                insert(c).values(
                    thread_id=ids.thread_id,
                    checkpoint_ns=ns,
                    checkpoint_id=checkpoint_id,
                    parent_checkpoint_id=parent_id,
                    type=typed[0],
                    checkpoint=typed[1],
                    metadata=metadata,
                    created_at=now,
                )
            )
            if history_limit is not None:
                beyond = (
                    select(c.c.checkpoint_id)
                    .where(here)
                    .order_by(c.c.checkpoint_id.desc())
                    .offset(history_limit)
                )
                doomed = (await conn.execute(beyond)).scalars().all()
                if doomed:
                    await conn.execute(delete(c).where(here, c.c.checkpoint_id.in_(doomed)))
                    await conn.execute(
                        delete(w).where(
                            w.c.thread_id == ids.thread_id,
                            w.c.checkpoint_ns == ns,
                            w.c.checkpoint_id.in_(doomed),
                        )
                    )

    async def _lg_put_writes(
        self,
        config: dict[str, Any],
        ns: str,
        checkpoint_id: str,
        rows: list[dict[str, Any]],
    ) -> None:
        """Store a task's writes: a write already stored is kept, except the special
        channels (negative ``idx``: errors, interrupts...), whose latest write wins."""
        ids = self._ids(config)
        w = self._t.lg_writes
        now = self._now()
        async with self._write(ids.thread_id) as (conn, locked):
            await self._claim_thread(conn, ids, locked, now)
            for row in rows:
                key = and_(
                    w.c.thread_id == ids.thread_id,
                    w.c.checkpoint_ns == ns,
                    w.c.checkpoint_id == checkpoint_id,
                    w.c.task_id == row["task_id"],
                    w.c.idx == row["idx"],
                )
                if row["idx"] < 0:
                    await conn.execute(delete(w).where(key))
                exists = (await conn.execute(select(w.c.idx).where(key))).first()
                if exists is None:
                    await conn.execute(
                        insert(w).values(
                            thread_id=ids.thread_id,
                            checkpoint_ns=ns,
                            checkpoint_id=checkpoint_id,
                            **row,
                        )
                    )

    async def _lg_rows(
        self,
        config: dict[str, Any] | None,
        ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None,
    ) -> list[tuple[Any, list[Any]]]:
        """Checkpoints newest first (with their writes), narrowed as asked."""
        c, w = self._t.lg_checkpoints, self._t.lg_writes
        stmt = select(*c.c)
        if config is not None:
            ids = self._ids(config)
            stmt = stmt.where(c.c.thread_id == self._visible_thread(ids))
        if ns is not None:
            stmt = stmt.where(c.c.checkpoint_ns == ns)
        if checkpoint_id is not None:
            stmt = stmt.where(c.c.checkpoint_id == checkpoint_id)
        if before is not None:
            stmt = stmt.where(c.c.checkpoint_id < before)
        stmt = stmt.order_by(c.c.thread_id, c.c.checkpoint_ns, c.c.checkpoint_id.desc())
        if config is not None:
            stmt = stmt.order_by(None).order_by(c.c.checkpoint_id.desc(), c.c.checkpoint_ns)
        if limit is not None:
            stmt = stmt.limit(limit)
        async with self._snapshot() as conn:
            rows = (await conn.execute(stmt)).all()
            result = []
            for row in rows:
                writes = (
                    await conn.execute(
                        select(w.c.task_id, w.c.channel, w.c.type, w.c.value)
                        .where(
                            w.c.thread_id == row.thread_id,
                            w.c.checkpoint_ns == row.checkpoint_ns,
                            w.c.checkpoint_id == row.checkpoint_id,
                        )
                        .order_by(w.c.task_path, w.c.task_id, w.c.idx)
                    )
                ).all()
                result.append((row, list(writes)))
        return result

    async def _lg_prune(self, thread_ids: Iterable[Any], keep_latest: bool) -> None:
        """Keep only each namespace's newest checkpoint (with its writes), or nothing."""
        c, w = self._t.lg_checkpoints, self._t.lg_writes
        for raw_id in thread_ids:
            thread_id = check_id("thread_id", raw_id, self._id_type)
            async with self._write(thread_id) as (conn, locked):
                if locked is None:
                    continue
                if not keep_latest:
                    await conn.execute(delete(w).where(w.c.thread_id == thread_id))
                    await conn.execute(delete(c).where(c.c.thread_id == thread_id))
                    continue
                newest = (
                    select(c.c.checkpoint_ns, func.max(c.c.checkpoint_id).label("newest"))
                    .where(c.c.thread_id == thread_id)
                    .group_by(c.c.checkpoint_ns)
                )
                keep = {(r.checkpoint_ns, r.newest) for r in await conn.execute(newest)}
                rows = await conn.execute(
                    select(c.c.checkpoint_ns, c.c.checkpoint_id).where(c.c.thread_id == thread_id)
                )
                for ns, checkpoint_id in [tuple(r) for r in rows if tuple(r) not in keep]:
                    for table in (w, c):
                        await conn.execute(
                            delete(table).where(
                                table.c.thread_id == thread_id,
                                table.c.checkpoint_ns == ns,
                                table.c.checkpoint_id == checkpoint_id,
                            )
                        )

    async def _lg_copy(self, source: Any, target: Any) -> None:
        """Copy a thread's checkpoints and writes to another thread (owned alike)."""
        c, w = self._t.lg_checkpoints, self._t.lg_writes
        source = check_id("thread_id", source, self._id_type)
        target = check_id("thread_id", target, self._id_type)
        async with self._snapshot() as conn:
            owner = (
                await conn.execute(
                    select(self._t.threads.c.user_id).where(self._t.threads.c.thread_id == source)
                )
            ).first()
            checkpoints = [
                dict(r._mapping)
                for r in await conn.execute(select(*c.c).where(c.c.thread_id == source))
            ]
            writes = [
                dict(r._mapping)
                for r in await conn.execute(select(*w.c).where(w.c.thread_id == source))
            ]
        if owner is None or not checkpoints:
            return
        ids = RunIds(thread_id=target, user_id=owner.user_id, isolated=False)
        async with self._write(target) as (conn, locked):
            await self._claim_thread(conn, ids, locked, self._now())
            await conn.execute(delete(w).where(w.c.thread_id == target))
            await conn.execute(delete(c).where(c.c.thread_id == target))
            await conn.execute(insert(c), [{**r, "thread_id": target} for r in checkpoints])
            if writes:
                await conn.execute(insert(w), [{**r, "thread_id": target} for r in writes])
