"""TenxStore: a LangGraph ``BaseStore`` on :class:`~tenxstore.MemoryStore` (or a
:class:`~tenxstore.memory.Mem0Store`).

``graph.compile(checkpointer=..., store=TenxStore(MemoryStore(cp)))`` gives a graph
long-term memory in the checkpointer's own database. Each item is one user's memory
(the value shape is in :mod:`tenxstore.langgraph.items`): the user is the store's own
(``user_id=`` / :meth:`TenxStore.for_user`) or the run's (``user_id`` in the run
config), so two users' runs of one graph never see each other's items.

A batch runs as LangGraph's stores run one: its reads first, in order, against the
items as they were before the batch; then its writes, one per item (the last one for
an item wins): its deletes each committed on its own, then its puts in ONE transaction
(:meth:`MemoryStore.astore_many`). A batch stopped halfway (cancelled, or a write that
failed) has made the deletes before that point, each whole, and all its puts or none.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any

from langgraph.store.base import (
    BaseStore,
    Item,
    Op,
    Result,
    SearchItem,
    TTLConfig,
)

from ..errors import ConfigError
from ..memory import search
from ..memory.bulk import NewMemory
from ..memory.expiry import Refresh, arefresh
from ..memory.mem0 import Mem0Store
from ..memory.store import MemoryStore
from ..memory.sync import blocking as run_blocking  # the memory store's loop and pool
from ..memory.validation import (
    MAX_LIMIT,
    MAX_QUERY,
    SHARED_USER,
    check_policy,
    check_scoped_user,
    shared_access,
    shared_owner,
)
from ..types import AuthPolicy, Memory
from ..validate import IdType
from .items import Predicate, matches, ttl_minutes, value_of
from .ops import Get, Listing, Put, Search, prepare
from .ttl import TTLSweeper, check_ttl_config

__all__ = ["SHARED_USER", "TenxStore", "run_config", "shared_owner"]

SCOPED = AuthPolicy(enforce_user_isolation=True)
"""Given to the memory store's listings and searches: scoped to the one owner."""


def run_config() -> Mapping[str, Any] | None:
    """The config of the LangGraph run this code runs in, or None (outside a run, or
    in async code on Python 3.10, where LangGraph cannot pass it on)."""
    try:
        from langgraph.config import get_config
    except ImportError:  # langgraph-checkpoint without langgraph: no runs to ask
        return None
    try:
        return get_config()
    except RuntimeError:
        return None


def _context_user(configurable: Mapping[str, Any]) -> Any:
    """``user_id`` of the run's context (``graph.invoke(..., context=...)``), if any:
    LangGraph keeps the run's ``Runtime`` among the configurable values it passes on."""
    try:
        from langgraph.runtime import Runtime
    except ImportError:
        return None
    runtime = next((v for v in configurable.values() if isinstance(v, Runtime)), None)
    context = getattr(runtime, "context", None)
    if isinstance(context, Mapping):
        return context.get("user_id")
    return getattr(context, "user_id", None)


def _indexed(
    memory_store: MemoryStore, index: Mapping[str, Any]
) -> tuple[MemoryStore, dict[str, Any], list[tuple[str, Any]]]:
    """The memory store searched with an ``IndexConfig``'s embedding, the config (as
    LangGraph's stores keep it), and its fields tokenized."""
    from langgraph.store.base.embed import tokenize_path

    from ..embeddings import as_embedding

    if not isinstance(index, Mapping):
        raise ConfigError(f"index must be a LangGraph IndexConfig (a dict), not {index!r}")
    config = dict(index)
    unknown = set(config) - {"dims", "embed", "fields", "__tokenized_fields", "__embedding"}
    if unknown:
        raise ConfigError(f"index has keys LangGraph's IndexConfig has not: {sorted(unknown)}")
    fields = config.get("fields") or ["$"]
    if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
        raise ConfigError(f"index['fields'] must be a list of paths, not {fields!r}")
    tokenized = [(p, p if p == "$" else tokenize_path(p)) for p in fields]
    embedding = config.get("__embedding")
    if embedding is None:
        embed, dims = config.get("embed"), config.get("dims")
        if embed is None:
            embedding = memory_store.embedding
            if embedding is None:
                raise ConfigError("index needs 'embed' (the memory store has no embedding)")
        elif isinstance(embed, str):
            from langgraph.store.base.embed import ensure_embeddings

            embedding = as_embedding(ensure_embeddings(embed), dims=dims, model_id=embed)
        else:
            embedding = as_embedding(embed, dims=dims)
    if (dims := config.get("dims")) and dims != embedding.dims:
        raise ConfigError(f"index['dims'] is {dims}, and the embedding's is {embedding.dims}")
    config.update(__tokenized_fields=tokenized, __embedding=embedding, dims=embedding.dims)
    if memory_store.embedding is not embedding:
        memory_store = memory_store.with_embedding(embedding)
    return memory_store, config, tokenized


