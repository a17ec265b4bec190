"""CheckpointRepository: durable, versioned thread storage; the one public class.

It is chosen by URL and holds what its parts share in a :class:`~tenxstore.store.Store`:
the backend of its database mode (:mod:`tenxstore.backends`), the statements built
once (:mod:`tenxstore.statements`) and its settings. The state and thread methods of
the product's contract are declared here and done in :mod:`~tenxstore.opening`,
:mod:`~tenxstore.readiness`, :mod:`~tenxstore.commits`, :mod:`~tenxstore.state_reads`
and :mod:`~tenxstore.thread_records`; the tool ledger, whole-thread export/import and
the LangGraph tables are collaborators it holds (``.ledger``, ``.exports``,
``.langgraph``) and whose methods it exposes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from . import readiness, state_reads, thread_records
from .backends import DEFAULT_LOCK_TIMEOUT_S, Backend, PoolMode
from .backends.retry import RetryPolicy
from .boundary import guard
from .commits import commit
from .crypto import KeyRing
from .facade import forward, forward_iter
from .langgraph.tables import LangGraphTables
from .ledger import ToolLedger
from .lifecycle import (
    Lifecycle,
)
from .opening import open_store
from .protocol import Checkpointer
from .serde import encode_state
from .telemetry import traced
from .twins import SyncCheckpointer
from .types import (
    Commit,
    Health,
    StateSnapshot,
    ThreadInfo,
)
from .validate import IdType, check_count

if TYPE_CHECKING:
    from .exports import ThreadExports
    from .stats import Stats

__all__ = ["CheckpointRepository"]


class CheckpointRepository(SyncCheckpointer):
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
        replica_urls: PostgreSQL standbys of the primary (URLs) that serve the reads
            that tolerate lag — ``alist_threads``, ``aiter_threads``, history
            (``alist_states``, ``aget_messages``), ``aexport_thread`` and the memory
            store's searches and listings — while each is within ``max_replica_lag``
            (else the primary answers). A read of a thread whose config recorded a
            version (the run read or wrote it) is served by a replica only when the
            replica holds that version, so a run never reads its own write as missing;
            :func:`tenxstore.config.read_source` says where a read of a config was
            served from. The URL form: ``?replica=host[:port]`` (repeated), sharing the
            primary URL's user, password, database and options. See docs/deploy.md.
        max_replica_lag: Seconds a replica may be behind the primary and still serve
            (default 5; also ``?max_replica_lag=`` in the URL).

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
        replica_urls: Sequence[str | URL] | None = None,
        max_replica_lag: float | None = None,
    ) -> None:
        opened = open_store(
            url_or_engine,
            schema=schema,
            state_history_limit=state_history_limit,
            enforce_user_isolation=enforce_user_isolation,
            id_type=id_type,
            user_id_type=user_id_type,
            engine_options=engine_options,
            tool_lease_seconds=tool_lease_seconds,
            lock_timeout=lock_timeout,
            pool_mode=pool_mode,
            keys=keys,
            retry=retry,
            replica_urls=replica_urls,
            max_replica_lag=max_replica_lag,
        )
        self.store = store = opened.store
        """What the repository's collaborators share (:class:`~tenxstore.store.Store`):
        the backend, the statements and the steps of every write."""
        settings = store.settings
        self.schema = store.schema
        self.pool_mode = opened.pool_mode
        self.lock_timeout = opened.lock_timeout
        self.state_history_limit = state_history_limit
        self.enforce_user_isolation = settings.enforce_user_isolation
        self.tool_lease_seconds = settings.tool_lease.total_seconds()
        self.keys = store.keys
        """The key ring payloads are sealed with, or None (stored in clear)."""
        self.ledger = ToolLedger(store)
        """The tool ledger (:class:`~tenxstore.ledger.ToolLedger`)."""
        self.langgraph = LangGraphTables(store)
        """LangGraph's tables (:class:`~tenxstore.langgraph.tables.LangGraphTables`)."""
        self.lifecycle = Lifecycle(store)
        """Erasing users and retiring idle threads (:class:`~tenxstore.lifecycle.Lifecycle`)."""

    # Made at first use: a process that never exports or counts never imports them.
    @functools.cached_property
    def exports(self) -> ThreadExports:
        """Whole-thread export and import (:class:`~tenxstore.exports.ThreadExports`)."""
        from .exports import ThreadExports

        return ThreadExports(self.store)

    @functools.cached_property
    def statistics(self) -> Stats:
        """What the store holds (:class:`~tenxstore.stats.Stats`)."""
        from .stats import Stats

        return Stats(self.store)

    # -- identity and lifecycle --------------------------------------------------------

    @property
    def engine(self) -> AsyncEngine:
        """The engine."""
        return self.store.backend.engine

    @property
    def backend(self) -> Backend:
        """The backend of this database mode (``backend.name``: ``"postgresql"``,
        ``"pgbouncer"``, ``"sqlite"`` or ``"memory"``)."""
        return self.store.backend

    @property
    def id_type(self) -> IdType:
        """Type of ``thread_id``: ``"string"``, ``"int"`` or ``"bigint"``."""
        return self.store.settings.id_type

    @property
    def user_id_type(self) -> IdType:
        """Type of ``user_id``."""
        return self.store.settings.user_id_type

    @property
    def dialect(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        return self.store.backend.dialect

    @traced()
    async def asetup(self) -> None:
        """Migrate the schema to head (creating the PostgreSQL schema when absent).

        Idempotent, and safe when many processes call it at once.

        Raises:
            ConfigError: The schema was created with other ``id_type`` /
                ``user_id_type`` values.
        """
        await readiness.setup(self.store)

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
        return await self.store.ensure_ready()

    def setup(self) -> None:
        """Synchronous :meth:`asetup`; works with or without a running event loop.

        The migration runs on a private event loop with its own connections, closed
        before this returns, so the checkpointer is then usable from any loop.

        Raises:
            ConfigError: The engine borrows from an asyncpg pool, which belongs to
                its own event loop: call ``await asetup()`` there instead.
        """
        readiness.setup_blocking(self.store, self.asetup)

    @traced()
    async def acheck(self) -> Health:
        """Check the database: reachable, and its schema at the revision this release
        needs. Never raises for what it finds; see :class:`Health`."""
        return await readiness.health(self.store, self.keys)

    @guard
    async def aclose(self) -> None:
        """Close the connection pool if this repository created it."""
        await self.store.backend.aclose()

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
        return await commit(self.store, config, state, messages, meta, self.state_history_limit)

    @traced(write=True)
    async def aput_state(
        self, config: dict[str, Any], state: dict[str, Any], *, meta: dict[str, Any] | None = None
    ) -> int:
        """:meth:`aput_checkpoint` without messages."""
        return await self.aput_checkpoint(config, state, (), meta=meta)

    @traced()
    async def aget_state(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The latest durable state, or None; records its version (0 when none) in config."""
        return await state_reads.read_state(self.store, config)

    @traced()
    async def aget_state_cache(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """Without a cache this is :meth:`aget_state`."""
        return await self.aget_state(config)

    @traced()
    async def aput_state_cache(
        self, config: dict[str, Any], state: dict[str, Any], version: int
    ) -> bool:
        """There is no cache here: validates the arguments and returns False."""
        self.store.ids(config)
        encode_state(state)
        check_count("version", version)
        return False

    @traced()
    async def alist_states(
        self, config: dict[str, Any], limit: int | None = None
    ) -> list[StateSnapshot]:
        """The retained state versions, newest first."""
        return await state_reads.list_states(self.store, config, limit)

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
        return await state_reads.read_messages(self.store, config, limit, after_id)

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
        return await thread_records.put_thread(self.store, config, name, metadata)

    @traced()
    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """The thread record, or None (also when another user owns it)."""
        return await thread_records.get_thread(self.store, config)

    @traced()
    async def alist_threads(
        self, config: dict[str, Any], limit: int | None = 50, offset: int = 0
    ) -> list[ThreadInfo]:
        """The caller's threads, most recently updated first (all when isolation is off).

        ``limit=None`` lists them all."""
        return await thread_records.list_threads(self.store, config, limit, offset)

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
        return await thread_records.delete_thread(self.store, config)

    # -- the tool ledger (see ToolLedger) -----------------------------------------------

    abegin_tool_execution = forward(Checkpointer.abegin_tool_execution, "ledger", write=True)
    acomplete_tool_execution = forward(Checkpointer.acomplete_tool_execution, "ledger", write=True)
    afail_tool_execution = forward(Checkpointer.afail_tool_execution, "ledger", write=True)
    aget_tool_execution = forward(Checkpointer.aget_tool_execution, "ledger")
    arun_tool_once = forward(Checkpointer.arun_tool_once, "ledger", write=True)
    alist_tool_executions = forward(Checkpointer.alist_tool_executions, "ledger")

    # -- whole threads (see ThreadExports) ----------------------------------------------

    aiter_threads = forward_iter(Checkpointer.aiter_threads, "exports")
    aexport_thread = forward(Checkpointer.aexport_thread, "exports")
    aimport_thread = forward(Checkpointer.aimport_thread, "exports", write=True)
    aimport_threads = forward(Checkpointer.aimport_threads, "exports", write=True)
    aimport = forward(Checkpointer.aimport, "exports", write=True)
    aimport_stream = forward(Checkpointer.aimport_stream, "exports", write=True)

    # -- data lifecycle (see Lifecycle) and stats ---------------------------------------

    adelete_user = forward(Checkpointer.adelete_user, "lifecycle", write=True)
    aprune_idle = forward(Checkpointer.aprune_idle, "lifecycle", write=True)
    astats = forward(Checkpointer.astats, "statistics")
