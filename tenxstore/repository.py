"""CheckpointRepository: durable, versioned thread storage; the one public class.

It is chosen by URL and holds what its parts share in a :class:`~tenxstore.store.Store`:
the backend of its database mode (:mod:`tenxstore.backends`), the statements built
once (:mod:`tenxstore.statements`) and its settings. The state and thread methods of
the product's contract live here; the tool ledger, whole-thread export/import and
the LangGraph tables are collaborators it holds (``.ledger``, ``.exports``,
``.langgraph``) and whose methods it exposes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import timedelta, timezone
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import migrate
from .backends import DEFAULT_LOCK_TIMEOUT_S, POOL_MODES, Backend, PoolMode, open_backend
from .backends.records import HeadWrite
from .backends.retry import RetryPolicy
from .boundary import guard, guard_iter
from .config import record_read, recorded_incarnation, recorded_version
from .crypto import MESSAGE, META, METADATA, NAME, STATE, KeyRing, Life, life_of
from .errors import ConfigError, SerializationError, StaleStateError, TenxStoreError
from .exports import ThreadExports
from .langgraph.tables import LangGraphTables
from .langgraph.values import AllowedTypes
from .ledger import ToolLedger
from .lifecycle import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SAMPLE,
    BatchHook,
    DeleteResult,
    Lifecycle,
    ProgressHook,
)
from .models import tables_for
from .serde import encode, encode_state
from .statements import Statements, snapshot_of, thread_info
from .stats import Stats, StoreStats
from .store import Settings, Store, keyless_refusal
from .telemetry import traced
from .types import (
    Commit,
    Health,
    Imported,
    ImportOutcome,
    OnConflict,
    StateSnapshot,
    ThreadExport,
    ThreadInfo,
    ToolExecution,
)
from .validate import (
    IdType,
    check_bool,
    check_choice,
    check_count,
    check_id,
    check_id_type,
    check_limit,
    check_positive_number,
    check_schema_name,
    is_int,
)

__all__ = ["CheckpointRepository"]


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
            :func:`tenxstore.transaction_pooling_args` as ``connect_args`` to your own),
            every statement inside a transaction, ``lock_timeout`` set per transaction.
        keys: The :class:`~tenxstore.crypto.KeyRing` that seals every payload
            (AES-256-GCM; see docs/encryption.md). ``None`` reads ``TENXSTORE_KEYS``;
            when that is unset too, payloads are stored in clear.
        retry: How often, and after what wait, work that provably never took effect
            is tried again (a connection that broke while it opened, a pooled one
            found dead before anything was sent, a read): a
            :class:`~tenxstore.RetryPolicy`; default two tries, no wait. A write that
            reached the server is never sent again.

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
        id_type: IdType = "string",
        user_id_type: IdType = "string",
        engine_options: dict[str, Any] | None = None,
        tool_lease_seconds: float = 900,
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT_S,
        pool_mode: PoolMode = "session",
        keys: KeyRing | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        pool_mode = check_choice("pool_mode", pool_mode, POOL_MODES)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(f"retry must be a tenxstore.RetryPolicy, not {type(retry).__name__}")
        if keys is None:
            keys = KeyRing.from_env()
        elif not isinstance(keys, KeyRing):
            raise ConfigError(f"keys must be a tenxstore.KeyRing, not {type(keys).__name__}")
        if lock_timeout is not None:
            lock_timeout = check_positive_number("lock_timeout", lock_timeout)
        if not is_int(state_history_limit):
            raise ConfigError(f"state_history_limit must be an int, not {state_history_limit!r}")
        if state_history_limit < 1:
            raise ConfigError(f"state_history_limit must be at least 1, not {state_history_limit}")
        settings = Settings(
            enforce_user_isolation=check_bool("enforce_user_isolation", enforce_user_isolation),
            id_type=check_id_type("id_type", id_type),
            user_id_type=check_id_type("user_id_type", user_id_type),
            state_history_limit=state_history_limit,
            tool_lease=timedelta(
                seconds=check_positive_number("tool_lease_seconds", tool_lease_seconds)
            ),
            keys=keys,
        )
        schema = check_schema_name(schema)
        if engine_options is not None and not isinstance(engine_options, dict):
            raise ConfigError("engine_options must be a dict")
        backend = open_backend(
            url_or_engine,
            engine_options=engine_options,
            lock_timeout=lock_timeout,
            pool_mode=pool_mode,
        )
        if retry is not None:
            backend.retry = retry
        if schema is not None and not backend.supports_schema:
            raise ConfigError(f"schema= is a PostgreSQL option; {backend.dialect} has no schemas")
        tables = tables_for(settings.id_type, settings.user_id_type, schema)
        self._store = store = Store(backend, Statements(tables, backend), settings, schema)
        backend.create_schema_on_first_use(
            self._migrate_on, template=(settings.id_type, settings.user_id_type)
        )
        self.schema = schema
        self.pool_mode = pool_mode
        self.lock_timeout = lock_timeout
        self.state_history_limit = state_history_limit
        self.enforce_user_isolation = settings.enforce_user_isolation
        self.tool_lease_seconds = settings.tool_lease.total_seconds()
        self.keys = keys
        """The key ring payloads are sealed with, or None (stored in clear)."""
        self.ledger = ToolLedger(store)
        """The tool ledger (:class:`~tenxstore.ledger.ToolLedger`)."""
        self.exports = ThreadExports(store)
        """Whole-thread export and import (:class:`~tenxstore.exports.ThreadExports`)."""
        self.langgraph = LangGraphTables(store)
        """LangGraph's tables (:class:`~tenxstore.langgraph.tables.LangGraphTables`)."""
        self.lifecycle = Lifecycle(store)
        """Erasing users and retiring idle threads (:class:`~tenxstore.lifecycle.Lifecycle`)."""
        self.stats = Stats(store)
        """What the store holds (:class:`~tenxstore.stats.Stats`)."""

    # -- identity and lifecycle --------------------------------------------------------

    @property
    def engine(self) -> AsyncEngine:
        """The engine."""
        return self._store.backend.engine

    @property
    def backend(self) -> Backend:
        """The backend of this database mode (``backend.name``: ``"postgresql"``,
        ``"pgbouncer"``, ``"sqlite"`` or ``"memory"``)."""
        return self._store.backend

    @property
    def id_type(self) -> IdType:
        """Type of ``thread_id``: ``"string"``, ``"int"`` or ``"bigint"``."""
        return self._store.settings.id_type

    @property
    def user_id_type(self) -> IdType:
        """Type of ``user_id``."""
        return self._store.settings.user_id_type

    @property
    def dialect(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        return self._store.backend.dialect

    async def _migrate_on(self, connection: AsyncConnection) -> None:
        store_id = await migrate.upgrade_connection(
            connection, schema=self.schema, id_type=self.id_type, user_id_type=self.user_id_type
        )
        self._store.ready(store_id)

    @traced()
    async def asetup(self) -> None:
        """Migrate the schema to head (creating the PostgreSQL schema when absent).

        Idempotent, and safe when many processes call it at once.

        Raises:
            ConfigError: The schema was created with other ``id_type`` /
                ``user_id_type`` values.
        """
        store_id = await migrate.upgrade(
            self._store.backend,
            schema=self.schema,
            id_type=self.id_type,
            user_id_type=self.user_id_type,
        )
        self._store.ready(store_id)

    @traced()
    async def astore_id(self) -> str:
        """The id that names this database and schema: the random id its migrations
        wrote, joined with what tells the database apart from a copy of it (the SQLite
        file's inode; PostgreSQL's system identifier and the database's and schema's
        oids), so a copied file, a template or a restore is another store.

        Checked once per process at first use, like the schema revision; a cache uses
        it as its default key namespace, so two stores sharing one Redis never share
        an entry while one store reached two ways (directly, through PgBouncer, by two
        host names, by two paths to one file) always does.

        Raises:
            SchemaNotReady: The schema was never set up, or is behind this release.
        """
        return await self._store.ensure_ready()

    def setup(self) -> None:
        """Synchronous :meth:`asetup`; works with or without a running event loop.

        The migration runs on a private event loop with its own connections, closed
        before this returns, so the checkpointer is then usable from any loop.

        Raises:
            ConfigError: The engine borrows from an asyncpg pool, which belongs to
                its own event loop: call ``await asetup()`` there instead.
        """
        backend = self._store.backend
        private = backend.setup_engine()

        async def run() -> None:
            if private is None:  # the database is the backend's one connection
                await self.asetup()
                return
            try:
                try:
                    connection = await private.connect().start()
                except (DBAPIError, OSError, asyncio.TimeoutError) as exc:
                    raise backend.opening_failed(exc) from exc
                try:
                    await backend.begin_write(connection)
                    await self._migrate_on(connection)
                finally:
                    await connection.close()
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

    @traced()
    async def acheck(self) -> Health:
        """Check the database: reachable, and its schema at the revision this release
        needs. Never raises for what it finds; see :class:`Health`."""
        store = self._store
        head = migrate.head_revision()
        sealed = None
        try:
            async with store.backend.connect() as conn:
                revision, _ = await migrate.read_schema(conn, self.schema)
                if revision == head:  # the marker's column is there
                    found = await conn.execute(select(store.tables.store.c.sealed_since))
                    sealed = found.scalar()
        except TenxStoreError as exc:
            return Health(store.where(), str(exc), None, head)
        except DBAPIError as exc:
            return Health(store.where(), f"{type(exc.orig).__name__}: {exc.orig}", None, head)
        since = None if sealed is None else sealed.replace(tzinfo=sealed.tzinfo or timezone.utc)
        refused = keyless_refusal(store.where(), since) if self.keys is None else None
        return Health(
            store.where(),
            None,
            revision,
            head,
            sealed_since=since,
            encryption_error=None if refused is None else str(refused),
        )

    @guard
    async def aclose(self) -> None:
        """Close the connection pool if this repository created it."""
        await self._store.backend.aclose()

    async def __aenter__(self) -> CheckpointRepository:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- state -----------------------------------------------------------------------

    @traced(write=True)
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
        compare the version the run recorded (if any) with the head version — and the
        incarnation recorded beside it with the thread's, so a run that read a thread
        since deleted or replaced never writes into its successor —, insert the state
        at the next version, insert new messages (deduplicated by ``id``; a message
        without one gets one, written back into its dict), prune states beyond
        ``state_history_limit``, commit.

        Args:
            config: The run config; its recorded version and incarnation are updated.
            state: A JSON object.
            messages: Dicts; each is stored once per ``id``, first content wins.
            meta: Optional JSON object stored beside the state (``StateSnapshot.meta``).

        Returns:
            The new version.

        Raises:
            StaleStateError: Another run committed since this run read the thread, or
                the thread was deleted or replaced since (``replaced`` is then True).
            ThreadOwnershipError: The thread belongs to another user.
            SerializationError: Something cannot be stored; nothing was written.
            ConfigError: The config is invalid.
        """
        return (await self.acommit(config, state, messages, meta=meta)).version

    @traced(write=True)
    async def acommit(
        self,
        config: dict[str, Any],
        state: dict[str, Any],
        messages: Iterable[dict[str, Any]] = (),
        *,
        meta: dict[str, Any] | None = None,
    ) -> Commit:
        """:meth:`aput_checkpoint`, returning what it did: the thread's owner and
        incarnation beside the new version (what a cache decorator needs)."""
        store = self._store
        ids = store.ids(config)
        expected = recorded_version(config)
        expected_life = recorded_incarnation(config)
        payload = encode_state(state)
        meta_text = None if meta is None else store.encode_object(meta, "meta")
        message_rows = store.encode_messages(messages)
        # Sealed values name the thread's life (incarnation and owner). Before any I/O
        # that is known only as the life the run recorded, owned by the caller: sealed
        # for it, the write may commit in one step only in that life (the step's
        # compare-and-swap checks both). Otherwise they are sealed under the lock, for
        # the row found or created there: never for a life they are not stored in.
        presumed = None if expected_life is None else Life(expected_life, ids.user_id)
        sealed = (payload, meta_text, message_rows)  # as stored; the cache gets the plaintext
        if store.keys is not None and presumed is not None:
            sealed = self._seal_write(ids.thread_id, payload, meta_text, message_rows, presumed)
        now = store.now()
        if store.keys is None or presumed is not None:
            head = await store.commit_head(
                HeadWrite(
                    ids.thread_id,
                    ids.user_id if store.keys is not None or ids.isolated else None,
                    store.keys is not None or ids.isolated,
                    expected,
                    expected_life,
                    sealed[0],
                    sealed[1],
                    now,
                    sealed[2],
                    self.state_history_limit,
                )
            )
            if head is not None:  # the common case, in one step
                record_read(config, head.version, head.incarnation)
                return Commit(ids.thread_id, head.user_id, head.incarnation, head.version, payload)
        # The thread is absent, another user's, or not at the version the run read (or
        # this mode has no one-step write): lock it, create it or raise the precise error.
        async with store.write(ids.thread_id) as (conn, locked):
            row = await store.claim_thread(conn, ids, locked, now)
            version, life = row.version, row.incarnation
            replaced = expected_life is not None and expected_life != life
            if expected is not None and (expected != version or replaced):
                raise StaleStateError(ids.thread_id, expected, version, replaced)
            if store.keys is not None and life_of(row) != presumed:
                bound = life_of(row)  # the life found, or made, under the lock
                sealed = self._seal_write(ids.thread_id, payload, meta_text, message_rows, bound)
            version += 1
            upto = version - self.state_history_limit
            await store.backend.write_state(
                conn,
                store.sql,
                {
                    "b_thread": ids.thread_id,
                    "b_version": version,
                    "b_state": sealed[0],
                    "b_meta": sealed[1],
                    "b_now": now,
                    "b_upto": upto,
                    "messages": sealed[2],
                },
                prune=upto > 0,
            )
        record_read(config, version, life)
        return Commit(ids.thread_id, row.user_id, life, version, payload)

    def _seal_write(
        self,
        thread_id: Any,
        state: str,
        meta: str | None,
        messages: list[dict[str, Any]],
        life: Life,
    ) -> tuple[str, str | None, list[dict[str, Any]]]:
        """A state write's state, meta and message rows sealed for the thread's ``life``."""
        store = self._store
        return (
            store.seal(state, thread_id, STATE, life),
            None if meta is None else store.seal(meta, thread_id, META, life),
            store.seal_messages(messages, thread_id, life),
        )

    @traced(write=True)
    async def aput_state(
        self, config: dict[str, Any], state: dict[str, Any], *, meta: dict[str, Any] | None = None
    ) -> int:
        """:meth:`aput_checkpoint` without messages."""
        return await self.aput_checkpoint(config, state, (), meta=meta)

    @traced()
    async def aget_state(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The latest durable state, or None; records its version (0 when none) in config."""
        ids = self._store.ids(config)
        head = await self._store.read_head(ids)
        if head is None:
            record_read(config, 0, None)
            return None
        record_read(config, head.version, head.incarnation)
        if head.state is None:
            return None
        life = Life(head.incarnation, head.user_id)
        state: dict[str, Any] = self._store.load(head.state, ids.thread_id, STATE, life)
        return state

    @traced()
    async def aget_state_cache(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """Without a cache this is :meth:`aget_state`."""
        return await self.aget_state(config)

    @traced()
    async def aput_state_cache(
        self, config: dict[str, Any], state: dict[str, Any], version: int
    ) -> bool:
        """There is no cache here: validates the arguments and returns False."""
        self._store.ids(config)
        encode_state(state)
        check_count("version", version)
        return False

    @traced()
    async def alist_states(
        self, config: dict[str, Any], limit: int | None = None
    ) -> list[StateSnapshot]:
        """The retained state versions, newest first."""
        store = self._store
        ids = store.ids(config)
        limit = check_limit(limit)
        s, t = store.tables.states, store.tables.threads
        stmt = (  # the thread's life joined in: what its values are sealed for
            select(s.c.version, s.c.state_data, s.c.meta, s.c.created_at, *store.life_columns)
            .join(t, t.c.thread_id == s.c.thread_id)
            .where(s.c.thread_id == ids.thread_id, store.owned(ids))
            .order_by(s.c.version.desc())
            .limit(limit)
        )
        return [
            snapshot_of(row, ids.thread_id, store.keys, life_of(row))
            for row in await store.read(stmt)
        ]

    @traced()
    async def aget_messages(
        self, config: dict[str, Any], limit: int | None = None, after_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Messages in insertion order.

        Args:
            config: The run config.
            limit: Keep the first ``limit`` messages of the range.
            after_id: Start after the message with this id (an unknown id gives ``[]``).
        """
        store = self._store
        ids = store.ids(config)
        limit = check_limit(limit)
        m, t = store.tables.messages, store.tables.threads
        stmt = (  # the thread's life joined in: what its values are sealed for
            select(m.c.payload, *store.life_columns)
            .join(t, t.c.thread_id == m.c.thread_id)
            .where(m.c.thread_id == ids.thread_id, store.owned(ids))
        )
        if after_id is not None:
            after = (
                select(m.c.seq)
                .where(
                    m.c.thread_id == ids.thread_id, m.c.message_id == check_id("after_id", after_id)
                )
                .scalar_subquery()
            )
            stmt = stmt.where(m.c.seq > after)
        stmt = stmt.order_by(m.c.seq).limit(limit)
        return [
            store.load(row.payload, ids.thread_id, MESSAGE, life_of(row))
            for row in await store.read(stmt)
        ]

    # -- threads ---------------------------------------------------------------------

    @traced(write=True)
    async def aput_thread(
        self,
        config: dict[str, Any],
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ThreadInfo:
        """Create or update the thread record; ``None`` leaves a field as it is.

        Never changes the state version.
        """
        store = self._store
        ids = store.ids(config)
        plain: dict[str, tuple[str, str]] = {}
        if name is not None:
            if not isinstance(name, str):
                raise SerializationError(f"name must be a str, not {type(name).__name__}")
            plain["name"] = (encode(name, "name"), NAME)
        if metadata is not None:
            plain["metadata"] = (store.encode_object(metadata, "metadata"), METADATA)
        now = store.now()
        t = store.tables.threads
        async with store.write(ids.thread_id) as (conn, locked):
            life = life_of(await store.claim_thread(conn, ids, locked, now))
            # sealed for the life the lock found (or created): a name is the thread's
            values = {k: store.seal(v, ids.thread_id, c, life) for k, (v, c) in plain.items()}
            here = t.c.thread_id == ids.thread_id
            stmt = update(t).where(here).values(updated_at=now, **values)
            row = await store.backend.update_returning(conn, stmt, t, here)
        return thread_info(row, store.keys)

    @traced()
    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """The thread record, or None (also when another user owns it)."""
        store = self._store
        ids = store.ids(config)
        rows = await store.read(select(*store.tables.threads.c).where(store.owned(ids)))
        return thread_info(rows[0], store.keys) if rows else None

    @traced()
    async def alist_threads(
        self, config: dict[str, Any], limit: int | None = 50, offset: int = 0
    ) -> list[ThreadInfo]:
        """The caller's threads, most recently updated first (all when isolation is off).

        ``limit=None`` lists them all."""
        store = self._store
        ids = store.ids(config, need_thread=False)
        limit = check_limit(limit)
        offset = check_count("offset", offset)
        t = store.tables.threads
        stmt = select(*t.c)
        if ids.isolated:
            stmt = stmt.where(t.c.user_id == ids.user_id)
        stmt = (
            stmt.order_by(t.c.updated_at.desc(), t.c.thread_id.desc()).limit(limit).offset(offset)
        )
        return [thread_info(row, store.keys) for row in await store.read(stmt)]

    @traced(write=True)
    async def aclean_thread(self, config: dict[str, Any]) -> bool:
        """Delete the thread with its states, messages, tool executions and LangGraph
        checkpoints. Nothing of it is kept.

        Returns:
            False when there was no such thread.

        Raises:
            ThreadOwnershipError: Another user owns the thread.
        """
        return await self.adelete(config) is not None

    @traced(write=True)
    async def adelete(self, config: dict[str, Any]) -> Commit | None:
        """:meth:`aclean_thread`, returning what was deleted (None: no such thread)."""
        store = self._store
        ids = store.ids(config)
        async with store.write(ids.thread_id, deletes_only=True) as (conn, locked):
            if locked is None:
                return None
            store.check_owner(ids, locked)
            await store.delete_thread(conn, ids.thread_id)
        return Commit(ids.thread_id, locked.user_id, locked.incarnation, locked.version)

    # -- the tool ledger (see ToolLedger) -----------------------------------------------

    @traced(write=True)
    async def abegin_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, tool_name: str, args: dict[str, Any]
    ) -> ToolExecution:
        """Claim a tool call (:meth:`ToolLedger.abegin_tool_execution`)."""
        return await self.ledger.abegin_tool_execution(config, tool_call_id, tool_name, args)

    @traced(write=True)
    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any, *, attempt: int | None = None
    ) -> ToolExecution:
        """Record a tool call's result; the first success wins. Pass the claim's
        ``attempts`` as ``attempt`` (:meth:`ToolLedger.acomplete_tool_execution`)."""
        return await self.ledger.acomplete_tool_execution(
            config, tool_call_id, result, attempt=attempt
        )

    @traced(write=True)
    async def afail_tool_execution(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        error: str | BaseException,
        *,
        attempt: int | None = None,
    ) -> ToolExecution:
        """Record a tool call's failure (a succeeded call keeps its success). Pass the
        claim's ``attempts`` as ``attempt`` (:meth:`ToolLedger.afail_tool_execution`)."""
        return await self.ledger.afail_tool_execution(config, tool_call_id, error, attempt=attempt)

    @traced()
    async def aget_tool_execution(
        self, config: dict[str, Any], tool_call_id: str
    ) -> ToolExecution | None:
        """The ledger record of a tool call, or None (also for another user's thread)."""
        return await self.ledger.aget_tool_execution(config, tool_call_id)

    @traced(write=True)
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
        tool again. A call cancelled while ``fn`` runs gives its claim back (recorded
        as a failure) so the next call can claim at once; once ``fn`` has returned,
        its outcome is recorded even if the call is cancelled meanwhile. Across an
        expired lease the body may run again (at-least-once).

        Returns:
            The recorded result (as stored: JSON, so tuples come back as lists).

        Raises:
            ToolExecutionInProgress: Another worker is running this call now.
            ToolExecutionClaimLost: ``fn`` ran, but its lease expired and another
                worker's claim is live: that worker's outcome will be recorded.
            SerializationError: ``fn`` returned something that is not JSON. It has
                run: the call is recorded as succeeded without a result, and every
                later call raises this again without running ``fn``.
        """
        return await self.ledger.arun_tool_once(config, tool_call_id, tool_name, args, fn)

    @traced()
    async def alist_tool_executions(self, config: dict[str, Any]) -> list[ToolExecution]:
        """Every tool call of the thread, in the order they were first claimed."""
        return await self.ledger.alist_tool_executions(config)

    # -- whole threads (see ThreadExports) ----------------------------------------------

    @guard_iter
    async def aiter_threads(self, batch: int = 500) -> AsyncIterator[ThreadInfo]:
        """Every thread of every user, in ``thread_id`` order, read ``batch`` at a time."""
        async for info in self.exports.aiter_threads(batch):
            yield info

    @traced()
    async def aexport_thread(self, config: dict[str, Any]) -> ThreadExport | None:
        """Everything stored of one thread, read in one snapshot; None when absent
        (or another user's while isolation applies)."""
        return await self.exports.aexport_thread(config)

    @traced(write=True)
    async def aimport_thread(
        self,
        export: ThreadExport,
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> ImportOutcome:
        """Write an exported thread back, in one transaction (see
        :meth:`ThreadExports.aimport_thread`)."""
        return await self.exports.aimport_thread(
            export, on_conflict=on_conflict, allowed_types=allowed_types
        )

    @traced(write=True)
    async def aimport_threads(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[ImportOutcome]:
        """Write exported threads back in ONE transaction; any error writes nothing (see
        :meth:`ThreadExports.aimport_threads`)."""
        return await self.exports.aimport_threads(
            exports, on_conflict=on_conflict, allowed_types=allowed_types
        )

    @traced(write=True)
    async def aimport(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """:meth:`aimport_threads`, returning what each import did (with the life it
        replaced), as a cache needs to know it."""
        return await self.exports.aimport(
            exports, on_conflict=on_conflict, allowed_types=allowed_types
        )

    @traced(write=True)
    async def aimport_stream(
        self,
        source: Callable[[], Iterable[tuple[str | None, ThreadExport]]],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """Import exports read twice from ``source`` — checked, then written in ONE
        transaction — with memory bounded by the largest thread (see
        :meth:`ThreadExports.aimport_stream`)."""
        return await self.exports.aimport_stream(
            source, on_conflict=on_conflict, allowed_types=allowed_types
        )

    # -- data lifecycle (see Lifecycle) and stats ---------------------------------------

    @traced(write=True)
    async def adelete_user(
        self,
        user_id: Any,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        sample: int = DEFAULT_SAMPLE,
        on_batch: ProgressHook | None = None,
        before_commit: BatchHook | None = None,
    ) -> DeleteResult:
        """Erase a user: delete every thread ``user_id`` owns, with its states,
        messages, tool executions and LangGraph checkpoints, writes and values, and
        every long-term memory of the user with its history (after the threads, in
        batches of ``batch_size`` memories).

        Works in batches of ``batch_size`` threads, each its own short transaction
        that locks its threads, deletes them whole and commits: a thread is either
        whole or gone, never half deleted. After a crash, call it again: it deletes
        what is left. It ends when a pass finds no thread of the user; a thread the
        application creates for the user after that pass is a new thread (stop the
        user's sessions first). A run that read one of the threads before it was
        deleted can never write into it again (``StaleStateError``).

        Args:
            user_id: The user (validated as ``config["user_id"]`` is).
            batch_size: Threads per transaction (1 to 5000).
            dry_run: Delete nothing; count what would go, with a ``sample``.
            sample: Threads listed in a dry run's result.
            on_batch: Called after each batch commits with the totals so far (sync or
                async); if it raises, the call stops there.
            before_commit: Awaited inside each batch's transaction before it commits,
                with the threads it deletes (a cache decorator fences them here).

        Returns:
            The rows deleted, by kind (:class:`DeleteResult`).

        Raises:
            ConfigError: A bad ``user_id``, ``batch_size`` or ``sample``.
            LockTimeout: A thread stayed locked by a writer longer than
                ``lock_timeout``; the batches before it are done (call again).
        """
        return await self.lifecycle.adelete_user(
            user_id,
            batch_size=batch_size,
            dry_run=dry_run,
            sample=sample,
            on_batch=on_batch,
            before_commit=before_commit,
        )

    @traced(write=True)
    async def aprune_idle(
        self,
        older_than: timedelta,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        sample: int = DEFAULT_SAMPLE,
        on_batch: ProgressHook | None = None,
        before_commit: BatchHook | None = None,
        include_memories: bool = False,
    ) -> DeleteResult:
        """Retention: delete every thread (of every user) not used for ``older_than``.

        A thread is idle when neither its record nor its state was written since
        then (``updated_at``), no LangGraph checkpoint was written and no tool call
        was claimed or finished. Each batch locks its threads and asks again under
        the lock, so a thread used while the prune runs is kept (``skipped``).
        Batched, resumable and with ``on_batch`` / ``before_commit`` as
        :meth:`adelete_user`.

        Args:
            older_than: The idle time, e.g. ``timedelta(days=90)``
                (:func:`tenxstore.parse_duration` reads ``"90d"``).
            batch_size: Threads per transaction (1 to 5000).
            dry_run: Delete nothing; count what would go, with a ``sample`` of the
                least recently updated threads.
            sample: Threads listed in a dry run's result.
            on_batch: Called after each batch commits with the totals so far.
            before_commit: Awaited inside each batch's transaction before it commits.
            include_memories: Also delete the long-term memories (of every user) not
                written for ``older_than``, with their history; without it memories
                are left alone (they are meant to outlive threads).

        Raises:
            ConfigError: ``older_than`` is not a positive ``timedelta``, or a bad
                ``batch_size`` or ``sample``.
        """
        return await self.lifecycle.aprune_idle(
            older_than,
            batch_size=batch_size,
            dry_run=dry_run,
            sample=sample,
            on_batch=on_batch,
            before_commit=before_commit,
            include_memories=include_memories,
        )

    @traced()
    async def astats(self, *, top: int = 10, exact: bool = False) -> StoreStats:
        """What the store holds: threads, the ``top`` users by threads (with their
        states, messages, tool calls and checkpoints, counted exactly), each table's
        and its indexes' bytes, dead rows (PostgreSQL), the database's size.

        Args:
            top: How many users to list (0 to 10000).
            exact: Count each table's rows on PostgreSQL too (a scan of each table)
                instead of taking the statistics' estimate.
        """
        return await self.stats.astats(top=top, exact=exact)