def _item(memory: Memory, value: dict[str, Any]) -> Item:
    return Item(
        value=value,
        key=memory.key,
        namespace=memory.namespace,
        created_at=memory.created_at,
        updated_at=memory.updated_at,
    )


class TenxStore(TTLSweeper, BaseStore):
    """LangGraph's ``BaseStore`` on a :class:`~tenxstore.MemoryStore`: sync and async,
    every op, TTLs, and a user per call.

    Args:
        memory_store: The memories it reads and writes (its database, key ring and
            isolation): a ``MemoryStore``, or a :class:`~tenxstore.memory.Mem0Store`
            (Mem0 keeps them; no ``index``; see docs/memory.md).
        user_id: Act for this user; None: the user of each call is ``user_id`` of the
            LangGraph run it is made in (``config["configurable"]["user_id"]``, or the
            run's ``context``), required while user isolation applies.
        index: LangGraph's ``IndexConfig`` (search by meaning): ``embed`` (a LangChain
            ``Embeddings``, a function of texts to vectors, sync or async, a
            tenxstore :class:`~tenxstore.embeddings.Embedding`, or a provider string
            such as ``"openai:text-embedding-3-small"``), ``dims``, and ``fields``
            (the paths of a value that are embedded, default ``["$"]``: the whole
            value as JSON; a put's ``index=`` overrides them, ``index=False`` stores
            no vector). The texts at an item's fields are embedded together as one
            vector (LangGraph's own stores keep one per field). Searches with a query
            are then hybrid (vector and keyword ranks fused). Without it, over a
            memory store that has an embedding, it is ``{}``: that embedding, each
            item's whole value embedded (``fields`` ``["$"]``), so puts keep the
            vectors its hybrid searches read; over one without, a search ranks by
            the keyword index and returns what LangGraph's stores return without
            one.
        ttl: LangGraph's ``TTLConfig``: ``default_ttl`` (minutes), ``refresh_on_read``
            (default True), ``sweep_interval_minutes`` (for :meth:`start_ttl_sweeper`).
            Expired items are never returned, swept or not.
        auth_policy: An ``AuthPolicy`` made by server code for the calls whose run
            config has none: ``AuthPolicy(enforce_user_isolation=False)`` makes the
            store one shared by every run (owned by :data:`SHARED_USER`).

    Raises:
        ConfigError: An invalid argument.
    """

    supports_ttl = True

    def __init__(
        self,
        memory_store: MemoryStore | Mem0Store,
        *,
        user_id: Any = None,
        index: Mapping[str, Any] | None = None,
        ttl: TTLConfig | None = None,
        auth_policy: AuthPolicy | None = None,
    ) -> None:
        if not isinstance(memory_store, (MemoryStore, Mem0Store)):
            raise ConfigError(
                "TenxStore takes a tenxstore.MemoryStore or a tenxstore.memory.Mem0Store, "
                f"not {type(memory_store).__name__}"
            )
        self.index_config: dict[str, Any] | None = None
        self._fields: list[tuple[str, Any]] | None = None
        if isinstance(memory_store, Mem0Store):
            if index is not None:
                raise ConfigError(
                    "TenxStore over a Mem0Store takes no index: Mem0 embeds each item's "
                    "value (its JSON) with its own embedder"
                )
            self._kind: IdType = "string"
        else:
            if index is None and memory_store.embedding is not None:
                index = {}  # the store's embedding: puts write the vectors searches read
            if index is not None:
                memory_store, self.index_config, self._fields = _indexed(memory_store, index)
            self._kind = memory_store.base.settings.user_id_type
        self.memory_store: MemoryStore | Mem0Store = memory_store
        self.user_id = None if user_id is None else check_scoped_user(user_id, self._kind)
        self.auth_policy = check_policy(auth_policy)
        self.ttl_config = check_ttl_config(ttl)
        TTLSweeper.__init__(self)

    def for_user(self, user_id: Any) -> TenxStore:
        """This store, acting for one user (the server's authenticated user)."""
        return type(self)(
            self.memory_store,
            user_id=user_id,
            index=self.index_config,
            ttl=self.ttl_config,
            auth_policy=self.auth_policy,
        )

    def embedded_text(self, value: Mapping[str, Any], index: Any = None) -> str | None:
        """The text of a value that is embedded (its fields' texts, one per line), or
        None: no vector (no index, ``index=False``, or nothing at its fields)."""
        if self._fields is None or index is False:
            return None
        from langgraph.store.base.embed import get_text_at_path, tokenize_path

        fields = self._fields
        if isinstance(index, list):
            fields = [(p, p if p == "$" else tokenize_path(p)) for p in index]
        texts = [t for _, path in fields for t in get_text_at_path(dict(value), path)]
        return "\n".join(texts) if texts else None

    async def areembed(self, embedding: Any = None, *, batch_size: int = 100) -> int:
        """Redo the vectors of the items (:meth:`~tenxstore.MemoryStore.areembed`),
        embedding each item's fields as a put does."""
        from .items import VALUE_TAG

        def text_of(memory: Memory) -> str | None:
            value = value_of(memory)
            if isinstance(memory.metadata.get(VALUE_TAG), dict) or self._fields:
                return self.embedded_text(value)
            return memory.content

        return await self.memory_store.areembed(embedding, batch_size=batch_size, text_of=text_of)

    # -- whose items ---------------------------------------------------------------

    def owner(self, config: Mapping[str, Any] | None = None) -> Any:
        """The user whose items a call made now reads and writes (see the class).

        Args:
            config: A run config (a tool's injected config); None: the config of the
                LangGraph run this code runs in, if any.

        Raises:
            ConfigError: Isolation applies and no user is known (the message says how
                to name one), or the config names another user than the store's.
        """
        config = run_config() if config is None else config
        if config is not None and not isinstance(config, Mapping):
            raise ConfigError(f"config must be a dict, not {type(config).__name__}")
        conf: Mapping[str, Any] = {}
        inner: Mapping[str, Any] = {}
        if config is not None:
            found = config.get("configurable") or {}
            inner = found if isinstance(found, Mapping) else {}
            conf = {**config, **inner}
        policy = check_policy(conf.get("auth_policy")) or self.auth_policy
        isolated = (
            self.memory_store.enforce_user_isolation
            if policy is None
            else policy.enforce_user_isolation
        )
        given = conf.get("user_id")
        if given is None:
            given = _context_user(inner)
        if self.user_id is not None:
            if isolated and given is not None and given != self.user_id:
                raise ConfigError(
                    f"this store acts for user {self.user_id!r}; the run names {given!r}"
                )
            return self.user_id
        if not isolated:
            return shared_owner(self._kind)
        if given is None:
            hint = ""
            if sys.version_info < (3, 11) and config is None:
                hint = (
                    " (on Python 3.10 LangGraph cannot pass the run's config to async "
                    "code: bind the store to the user)"
                )
            raise ConfigError(
                "TenxStore has no user for this call and user isolation applies: run the "
                "graph with config={'configurable': {'user_id': ...}}, or bind the store "
                "(TenxStore(memory_store, user_id=...) or store.for_user(user_id)); a "
                "store every user shares needs isolation off (MemoryStore(..., "
                "enforce_user_isolation=False)) or an AuthPolicy(enforce_user_isolation="
                f"False) from server code{hint}"
            )
        return check_scoped_user(given, self._kind)

    def _ready(self, ops: Iterable[Op]) -> tuple[Any, list[Any]]:
        """The calls' owner and the ops checked, before any I/O."""
        if isinstance(ops, (str, bytes, Mapping)):
            raise ConfigError("ops must be an iterable of store operations")
        prepared = [prepare(op) for op in ops]
        return self.owner(), prepared

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the ops (see the module), waiting for them; from any thread, and from
        inside a running event loop too (blocking it: await :meth:`abatch` there)."""
        owner, prepared = self._ready(ops)  # the run's user, read in the caller's context
        return run_blocking(self._execute(owner, prepared), "abatch")

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the ops (see the module)."""
        owner, prepared = self._ready(ops)
        return await self._execute(owner, prepared)

    # -- running them --------------------------------------------------------------

    def acting_for(self, owner: Any) -> AbstractContextManager[None]:
        """Where calls for ``owner`` (what :meth:`owner` gave) run: with access to the
        shared items when it is :data:`SHARED_USER` (only :meth:`owner` gives it,
        for a store to which isolation does not apply: a caller's id never is)."""
        return shared_access() if owner == shared_owner(self._kind) else nullcontext()

    async def _execute(self, owner: Any, prepared: list[Any]) -> list[Result]:
        with self.acting_for(owner):
            return await self._run(owner, prepared)

    async def _run(self, owner: Any, prepared: list[Any]) -> list[Result]:
        results: list[Result] = [None] * len(prepared)
        refresh: list[Refresh] = []
        writes: dict[tuple[tuple[str, ...], str], Put] = {}
        for i, op in enumerate(prepared):
            if isinstance(op, Put):
                writes[(op.namespace, op.key)] = op  # the first position, the last value
            elif isinstance(op, Get):
                results[i] = await self._get(owner, op, refresh)
            elif isinstance(op, Search):
                results[i] = await self._search(owner, op, refresh)
            else:
                results[i] = await self._list(owner, op)
        store = self.memory_store
        if refresh:
            if isinstance(store, Mem0Store):  # Mem0's own writes
                await store.arefresh(owner, refresh)
            else:
                await arefresh(store, owner, refresh)
        puts: list[NewMemory] = []
        for w in writes.values():
            if w.content is None:
                await store.adelete(owner, w.key, namespace=w.namespace)
            else:
                seconds = None if w.ttl is None else w.ttl * 60
                text = None if w.value is None else self.embedded_text(w.value, w.fields)
                puts.append(
                    NewMemory(
                        w.content, metadata=w.metadata, namespace=w.namespace, key=w.key,
                        ttl=seconds, embed=False if text is None else text,
                    )
                )  # fmt: skip
        if puts:  # in one transaction, their vectors embedded in batches before it
            await store.astore_many(owner, puts)
        return results

    @staticmethod
    def _refresh(memory: Memory, wanted: bool, into: list[Refresh]) -> None:
        minutes = ttl_minutes(memory) if wanted else None
        if minutes is not None:
            into.append(
                Refresh(memory.namespace, memory.key, memory.version, timedelta(minutes=minutes))
            )

    async def _get(self, owner: Any, op: Get, refresh: list[Refresh]) -> Item | None:
        if not op.namespace:
            return None  # no item lives in the empty namespace
        memory = await self.memory_store.aget(owner, op.key, namespace=op.namespace)
        if memory is None:
            return None
        self._refresh(memory, op.refresh, refresh)
        return _item(memory, value_of(memory))

    async def _scan(
        self,
        owner: Any,
        prefix: tuple[str, ...],
        keep: Predicate | None,
        need: int,
        skip: set[tuple[tuple[str, ...], str]],
    ) -> list[tuple[Memory, dict[str, Any]]]:
        """The first ``need`` memories under ``prefix`` that ``keep`` keeps (and not in
        ``skip``), most recently written first, read a page at a time."""
        found: list[tuple[Memory, dict[str, Any]]] = []
        if need <= 0:
            return found
        page = min(MAX_LIMIT, need if keep is None and not skip else max(need, 100))
        for start in range(0, 2**62, page):
            memories = await self.memory_store.alist(
                owner, namespace=prefix, limit=page, offset=start, auth_policy=SCOPED
            )
            for memory in memories:
                if (memory.namespace, memory.key) in skip:
                    continue
                value = value_of(memory)
                if keep is None or keep(value):
                    found.append((memory, value))
                    if len(found) == need:
                        return found
            if len(memories) < page:
                break
        return found

    async def _ranked(
        self, owner: Any, op: Search, text: str, need: int
    ) -> tuple[list[tuple[Memory, dict[str, Any], float]], set[tuple[tuple[str, ...], str]]]:
        """The keyword matches that the filter keeps, best first (at most ``need``),
        and every match read."""
        asked = min(MAX_LIMIT, max(need, 10))
        while True:
            hits = await self.memory_store.asearch(
                owner, text, namespace=op.prefix, limit=asked, auth_policy=SCOPED
            )
            kept = [(h.memory, value_of(h.memory), h.score) for h in hits]
            kept = [k for k in kept if op.keep is None or op.keep(k[1])]
            if len(kept) >= need or len(hits) < asked or asked == MAX_LIMIT:
                read = {(h.memory.namespace, h.memory.key) for h in hits}
                return kept[:need], read
            asked = min(MAX_LIMIT, asked * 4)

    async def _search(self, owner: Any, op: Search, refresh: list[Refresh]) -> list[SearchItem]:
        need = op.offset + op.limit
        if not op.limit:
            return []
        text = None
        by_meaning = self.memory_store.embedding is not None
        if op.query is not None and (self.memory_store.keyword_index or by_meaning):
            # the query only ranks: its first characters, as text the index can read
            text = op.query[:MAX_QUERY].replace("\x00", " ").encode("utf-8", "replace").decode()
            if not by_meaning and not search.query_words(text):
                text = None
        scored: list[tuple[Memory, dict[str, Any], float | None]] = []
        read: set[tuple[tuple[str, ...], str]] = set()
        if text is not None:
            ranked, read = await self._ranked(owner, op, text, need)
            scored.extend(ranked)
        if len(scored) < need:  # then the others, as LangGraph's stores list them
            rest = await self._scan(owner, op.prefix, op.keep, need - len(scored), read)
            scored.extend((memory, value, None) for memory, value in rest)
        found = []
        for memory, value, score in scored[op.offset : need]:
            self._refresh(memory, op.refresh, refresh)
            found.append(
                SearchItem(
                    namespace=memory.namespace,
                    key=memory.key,
                    value=value,
                    created_at=memory.created_at,
                    updated_at=memory.updated_at,
                    score=score,
                )
            )
        return found

    async def _list(self, owner: Any, op: Listing) -> list[tuple[str, ...]]:
        head: tuple[str, ...] = ()
        for c in op.conditions:  # the labels before a wildcard narrow the read
            if c.match_type == "prefix":
                literal = []
                for label in c.path:
                    if label == "*":
                        break
                    literal.append(label)
                head = tuple(literal)
                break
        namespaces: list[tuple[str, ...]] = []
        for start in range(0, 2**62, MAX_LIMIT):
            page = await self.memory_store.alist_namespaces(
                owner, prefix=head or None, limit=MAX_LIMIT, offset=start, auth_policy=SCOPED
            )
            namespaces.extend(page)
            if len(page) < MAX_LIMIT:
                break
        kept = [ns for ns in namespaces if all(matches(c, ns) for c in op.conditions)]
        if op.max_depth is not None:
            kept = sorted({ns[: op.max_depth] for ns in kept})
        return kept[op.offset : op.offset + op.limit]
