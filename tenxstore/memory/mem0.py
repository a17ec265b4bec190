"""Mem0Store: the documents' five memory methods over a Mem0 ``Memory`` (``tenxstore[mem0]``).

:class:`Mem0Store` keeps each user's memories in Mem0 (the ``mem0ai`` package's
``Memory`` or ``AsyncMemory``: its vector store, its embedder, its history database),
scoped by Mem0's ``user_id``, behind :class:`~tenxstore.MemoryStore`'s ``astore``,
``asearch``, ``aget``, ``aupdate`` and ``adelete`` (and their sync twins): the same
arguments, results and errors. What Mem0 has no notion of (namespaces, keys, versions,
TTLs in seconds) is kept in each memory's Mem0 metadata, and what Mem0 cannot promise
is said where it differs (docs/memory.md, "Mem0Store"): a compare-and-swap is atomic
only among the calls of one ``Mem0Store``, not across processes sharing a Mem0 store.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
import zlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from ..errors import ConfigError, MemoryNotFound, SerializationError, StaleStateError
from ..types import AuthPolicy, Memory, MemoryHit
from ..validate import check_count, is_int
from .bulk import as_new_memory
from .expiry import Refresh
from .mem0_support import (
    EXPIRES,
    KEY,
    META,
    NS,
    SCOPES,
    UPDATED,
    VERSION,
    Mem0SyncTwins,
    fields,
    is_live,
    is_ours,
    local_mem0,
    mem0_user,
    memory_of,
)
from .validation import (
    DEFAULT_NAMESPACE,
    MAX_LIMIT,
    check_content,
    check_filter,
    check_key,
    check_metadata,
    check_namespace,
    check_offset,
    check_query,
    check_search_limit,
    check_threshold,
    check_ttl,
    split,
)

__all__ = ["Mem0Store", "local_mem0"]

_STRIPES = 64

SCAN_LIMIT = 10_000
"""The most memories of a user that ``alist`` and ``alist_namespaces`` read from Mem0
(which lists without order: they are sorted here)."""


class Mem0Store(Mem0SyncTwins):
    """The documents' memory methods over Mem0, each user's memories under Mem0's
    ``user_id`` (see the module and docs/memory.md for what differs from
    :class:`~tenxstore.MemoryStore`).

    Args:
        memory: A ``mem0.Memory`` or ``mem0.AsyncMemory`` (``Memory.from_config(...)``,
            or :func:`local_mem0`). Set ``MEM0_TELEMETRY=False`` before mem0 is first
            imported to keep Mem0 from sending usage events (tenxstore sets it when it
            imports mem0 first and the variable is unset).
        infer: What :meth:`aadd` passes as Mem0's ``infer`` by default (Mem0's own
            default is True: an LLM decides what to remember). The five methods store
            the text given, as given (``infer=False``).

    Raises:
        ConfigError: ``memory`` is not a Mem0 memory.
    """

    enforce_user_isolation = True
    """Always: a Mem0 memory belongs to one Mem0 ``user_id``."""
    embedding = None
    """None: Mem0 embeds with its own embedder (what ``TenxStore`` reads)."""
    keyword_index = True
    """A query is always searched (by Mem0's own ranking: what ``TenxStore`` reads)."""

    def __init__(self, memory: Any, *, infer: bool = True) -> None:
        needed = ("add", "get", "get_all", "search", "update", "delete")
        if not all(callable(getattr(memory, name, None)) for name in needed):
            raise ConfigError(
                f"Mem0Store takes a mem0 Memory or AsyncMemory, not {type(memory).__name__}"
            )
        if not isinstance(infer, bool):
            raise ConfigError(f"infer must be True or False, not {infer!r}")
        self.memory = memory
        """The Mem0 memory (its own API is there for what this store does not cover)."""
        self.infer = infer
        self._async = inspect.iscoroutinefunction(memory.add)
        self._locks = [threading.Lock() for _ in range(_STRIPES)]

    # -- Mem0 calls ------------------------------------------------------------------

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.memory, name)
        if self._async:
            return await method(*args, **kwargs)
        return await asyncio.to_thread(method, *args, **kwargs)

    @asynccontextmanager
    async def _locked(self, owner: str, ns: str, name: str) -> AsyncIterator[None]:
        """The writes of one memory take turns (within this store: Mem0 has no lock)."""
        lock = self._locks[zlib.crc32(f"{owner}\x00{ns}\x00{name}".encode()) % _STRIPES]
        # A thread lock, polled: the async methods and their sync twins (on tenxstore's
        # background loop) share it, which an asyncio lock (one loop's) cannot do.
        while not lock.acquire(blocking=False):  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        try:
            yield
        finally:
            lock.release()

    async def _found(self, owner: str, ns: str, name: str) -> list[dict[str, Any]]:
        """Every Mem0 memory of the user under this key (more than one only when
        writers outside this store raced), newest version first."""
        filters = {"user_id": owner, NS: ns, KEY: name}
        result = await self._call("get_all", filters=filters, top_k=20, show_expired=True)
        found = [
            r
            for r in result.get("results", [])
            if self._mine(r, owner, ns) and (r["metadata"][NS], r["metadata"][KEY]) == (ns, name)
        ]
        found.sort(key=lambda r: (int(r["metadata"].get(VERSION) or 1), r.get("updated_at") or ""))
        return found[::-1]

    @staticmethod
    def _mine(raw: dict[str, Any], owner: str, ns: str) -> bool:
        """A result of the user's, in ``ns`` or under it: what the filters asked Mem0
        for, checked again (a vector store that matched a filter otherwise, such as
        one element of ``tenx_scopes``, never shows one user another's memories)."""
        stored = raw["metadata"][NS] if is_ours(raw) and raw.get("user_id") == owner else None
        return stored is not None and (not ns or stored == ns or stored.startswith(ns + "."))

    async def _read(self, mem0_id: str, ns: str, name: str) -> Memory:
        raw = await self._call("get", mem0_id)
        if raw is None:  # deleted by a writer outside this store since it was written
            raise MemoryNotFound(name, split(ns))
        return memory_of(raw)

    # -- the arguments of a call -----------------------------------------------------

    def _owner(self, user_id: Any, auth_policy: AuthPolicy | None) -> str:
        return mem0_user(user_id, auth_policy)

    @staticmethod
    def _embed(embed: Any) -> None:
        if embed is not True:
            raise ConfigError(f"Mem0 embeds the content it stores: embed={embed!r} is refused")

    # -- the documents' methods ------------------------------------------------------

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
        """Store a memory as :meth:`tenxstore.MemoryStore.astore` does: without
        ``key``, a new one under a generated key; with a ``key``, an upsert (the next
        version, ``created_at`` kept, the TTL set anew). Mem0 stores ``content`` as
        given (``infer=False``) and embeds it.

        Raises:
            ConfigError: A bad user id, key, namespace or ttl, or ``embed`` other than
                True (nothing is written).
            SerializationError: Content or metadata that cannot be stored.
        """
        owner = self._owner(user_id, auth_policy)
        ns = check_namespace(namespace)
        name = uuid.uuid4().hex if key is None else check_key(key)
        check_content(content)
        check_metadata(metadata)
        expires = check_ttl(ttl, datetime.now(timezone.utc))
        self._embed(embed)
        return await self._put(owner, ns, name, content, dict(metadata or {}), expires, key)

    async def _put(
        self,
        owner: str,
        ns: str,
        name: str,
        content: str,
        meta: dict[str, Any],
        expires: datetime | None,
        key: str | None,
    ) -> Memory:
        """``astore`` once its arguments are checked: a new memory, or (a ``key``
        given) the next version of the one there."""
        date = None if expires is None else expires.date()
        async with self._locked(owner, ns, name):
            now = datetime.now(timezone.utc)
            found = [] if key is None else await self._found(owner, ns, name)
            live = [r for r in found if is_live(r, now)]
            head = live[0] if live else None
            for raw in found:
                if raw is not head:  # expired (that memory is gone), or a raced twin
                    await self._call("delete", raw["id"])
            if head is not None:
                version = int(head["metadata"][VERSION]) + 1
                written = fields(ns, name, version, meta, expires, now)
                await self._call(
                    "update", head["id"], text=content, metadata=written, expiration_date=date
                )
                return await self._read(head["id"], ns, name)
            written = fields(ns, name, 1, meta, expires)
            added = await self._call(
                "add", content, user_id=owner, metadata=written, infer=False, expiration_date=date
            )
            results = added.get("results") or []
            if len(results) != 1:
                raise SerializationError(
                    f"Mem0 stored {len(results)} memories for one content, not 1"
                )
            return await self._read(results[0]["id"], ns, name)

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
        now = datetime.now(timezone.utc)
        live = [r for r in await self._found(owner, ns, name) if is_live(r, now)]
        return memory_of(live[0]) if live else None

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
        version, its expiry kept, as :meth:`tenxstore.MemoryStore.aupdate` does.

        ``expected_version`` is compared and swapped under this store's lock of the
        memory: atomic among the calls of this ``Mem0Store``; a writer outside it
        (another process on the same Mem0 store, Mem0's own API) is not excluded.

        Raises:
            ConfigError: Neither ``content`` nor ``metadata`` given, or bad arguments.
            MemoryNotFound: No such memory (deleted, expired, or another user's).
            StaleStateError: The memory is not at ``expected_version``; nothing was
                written.
        """
        owner = self._owner(user_id, auth_policy)
        ns, name = check_namespace(namespace), check_key(key)
        if content is None and metadata is None:
            raise ConfigError("aupdate needs content= or metadata= (or both)")
        if expected_version is not None:
            expected_version = check_count("expected_version", expected_version)
        if content is not None:
            check_content(content)
        if metadata is not None:
            check_metadata(metadata)
        if embed is not None:
            self._embed(embed)
        async with self._locked(owner, ns, name):
            now = datetime.now(timezone.utc)
            live = [r for r in await self._found(owner, ns, name) if is_live(r, now)]
            if not live:
                raise MemoryNotFound(name, split(ns))
            head = live[0]
            version = int(head["metadata"][VERSION])
            if expected_version is not None and version != expected_version:
                stale = StaleStateError(
                    name,
                    expected_version,
                    version,
                    message=f"memory {name!r} in namespace {split(ns)!r} is at version "
                    f"{version}, not {expected_version}: another writer updated it "
                    "first; read it again and retry",
                )
                vars(stale).update(key=name, namespace=split(ns))
                raise stale
            changed: dict[str, Any] = {VERSION: version + 1, UPDATED: now.isoformat()}
            if metadata is not None:
                changed[META] = dict(metadata)
            await self._call("update", head["id"], text=content, metadata=changed)
            return await self._read(head["id"], ns, name)

    async def adelete(
        self,
        user_id: Any,
        key: str,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        auth_policy: AuthPolicy | None = None,
    ) -> bool:
        """Delete a memory (Mem0 keeps its own history of it); False when there was
        none (an expired one is deleted too, and was already gone)."""
        owner = self._owner(user_id, auth_policy)
        ns, name = check_namespace(namespace), check_key(key)
        async with self._locked(owner, ns, name):
            now = datetime.now(timezone.utc)
            found = await self._found(owner, ns, name)
            for raw in found:
                await self._call("delete", raw["id"])
            return any(is_live(r, now) for r in found)

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
        mode: str | None = None,
    ) -> list[MemoryHit]:
        """The memories in ``namespace`` (and under it) closest to ``query`` by Mem0's
        search (its vector similarity, with its BM25 and entity boosts where Mem0 has
        them), best first, scores clamped to [0, 1] and at least ``score_threshold``;
        ``filter`` on the metadata as :meth:`tenxstore.MemoryStore.asearch` takes it.
        A query of only whitespace finds nothing (Mem0 refuses it).

        Raises:
            ConfigError: Bad arguments, or a ``mode`` (Mem0 ranks its own way).
        """
        owner = self._owner(user_id, auth_policy)
        ns = check_namespace(namespace, empty=True)
        text = check_query(query)
        limit = check_search_limit(limit)
        threshold = check_threshold(score_threshold)
        keep = check_filter(filter)
        if mode is not None:
            raise ConfigError(f"Mem0Store searches as Mem0 does: mode={mode!r} is not supported")
        if not limit or not text.strip():
            return []
        filters: dict[str, Any] = {"user_id": owner}
        if ns:
            filters[SCOPES] = ns
        asked = min(MAX_LIMIT, max(limit * 2, 20))
        while True:
            result = await self._call(
                "search", text, top_k=asked, filters=filters, threshold=0.0, show_expired=True
            )
            raws = result.get("results") or []
            now = datetime.now(timezone.utc)
            hits = []
            for raw in raws:
                if not self._mine(raw, owner, ns) or not is_live(raw, now):
                    continue
                memory = memory_of(raw)
                score = min(1.0, max(0.0, float(raw.get("score") or 0.0)))
                if score < threshold or (keep is not None and not keep(memory.metadata)):
                    continue
                hits.append(MemoryHit(memory, score))
            if len(hits) >= limit or len(raws) < asked or asked == MAX_LIMIT:
                hits.sort(key=lambda h: -h.score)
                return hits[:limit]
            asked = min(MAX_LIMIT, asked * 4)

    # -- what TenxStore (LangGraph's BaseStore) needs besides ------------------------

    async def _all(self, owner: str, ns: str) -> list[Memory]:
        """The user's live memories in ``ns`` and under it (every one with ``""``),
        most recently written first: at most :data:`SCAN_LIMIT` read from Mem0."""
        filters: dict[str, Any] = {"user_id": owner}
        if ns:
            filters[SCOPES] = ns
        result = await self._call("get_all", filters=filters, top_k=SCAN_LIMIT, show_expired=True)
        now = datetime.now(timezone.utc)
        found = [memory_of(r) for r in result.get("results") or [] if self._mine(r, owner, ns)]
        found = [m for m in found if m.expires_at is None or m.expires_at > now]
        found.sort(key=lambda m: m.updated_at, reverse=True)
        return found

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
        written first (of at most :data:`SCAN_LIMIT` read from Mem0)."""
        owner = self._owner(user_id, auth_policy)
        ns = check_namespace(namespace, empty=True)
        limit, offset = check_search_limit(limit), check_offset(offset)
        return (await self._all(owner, ns))[offset : offset + limit]

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
        """The namespaces holding the user's memories, sorted, as
        :meth:`tenxstore.MemoryStore.alist_namespaces` gives them."""
        owner = self._owner(user_id, auth_policy)
        start = "" if prefix is None else check_namespace(prefix, "prefix", empty=True)
        if suffix is not None:
            check_namespace(suffix, "suffix", empty=True)
            suffix = tuple(suffix)
        if max_depth is not None and (not is_int(max_depth) or max_depth < 1):
            raise ConfigError(f"max_depth must be an int of at least 1, not {max_depth!r}")
        limit, offset = check_search_limit(limit), check_offset(offset)
        found: set[tuple[str, ...]] = set()
        for memory in await self._all(owner, start):
            labels = memory.namespace
            if suffix and labels[-len(suffix) :] != suffix:
                continue
            found.add(labels if max_depth is None else labels[:max_depth])
        return sorted(found)[offset : offset + limit]

    async def astore_many(
        self, user_id: Any, memories: Iterable[Any], *, auth_policy: AuthPolicy | None = None
    ) -> list[Memory]:
        """:meth:`astore` of each memory in order (a :class:`~tenxstore.NewMemory`, a
        ``str`` or a mapping of its fields), every one checked before any is written.
        NOT one transaction, as :meth:`tenxstore.MemoryStore.astore_many` is: Mem0 has
        none, and a failure leaves the memories before it stored. ``embed`` is not
        read: Mem0 embeds every memory's content.
        """
        owner = self._owner(user_id, auth_policy)
        if isinstance(memories, (str, bytes, Mapping)):
            raise ConfigError("memories must be an iterable of memories, not one")
        now = datetime.now(timezone.utc)
        ready = []
        for at, raw in enumerate(memories):
            one = as_new_memory(raw, at)
            ns = check_namespace(one.namespace)
            name = uuid.uuid4().hex if one.key is None else check_key(one.key)
            check_content(one.content)
            check_metadata(one.metadata)
            expires = check_ttl(one.ttl, now)
            ready.append((ns, name, one.content, dict(one.metadata or {}), expires, one.key))
        return [await self._put(owner, *args) for args in ready]

    async def arefresh(self, user_id: Any, items: Sequence[Refresh]) -> int:
        """Each memory's expiry set to now + its TTL when it is still at the version
        read and alive (LangGraph's ``refresh_ttl``): no new version, ``updated_at``
        kept; how many were refreshed. Each a Mem0 update of its own."""
        owner = self._owner(user_id, None)
        done = 0
        for item in items:
            ns, name = check_namespace(item.namespace), check_key(item.key)
            async with self._locked(owner, ns, name):
                now = datetime.now(timezone.utc)
                live = [r for r in await self._found(owner, ns, name) if is_live(r, now)]
                if not live or live[0]["metadata"].get(EXPIRES) is None:
                    continue
                head = live[0]
                if int(head["metadata"][VERSION]) != item.version:
                    continue
                expires = now + item.ttl
                await self._call(
                    "update",
                    head["id"],
                    metadata={EXPIRES: expires.isoformat()},
                    expiration_date=expires.date(),
                )
                done += 1
        return done

    async def asweep_expired(self, *, batch_size: int = 500) -> int:
        """Not supported: Mem0 lists memories only of one user at a time. Expired
        memories are never returned all the same; Mem0 hides them itself from the day
        after their expiry (its ``expiration_date``).

        Raises:
            ConfigError: Always.
        """
        raise ConfigError(
            "Mem0Store cannot sweep expired memories (Mem0 lists one user's at a time); "
            "they are never returned, and Mem0 hides them by their expiration_date"
        )

    async def areembed(self, *args: Any, **kwargs: Any) -> int:
        """Not supported: Mem0 keeps the vectors and embeds with its own embedder.

        Raises:
            ConfigError: Always.
        """
        raise ConfigError(
            "Mem0Store cannot re-embed: Mem0 keeps the vectors (re-add the memories "
            "through a Mem0 memory configured with the new embedder)"
        )

    async def aadd(
        self,
        user_id: Any,
        messages: str | list[dict[str, Any]],
        *,
        infer: bool | None = None,
        metadata: dict[str, Any] | None = None,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        ttl: float | timedelta | None = None,
        auth_policy: AuthPolicy | None = None,
    ) -> list[Memory]:
        """Mem0's own ``add``: with ``infer`` (None: this store's), Mem0's LLM reads the
        messages and decides the memories (each a new one: Mem0 adds, it does not
        rewrite); without, each user or assistant message is stored as it is. Each
        memory made gets its Mem0 id as its key, version 1, in ``namespace``.

        Returns:
            The memories made (possibly none), in Mem0's order.

        Raises:
            ConfigError: Bad arguments, or ``infer`` with a Mem0 memory that has no
                LLM (:func:`local_mem0` without ``llm``).
        """
        owner = self._owner(user_id, auth_policy)
        ns = check_namespace(namespace)
        check_metadata(metadata)
        now = datetime.now(timezone.utc)
        expires = check_ttl(ttl, now)
        infer = self.infer if infer is None else infer
        if not isinstance(infer, bool):
            raise ConfigError(f"infer must be True, False or None, not {infer!r}")
        made_fields = fields(ns, "", 1, dict(metadata or {}), expires)
        del made_fields[KEY]  # each its own, once Mem0 has named it
        try:
            added = await self._call(
                "add",
                messages,
                user_id=owner,
                metadata=made_fields,
                infer=infer,
                expiration_date=None if expires is None else expires.date(),
            )
        except Exception as exc:  # Mem0 wraps its LLM's errors: ours is the cause
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ConfigError):
                raise ConfigError(str(cause)) from exc
            raise
        made = []
        for result in added.get("results") or []:
            if result.get("event", "ADD") != "ADD":  # mem0ai 2.x (its "v3" add) only adds
                continue
            await self._call("update", result["id"], metadata={KEY: result["id"]})
            made.append(await self._read(result["id"], ns, result["id"]))
        return made

    async def asetup(self) -> None:
        """Nothing to make: Mem0 makes its collection when the memory is made."""

    def setup(self) -> None:
        """Synchronous :meth:`asetup`."""

    async def aclose(self) -> None:
        """Close the Mem0 memory: its history database (Mem0's ``close``) and its
        vector store's client (which Mem0's ``close`` leaves open)."""
        client = getattr(getattr(self.memory, "vector_store", None), "client", None)
        for close in (getattr(self.memory, "close", None), getattr(client, "close", None)):
            if callable(close):
                close()

    async def __aenter__(self) -> Mem0Store:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
