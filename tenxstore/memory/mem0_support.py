"""The Mem0 side of :class:`~tenxstore.memory.mem0.Mem0Store`: mem0 imported (its
telemetry off unless the environment turns it on), an offline Mem0 built
(:func:`local_mem0`), the Mem0 metadata fields of a memory's place, and the store's
sync twins (:class:`Mem0SyncTwins`).

Mem0 has no namespaces, caller-chosen keys, versions or TTLs in seconds: each memory a
Mem0Store writes carries them in its Mem0 metadata (:data:`NS` ... :data:`EXPIRES`),
and :func:`memory_of` reads a Mem0 result back as a tenxstore :class:`Memory`.
"""

from __future__ import annotations

import builtins
import importlib
import os
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..extras import require_extra
from ..types import AuthPolicy, Memory, MemoryHit
from .sync import blocking
from .validation import check_policy, check_scoped_user, split

__all__ = [
    "EXPIRES",
    "KEY",
    "META",
    "NS",
    "SCOPES",
    "UPDATED",
    "VERSION",
    "Mem0SyncTwins",
    "fields",
    "import_mem0",
    "is_live",
    "is_ours",
    "local_mem0",
    "mem0_user",
    "memory_of",
    "parse_time",
    "scopes",
]


NS, SCOPES, KEY, VERSION, META, EXPIRES, UPDATED = (
    "tenx_ns",
    "tenx_scopes",
    "tenx_key",
    "tenx_version",
    "tenx_metadata",
    "tenx_expires_at",
    "tenx_updated_at",
)
"""The Mem0 metadata fields a :class:`Mem0Store` keeps each memory's place in: its
namespace (labels joined with ``.``), every prefix of it (a namespace search is a
match on one), its key, its version, the caller's metadata (one field, so an update
replaces it whole and it never meets Mem0's own fields), its expiry and when its
version was written (ISO times: Mem0's own ``updated_at`` moves on a TTL refresh too)."""


def import_mem0() -> Any:
    """The ``mem0`` package, telemetry off unless the environment says otherwise."""
    os.environ.setdefault("MEM0_TELEMETRY", "False")
    require_extra("mem0", "mem0", needed_by="Mem0Store")
    return importlib.import_module("mem0")  # untyped: Any


