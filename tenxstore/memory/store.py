"""MemoryStore: long-term memories of each user, on the checkpointer's own database.

A memory is text (``content``) with a JSON object (``metadata``) under a ``key`` in a
``namespace`` (a tuple of labels) of one user, versioned: every write is a new version
under the memory's row lock, compared and swapped, and its past versions are kept
(``memory_history_limit``). Keyword search runs on the database's full-text engine
(:mod:`tenxstore.memory.search`); with an embedding, each memory's vector is stored in
its write's transaction and search is hybrid (:mod:`tenxstore.memory.vectors`). The
sync twins are in :mod:`tenxstore.memory.sync`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import select

from ..backends import Backend
from ..backends.replicas import tolerating_lag
from ..crypto import KeyRing
from ..embeddings import Embedding, as_embedding
from ..errors import ConfigError
from ..store import Store
from ..telemetry import traced
from ..types import AuthPolicy, Memory, MemoryHit
from ..validate import check_count, is_int
from . import bulk, fast, hybrid, indexing, keyword, writes
from .bulk import NewMemory
from .lifecycle import MemoryLifecycle, check_batch_size
from .opening import check_options, open_repository
from .rows import MemoryRows
from .sync import SyncTwins
from .validation import (
    DEFAULT_NAMESPACE,
    check_filter,
    check_key,
    check_namespace,
    check_offset,
    check_policy,
    check_query,
    check_scoped_user,
    check_search_limit,
    check_threshold,
    check_user,
    split,
)
from .vectors import Vectors

if TYPE_CHECKING:
    from .qdrant import QdrantIndex

__all__ = ["MemoryStore"]

Mode = Literal["hybrid", "vector", "keyword"]
_MODES = ("hybrid", "vector", "keyword")


class MemoryStore(SyncTwins, indexing.Reindexing):
    """Long-term memories, scoped to a user like threads, on a tenxstore database.

    Args:
        url_or_checkpointer: A database URL as :class:`~tenxstore.CheckpointRepository`
            takes (``postgresql://``, ``sqlite:///path``, ``mysql://``), ``"memory"``
            (an in-memory database), an ``AsyncEngine``; or a checkpointer
            (``CheckpointRepository``, ``CachedCheckpointer``, a preset) whose engine,
            schema, key ring and isolation the store shares (its tables are in the same
            database; closing the store leaves the checkpointer open).
        embedding: Search by meaning: an :class:`~tenxstore.embeddings.Embedding`, a
            LangChain ``Embeddings`` object or a function of a list of texts to their
            vectors (see :func:`~tenxstore.embeddings.as_embedding`). Each memory's
            vector is computed before its write and stored in its transaction, and
            search is hybrid (vector and keyword ranks fused). None: search is by
            keyword, and a write of content drops the memory's vector (stale).
        schema: PostgreSQL schema (a URL only).
        keys: The :class:`~tenxstore.KeyRing` sealing content and metadata (a URL
            only; None reads ``TENXSTORE_KEYS``).
        enforce_user_isolation: Scope every call to its ``user_id`` (a URL: default
            True; a checkpointer: its own setting, unless given).
        memory_history_limit: Versions kept of each memory, the current one included.
        keyword_index: Keep the keyword index (the words of each memory, in clear,
            beside its sealed content: see docs/memory.md). False: no index is kept and
            :meth:`asearch` raises ``ConfigError``.
        vector_index: A :class:`~tenxstore.memory.QdrantIndex` holding a copy of the
            vectors (needs ``embedding``): searched instead of the database's own
            index, which answers when Qdrant is down (docs/memory.md). Closed with the
            store.
        **repository_options: Other :class:`~tenxstore.CheckpointRepository` arguments
            for a URL (``engine_options``, ``lock_timeout``, ``pool_mode``,
            ``user_id_type``...).

    Raises:
        ConfigError: An invalid argument, or ``schema``/``keys``/options given with a
            checkpointer (they are the checkpointer's).
    """

    def __init__(
        self,
        url_or_checkpointer: Any,
        *,
        embedding: Any = None,
        schema: str | None = None,
        keys: KeyRing | None = None,
        enforce_user_isolation: bool | None = None,
        memory_history_limit: int = 20,
        keyword_index: bool = True,
        vector_index: QdrantIndex | None = None,
        **repository_options: Any,
    ) -> None:
        self.embedding: Embedding | None = None if embedding is None else as_embedding(embedding)
        self.vector_index = indexing.check_index(vector_index, self.embedding)
        """The :class:`~tenxstore.memory.QdrantIndex` searched, or None."""
        self.keyword_index = check_options(
            memory_history_limit, keyword_index, enforce_user_isolation
        )
        self.repository, self._owns = open_repository(
            url_or_checkpointer, schema, keys, enforce_user_isolation, repository_options
        )
        store: Store = self.repository.store
        self.base = store
        """The repository's :class:`~tenxstore.store.Store`, which the memory modules share."""
        self.enforce_user_isolation = (
            store.settings.enforce_user_isolation
            if enforce_user_isolation is None
            else enforce_user_isolation
        )
        self.memory_history_limit = memory_history_limit
        self.rows = MemoryRows(store, memory_history_limit)
        """The memory tables' statements and write steps
        (:class:`~tenxstore.memory.rows.MemoryRows`)."""
        self.lifecycle = MemoryLifecycle(store, self.rows)
        """Sweeps and bulk deletes (:class:`~tenxstore.memory.lifecycle.MemoryLifecycle`)."""
        self.vectors = None if self.embedding is None else Vectors(store, self.rows, self.embedding)
        """The vectors of this store's embedding (None without one)."""
        path = store.backend.memory_fast_path(store)
        self.fast = None if path is None else fast.OneStep(path, store.keys is not None)
        """The backend's one-step put and get (:mod:`tenxstore.memory.fast`), or None."""

    def with_embedding(self, embedding: Any) -> MemoryStore:
        """This store's memories (its database, key ring, isolation, history limit and
        keyword index) searched with ``embedding``: a store of its own that shares this
        one's connections (closing it leaves them open)."""
        other = MemoryStore(
            self.repository,
            embedding=embedding,
            enforce_user_isolation=self.enforce_user_isolation,
            memory_history_limit=self.memory_history_limit,
            keyword_index=self.keyword_index,
        )
        return other

    @property
    def backend(self) -> Backend:
        """The backend of the database the memories are in (the checkpointer's)."""
        return self.base.backend

    @property
    def keys(self) -> KeyRing | None:
        """The key ring content and metadata are sealed with, or None."""
        return self.base.keys

    # -- lifecycle -------------------------------------------------------------------

    async def asetup(self) -> None:
        """Migrate the database to head (the checkpointer's migrations, which make the
        memories' tables); idempotent and safe from many processes."""
        await self.repository.asetup()
        if self.vectors is not None:
            await self.vectors.check_model()
        if self.vector_index is not None:
            await indexing.setup(self)

    def setup(self) -> None:
        """Synchronous :meth:`asetup`, with or without a running event loop."""
        self.repository.setup()
        if self.vectors is not None:
            from .sync import blocking

            blocking(self.vectors.check_model(), "asetup")
        if self.vector_index is not None:
            blocking(indexing.setup(self), "asetup")

    async def aclose(self) -> None:
        """Close the connections, if the store opened them (one made from a
        checkpointer leaves it open), and the vector index's client if it made it."""
        if self.vector_index is not None:
            await self.vector_index.aclose()
        if self._owns:
            await self.repository.aclose()

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the arguments of a call -----------------------------------------------------

    def _isolated(self, auth_policy: AuthPolicy | None) -> bool:
        policy = check_policy(auth_policy)
        return self.enforce_user_isolation if policy is None else policy.enforce_user_isolation

    def _owner(self, user_id: Any, auth_policy: AuthPolicy | None) -> Any:
        """The user of a call that names one memory: required, isolated or not (and,
        isolated, not the reserved owner of shared items)."""
        kind = self.base.settings.user_id_type
        if self._isolated(auth_policy):
            return check_scoped_user(user_id, kind)
        return check_user(user_id, kind)

    def _users(self, user_id: Any, auth_policy: AuthPolicy | None) -> Any:
        """The user a listing or search is scoped to; None (every user's) when
        isolation does not apply to the call."""
        kind = self.base.settings.user_id_type
        if self._isolated(auth_policy):
            return check_scoped_user(user_id, kind)
        check_user(user_id, kind, optional=True)
        return None

    # -- the documents' methods ------------------------------------------------------

    @traced(write=True, prefix="memory.")
    async def astore(
        self,
        user_id: Any,
        content: str,
        *,
        metadata: dict[str, Any] | None = None,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        key: str | None = None,
        ttl: float | timedelta | None = None,
        auth_policy: AuthPolicy | None = None,
        embed: bool | str = True,
    ) -> Memory:
        """Store a memory: without ``key``, a new one under a generated key; with a
        ``key``, an upsert — a new memory, or the next version of the one there
        (``created_at`` kept, the TTL set anew).

        Args:
            user_id: The owner.
            content: The text (at most 2 MiB of UTF-8).
            metadata: A JSON object (None: ``{}``).
            namespace: Its labels (non-empty strings without ``.``).
            key: Its id in the namespace (1-255 characters); None generates one.
            ttl: Seconds (int or float) or a ``timedelta`` until it expires; None
                keeps it until deleted.
            auth_policy: Server code's :class:`AuthPolicy` for this call.
            embed: With an embedding: True stores the vector of ``content``; a str,
                the vector of that text instead (what LangGraph's ``fields`` pick);
                False, no vector (the memory is then found by keyword only).

        Returns:
            The memory as stored.

        Raises:
            ConfigError: A bad user id, key, namespace or ttl (nothing is written).
            SerializationError: Content or metadata that cannot be stored.
            EmbeddingError: The embedding raised or returned no proper vector
                (nothing is written).
        """
        owner = self._owner(user_id, auth_policy)
        ns = check_namespace(namespace)
        name = uuid.uuid4().hex if key is None else check_key(key)
        new = writes.written(self, content, metadata, ttl)
        if not isinstance(embed, (bool, str)):
            raise ConfigError(f"embed must be True, False or a text, not {embed!r}")
        # the caller's text, as areembed and TenxStore embed it (new.content is its
        # stored, JSON-encoded form)
        blob = await writes.vector(self, content, embed)
        put = lambda: writes.put(self, owner, ns, name, new, blob)  # noqa: E731
        return await indexing.written(self, owner, [(ns, name)], put)

    @traced(write=True, prefix="memory.")
    async def astore_many(
        self,
        user_id: Any,
        memories: Iterable[NewMemory | str | Mapping[str, Any]],
        *,
        auth_policy: AuthPolicy | None = None,
        batch_size: int = 500,
        embed_batch_size: int = 64,
    ) -> list[Memory]:
        """Store many memories of one user in ONE transaction: the writes of
        :meth:`astore` called for each in order (a key given twice is stored twice, the
        second its next version), all or nothing, ``batch_size`` a round trip.

        Args:
            user_id: The owner of every one.
            memories: Each a :class:`~tenxstore.memory.bulk.NewMemory` (``astore``'s
                arguments), its content as a ``str``, or a mapping of its fields.
            auth_policy: Server code's :class:`AuthPolicy` for this call.
            batch_size: Memories written a round (1 to 5000).
            embed_batch_size: Texts a call of the embedding (1 to 5000).

        Returns:
            The memories as stored, in the order given.

        Raises:
            ConfigError: A bad user id, memory, key, namespace, ttl or batch size.
            SerializationError: Content or metadata that cannot be stored.
            EmbeddingError: The embedding raised or returned no proper vector.
            (Each before any transaction: nothing is written.)
        """
        owner = self._owner(user_id, auth_policy)
        size = bulk.check_batch(batch_size)
        items = await bulk.prepared(self, memories, bulk.check_batch(embed_batch_size))
        if not items:
            return []
        many = lambda: bulk.store_many(self, owner, items, size)  # noqa: E731
        return await indexing.written(self, owner, [(i.ns, i.key) for i in items], many)

    @traced(prefix="memory.")
    async def aget(
        self,
        user_id: Any,
        key: str,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        auth_policy: AuthPolicy | None = None,
    ) -> Memory | None:
        """The memory, or None (never stored, deleted, expired, or another user's)."""
        owner = self._owner(user_id, auth_policy)
        ns, name = check_namespace(namespace), check_key(key)
        if fast.ready(self):
            return await fast.get(self, owner, ns, name)
        rows = self.rows
        m = rows.m
        clauses = rows.scope(owner, ns, self.base.now(), exact=True)
        found = await self.base.read(select(*m.c).where(*clauses, m.c.memory_key == name))
        return rows.memory(found[0]) if found else None

    @traced(write=True, prefix="memory.")
    async def aupdate(
        self,
        user_id: Any,
        key: str,
        *,
        content: str | None = None,
        metadata: dict[str, Any] | None = None,
        expected_version: int | None = None,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        auth_policy: AuthPolicy | None = None,
        embed: bool | str | None = None,
    ) -> Memory:
        """Replace a memory's content and/or metadata (None keeps it): its next
        version, keeping its expiry.

        Args:
            expected_version: The version the caller read: the update is a
                compare-and-swap on it (None: whatever the version is).
            embed: With an embedding and new ``content``, as ``astore``'s: True
                stores the vector of ``content``, a str the vector of that text,
                False no vector. None (the default) keeps the memory's choice: a
                memory that has a vector gets the new content's, one without a
                vector (stored with ``embed=False``) gets none.

        Raises:
            ConfigError: Neither ``content`` nor ``metadata`` given, or bad arguments.
            MemoryNotFound: No such memory (deleted, expired, or another user's).
            StaleStateError: The memory is not at ``expected_version``
                (``expected_version``, ``actual_version``; ``key`` and ``namespace``
                name the memory); nothing was written.
        """
        owner = self._owner(user_id, auth_policy)
        ns, name = check_namespace(namespace), check_key(key)
        if content is None and metadata is None:
            raise ConfigError("aupdate needs content= or metadata= (or both)")
        if expected_version is not None:
            expected_version = check_count("expected_version", expected_version)
        new = writes.written(self, content, metadata, keep_metadata=True)
        if embed is not None and not isinstance(embed, (bool, str)):
            raise ConfigError(f"embed must be True, False, a text or None, not {embed!r}")
        if embed is None and content is not None and self.vectors is not None:
            embed = await writes.has_vector(self, owner, ns, name)
        blob = await writes.vector(self, content, True if embed is None else embed)
        return await indexing.written(
            self,
            owner,
            [(ns, name)],
            lambda: writes.update(self, owner, ns, name, new, blob, expected_version),
        )

    @traced(write=True, prefix="memory.")
    async def adelete(
        self,
        user_id: Any,
        key: str,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        auth_policy: AuthPolicy | None = None,
    ) -> bool:
        """Delete a memory and its history; False when there was none (an expired one
        is deleted too, and was already gone)."""
        owner = self._owner(user_id, auth_policy)
        ns, name = check_namespace(namespace), check_key(key)
        gone = lambda: writes.delete(self, owner, ns, name)  # noqa: E731
        return await indexing.written(self, owner, [(ns, name)], gone)

    @traced(prefix="memory.")
    async def ahistory(
        self,
        user_id: Any,
        key: str,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        auth_policy: AuthPolicy | None = None,
    ) -> list[Memory]:
        """The memory's versions, newest first (the current one first), at most
        ``memory_history_limit``; [] when there is no such memory."""
        owner = self._owner(user_id, auth_policy)
        ns, name = check_namespace(namespace), check_key(key)
        async with self.base.snapshot() as conn:
            return await self.rows.history(conn, owner, ns, name, self.base.now())

    @traced(prefix="memory.")
    async def alist(
        self,
        user_id: Any,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        limit: int = 50,
        offset: int = 0,
        auth_policy: AuthPolicy | None = None,
    ) -> list[Memory]:
        """The memories in ``namespace`` and the namespaces under it, most recently
        written first (every user's when isolation does not apply to the call)."""
        users = self._users(user_id, auth_policy)
        ns = check_namespace(namespace, empty=True)
        limit, offset = check_search_limit(limit), check_offset(offset)
        rows = self.rows
        m = rows.m
        stmt = (
            select(*m.c)
            .where(*rows.scope(users, ns, self.base.now()))
            .order_by(m.c.updated_at.desc(), m.c.id.desc())
            .limit(limit)
            .offset(offset)
        )
        return [rows.memory(row) for row in await self.base.read_lagging(stmt)]

    @traced(prefix="memory.")
    async def alist_namespaces(
        self,
        user_id: Any,
        *,
        prefix: tuple[str, ...] | None = None,
        suffix: tuple[str, ...] | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
        auth_policy: AuthPolicy | None = None,
    ) -> list[tuple[str, ...]]:
        """The namespaces holding the user's memories, sorted: those under ``prefix``
        and ending with ``suffix`` (labels compared whole and exactly), each cut to
        ``max_depth`` labels (then listed once)."""
        users = self._users(user_id, auth_policy)
        start = None if prefix is None else check_namespace(prefix, "prefix", empty=True)
        if suffix is not None:
            check_namespace(suffix, "suffix", empty=True)
            suffix = tuple(suffix)
        if max_depth is not None and (not is_int(max_depth) or max_depth < 1):
            raise ConfigError(f"max_depth must be an int of at least 1, not {max_depth!r}")
        limit, offset = check_search_limit(limit), check_offset(offset)
        rows = self.rows
        m = rows.m
        stmt = select(m.c.namespace).where(*rows.scope(users, start, self.base.now()))
        found: set[tuple[str, ...]] = set()
        for row in await self.base.read_lagging(stmt.distinct()):
            labels = split(row.namespace)
            if suffix and labels[-len(suffix) :] != suffix:
                continue
            found.add(labels if max_depth is None else labels[:max_depth])
        return sorted(found)[offset : offset + limit]

    @traced(prefix="memory.")
    async def asearch(
        self,
        user_id: Any,
        query: str,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        limit: int = 5,
        score_threshold: float = 0.0,
        filter: dict[str, Any] | None = None,
        auth_policy: AuthPolicy | None = None,
        mode: Mode | None = None,
    ) -> list[MemoryHit]:
        """The memories in ``namespace`` (and under it) closest to ``query``, best
        first, scores in [0, 1] and at least ``score_threshold``; ``filter`` on the
        metadata (a value: equality; or ``$eq $ne $gt $gte $lt $lte $in``).

        Args:
            mode: ``"keyword"``: the memories holding words of the query, ranked by
                the database's full-text engine (normalised within the query, a
                phrase of the query first; a query with no word finds nothing).
                ``"vector"``: by cosine similarity ``c`` of their vectors, score
                ``(1 + c) / 2``. ``"hybrid"``: both rankings fused by reciprocal rank
                fusion over the union of their candidates (a memory only one of them
                finds is kept), score the fused rank over the best one possible.
                None: hybrid with an embedding, keyword without.

        Raises:
            ConfigError: Bad arguments; ``"vector"``/``"hybrid"`` without an
                embedding; keyword search on a store that keeps no keyword index.
            EmbeddingError: The embedding failed on the query.
        """
        users = self._users(user_id, auth_policy)
        ns = check_namespace(namespace, empty=True)
        text = check_query(query)
        limit = check_search_limit(limit)
        threshold = check_threshold(score_threshold)
        keep = check_filter(filter)
        if mode is None:
            mode = "keyword" if self.vectors is None else "hybrid"
        elif mode not in _MODES:
            raise ConfigError(f"mode must be 'hybrid', 'vector' or 'keyword', not {mode!r}")
        if mode != "keyword" and self.vectors is None:
            raise ConfigError(
                f"mode={mode!r} searches by meaning: give the store an embedding "
                "(MemoryStore(..., embedding=...)), or search with mode='keyword'"
            )
        if mode == "keyword":
            if not self.keyword_index:
                raise ConfigError(
                    "this store keeps no keyword index (keyword_index=False): keyword "
                    "search needs it" + ("" if self.vectors else "; or give it an embedding")
                )
            with tolerating_lag(self.base.written()):  # reads may go to a replica
                return await keyword.search_by_words(self, users, ns, text, limit, threshold, keep)
        if not limit:
            return []
        with tolerating_lag(self.base.written()):
            return await self._vector_search(users, ns, text, limit, threshold, keep, mode)

    async def _vector_search(
        self,
        users: Any,
        ns: str,
        text: str,
        limit: int,
        threshold: float,
        keep: Any,
        mode: str,
    ) -> list[MemoryHit]:
        return await hybrid.search_by_meaning(self, users, ns, text, limit, threshold, keep, mode)

    @traced(write=True, prefix="memory.")
    async def areembed(
        self,
        embedding: Any = None,
        *,
        batch_size: int = 100,
        text_of: Any = None,
        missing: bool = False,
    ) -> int:
        """Redo the vectors of every live memory that has a vector of another model
        or dims than ``embedding``'s, ``batch_size`` at a time: each batch embedded, then written in
        its own short transaction (a memory written meanwhile is left as its writer
        left it). Stopped halfway, it resumes where it stopped when called again (the
        memories done hold the new model's vectors). Every user's memories.

        Args:
            embedding: The embedding (None: this store's own).
            batch_size: Memories per batch (1 to 5000).
            text_of: A function of a :class:`Memory` to the text to embed (None: its
                content; a result of None or "": no vector for that memory, its old
                one deleted).
            missing: Also embed the memories that have no vector at all (after an
                import, or memories stored before the store had an embedding). Off
                by default: a memory stored with ``embed=False`` has no vector
                either, and reembed never gives an opted-out memory one unless
                asked to.

        Returns:
            How many vectors were written.

        Raises:
            ConfigError: No embedding, or a bad ``batch_size``.
            EmbeddingError: The embedding failed (the batches before it are kept).
        """
        batch_size = check_batch_size(batch_size)
        chosen = self.embedding if embedding is None else as_embedding(embedding)
        if chosen is None:
            raise ConfigError("areembed needs an embedding (or a store that has one)")
        if not isinstance(missing, bool):
            raise ConfigError(f"missing must be True or False, not {missing!r}")
        return await hybrid.reembed(self, chosen, batch_size, text_of, missing)

    @traced(write=True, prefix="memory.")
    async def asweep_expired(self, *, batch_size: int = 500) -> int:
        """Delete the expired memories with their history, ``batch_size`` at a time
        (each batch its own short transaction); how many. Expired memories are never
        returned before a sweep either: the sweep only takes their rows away.

        Raises:
            ConfigError: ``batch_size`` is not from 1 to 5000.
        """
        return await self.lifecycle.asweep_expired(batch_size)