class _NoLLM:
    """The LLM of a Mem0 memory made without one: any call is an error (``infer=True``
    needs a real LLM). ``calls`` counts the attempts."""

    def __init__(self) -> None:
        self.calls = 0

    def generate_response(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise ConfigError(
            "this Mem0 memory has no LLM (local_mem0(..., llm=None)): infer=True needs "
            "one; store with infer=False, or give local_mem0 an llm"
        )


class _Embedder:
    """A tenxstore :class:`~tenxstore.embeddings.Embedding` as Mem0's embedder."""

    def __init__(self, embedding: Any) -> None:
        self.embedding = embedding
        self.config = None

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        return list(self.embedding.embed_query(text))


def local_mem0(
    path: str | os.PathLike[str],
    *,
    embedding: Any,
    history_db_path: str | os.PathLike[str] | None = None,
    collection_name: str = "tenxstore",
    llm: Any = None,
    asynchronous: bool = True,
) -> Any:
    """A Mem0 ``AsyncMemory`` (``asynchronous=False``: ``Memory``) that needs no
    network: Qdrant in local mode at ``path``, its history database beside it, each
    text embedded by ``embedding``, and no LLM unless one is given.

    Args:
        path: The local Qdrant directory.
        embedding: A tenxstore :class:`~tenxstore.embeddings.Embedding`, a LangChain
            ``Embeddings`` or a function of texts to vectors (see
            :func:`~tenxstore.embeddings.as_embedding`), e.g.
            ``tenxstore.embeddings.LocalEmbedding()``.
        history_db_path: Mem0's SQLite history (None: ``history.db`` in ``path``).
        collection_name: The Qdrant collection.
        llm: An object with Mem0's LLM method ``generate_response`` (used only by
            ``infer=True``); None: one that raises ``ConfigError`` when called.

    Mem0 takes an embedder by provider name only (an object only through LangChain's
    ``Embeddings`` and the ``langchain`` package); this builds the memory with the
    ``openai`` provider and a placeholder key, which it never calls, then sets its
    ``embedding_model`` (and ``llm``) to the ones given.

    Raises:
        ConfigError: mem0ai is not installed.
    """
    from ..embeddings import as_embedding

    mem0 = import_mem0()
    MemoryConfig = importlib.import_module("mem0.configs.base").MemoryConfig

    chosen = as_embedding(embedding)
    os.makedirs(path, exist_ok=True)
    history = history_db_path or os.path.join(os.fspath(path), "history.db")
    config = MemoryConfig(
        vector_store={
            "provider": "qdrant",
            "config": {
                "path": os.fspath(path),
                "collection_name": collection_name,
                "embedding_model_dims": chosen.dims,
            },
        },
        embedder={"provider": "openai", "config": {"api_key": "unused-by-tenxstore"}},
        llm={"provider": "openai", "config": {"api_key": "unused-by-tenxstore"}},
        history_db_path=os.fspath(history),
    )
    memory = (mem0.AsyncMemory if asynchronous else mem0.Memory)(config)
    memory.embedding_model = _Embedder(chosen)
    memory.llm = _NoLLM() if llm is None else llm
    return memory


def mem0_user(user_id: Any, auth_policy: AuthPolicy | None) -> str:
    """The user of a Mem0Store call: always scoped (Mem0 scopes every memory to its
    ``user_id``), a str (7 and "7" would be one Mem0 user), without whitespace.

    Raises:
        ConfigError: A missing or invalid id, one with whitespace (Mem0 trims or
            refuses it: two ids would name one user), or a policy lifting isolation.
    """
    policy = check_policy(auth_policy)
    if policy is not None and not policy.enforce_user_isolation:
        raise ConfigError(
            "Mem0Store cannot lift user isolation (AuthPolicy(enforce_user_isolation="
            "False)): every Mem0 memory belongs to one Mem0 user_id"
        )
    owner: str = check_scoped_user(user_id, "string")
    if any(c.isspace() for c in owner):
        raise ConfigError(
            f"user_id {owner!r} holds whitespace, which Mem0 trims or refuses (two "
            "ids would name one user): use an id without whitespace"
        )
    return owner


def parse_time(text: Any) -> datetime:
    """A time Mem0 or this module wrote (ISO 8601; a naive one is UTC)."""
    found = datetime.fromisoformat(str(text))
    return found if found.tzinfo else found.replace(tzinfo=timezone.utc)


def memory_of(raw: dict[str, Any]) -> Memory:
    """A Mem0 result (``get``/``get_all``/``search``) as a tenxstore memory."""
    extra = raw.get("metadata") or {}
    expires = extra.get(EXPIRES)
    return Memory(
        key=extra[KEY],
        namespace=split(extra[NS]),
        user_id=raw.get("user_id"),
        content=raw.get("memory") or "",
        metadata=dict(extra.get(META) or {}),
        version=int(extra.get(VERSION) or 1),
        created_at=parse_time(raw["created_at"]),
        updated_at=parse_time(extra.get(UPDATED) or raw["created_at"]),
        expires_at=None if expires is None else parse_time(expires),
    )


def is_ours(raw: dict[str, Any]) -> bool:
    """A Mem0 memory a Mem0Store wrote (or tagged): one with a key and namespace."""
    extra = raw.get("metadata") or {}
    return isinstance(extra.get(KEY), str) and isinstance(extra.get(NS), str)


def is_live(raw: dict[str, Any], now: datetime) -> bool:
    """Whether a Mem0 result is not expired at ``now``."""
    expires = (raw.get("metadata") or {}).get(EXPIRES)
    return expires is None or parse_time(expires) > now


def scopes(ns: str) -> list[str]:
    """Every prefix of a stored namespace, itself included (what a search matches)."""
    labels = split(ns)
    return [".".join(labels[: i + 1]) for i in range(len(labels))]


def fields(
    ns: str,
    name: str,
    version: int,
    metadata: Any,
    expires: datetime | None,
    updated: datetime | None = None,
) -> dict[str, Any]:
    """The Mem0 metadata of a memory written at this place, version and expiry
    (``updated``: when this version was written; None for a first version, whose
    ``updated_at`` is Mem0's ``created_at``)."""
    return {
        NS: ns,
        SCOPES: scopes(ns),
        KEY: name,
        VERSION: version,
        META: metadata,
        EXPIRES: None if expires is None else expires.isoformat(),
        UPDATED: None if updated is None else updated.isoformat(),
    }


class Mem0SyncTwins:
    """The synchronous methods of :class:`~tenxstore.memory.mem0.Mem0Store`: each
    async method's name without its leading ``a``, run as
    :class:`~tenxstore.MemoryStore`'s twins run (:mod:`tenxstore.memory.sync`)."""

    if TYPE_CHECKING:  # the async methods, as Mem0Store defines them
        astore: Callable[..., Awaitable[Memory]]
        aget: Callable[..., Awaitable[Memory | None]]
        aupdate: Callable[..., Awaitable[Memory]]
        adelete: Callable[..., Awaitable[bool]]
        asearch: Callable[..., Awaitable[builtins.list[MemoryHit]]]
        aadd: Callable[..., Awaitable[builtins.list[Memory]]]
        alist: Callable[..., Awaitable[builtins.list[Memory]]]
        alist_namespaces: Callable[..., Awaitable[builtins.list[tuple[str, ...]]]]
        astore_many: Callable[..., Awaitable[builtins.list[Memory]]]

    def store(self, user_id: Any, content: str, **kwargs: Any) -> Memory:
        """Synchronous :meth:`astore` (the same keyword arguments)."""
        return blocking(self.astore(user_id, content, **kwargs), "astore")

    def get(self, user_id: Any, key: str, **kwargs: Any) -> Memory | None:
        """Synchronous :meth:`aget`."""
        return blocking(self.aget(user_id, key, **kwargs), "aget")

    def update(self, user_id: Any, key: str, **kwargs: Any) -> Memory:
        """Synchronous :meth:`aupdate`."""
        return blocking(self.aupdate(user_id, key, **kwargs), "aupdate")

    def delete(self, user_id: Any, key: str, **kwargs: Any) -> bool:
        """Synchronous :meth:`adelete`."""
        return blocking(self.adelete(user_id, key, **kwargs), "adelete")

    def search(self, user_id: Any, query: str, **kwargs: Any) -> builtins.list[MemoryHit]:
        """Synchronous :meth:`asearch`."""
        return blocking(self.asearch(user_id, query, **kwargs), "asearch")

    def add(self, user_id: Any, messages: Any, **kwargs: Any) -> builtins.list[Memory]:
        """Synchronous :meth:`aadd`."""
        return blocking(self.aadd(user_id, messages, **kwargs), "aadd")

    def list(self, user_id: Any, **kwargs: Any) -> builtins.list[Memory]:
        """Synchronous :meth:`alist`."""
        return blocking(self.alist(user_id, **kwargs), "alist")

    def list_namespaces(self, user_id: Any, **kwargs: Any) -> builtins.list[tuple[str, ...]]:
        """Synchronous :meth:`alist_namespaces`."""
        return blocking(self.alist_namespaces(user_id, **kwargs), "alist_namespaces")

    def store_many(
        self, user_id: Any, memories: Iterable[Any], **kwargs: Any
    ) -> builtins.list[Memory]:
        """Synchronous :meth:`astore_many`."""
        return blocking(self.astore_many(user_id, memories, **kwargs), "astore_many")
