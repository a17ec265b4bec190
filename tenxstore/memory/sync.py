"""The sync twins of :class:`~tenxstore.memory.MemoryStore`'s methods: each async
method's name without its leading ``a``, the same arguments and result.

They run the async method on tenxstore's background event loop (the one of the
checkpointers' sync API, :mod:`tenxstore.twins`, and of the LangGraph saver's sync
methods), so its pooled connections serve every sync call of the process: from a
plain program, and from worker threads of an async application
(``await asyncio.to_thread(store.get, ...)``). Called from inside a running event
loop, a twin still works — it waits in a helper thread — but blocks that loop until
the call is done: in async code, await the async method instead (a task of that loop
holding a write of the same memory would make the twin wait for its lock).
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ..loops import SYNC_LOOP
from ..types import AuthPolicy, Memory, MemoryHit
from .validation import DEFAULT_NAMESPACE

__all__ = ["SyncTwins"]

T = TypeVar("T")
_SYNC = SYNC_LOOP  # the checkpointers' sync API's loop: one pool for both


def blocking(work: Awaitable[T], what: str) -> T:
    """Run ``work`` on the background loop and wait for it, from this thread or (when
    this thread runs an event loop) from a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _SYNC.run(work, what)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tenxstore-sync") as pool:
        return pool.submit(_SYNC.run, work, what).result()


class SyncTwins:
    """The synchronous methods (see the module)."""

    if TYPE_CHECKING:  # the async methods, as MemoryStore defines them
        astore: Callable[..., Awaitable[Memory]]
        asearch: Callable[..., Awaitable[builtins.list[MemoryHit]]]
        aget: Callable[..., Awaitable[Memory | None]]
        astore_many: Callable[..., Awaitable[builtins.list[Memory]]]
        aupdate: Callable[..., Awaitable[Memory]]
        adelete: Callable[..., Awaitable[bool]]
        ahistory: Callable[..., Awaitable[builtins.list[Memory]]]
        alist: Callable[..., Awaitable[builtins.list[Memory]]]
        alist_namespaces: Callable[..., Awaitable[builtins.list[tuple[str, ...]]]]
        asweep_expired: Callable[..., Awaitable[int]]
        areembed: Callable[..., Awaitable[int]]
        aclose: Callable[[], Awaitable[None]]

    def store(
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
        """Synchronous :meth:`~tenxstore.MemoryStore.astore`."""
        work = self.astore(
            user_id,
            content,
            metadata=metadata,
            namespace=namespace,
            key=key,
            ttl=ttl,
            auth_policy=auth_policy,
            embed=embed,
        )
        return blocking(work, "astore")

    def store_many(
        self,
        user_id: Any,
        memories: Iterable[Any],
        *,
        auth_policy: AuthPolicy | None = None,
        batch_size: int = 500,
        embed_batch_size: int = 64,
    ) -> builtins.list[Memory]:
        """Synchronous :meth:`~tenxstore.MemoryStore.astore_many`."""
        work = self.astore_many(
            user_id,
            memories,
            auth_policy=auth_policy,
            batch_size=batch_size,
            embed_batch_size=embed_batch_size,
        )
        return blocking(work, "astore_many")

    def search(
        self,
        user_id: Any,
        query: str,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        limit: int = 5,
        score_threshold: float = 0.0,
        filter: dict[str, Any] | None = None,
        auth_policy: AuthPolicy | None = None,
        mode: Literal["hybrid", "vector", "keyword"] | None = None,
    ) -> builtins.list[MemoryHit]:
        """Synchronous :meth:`~tenxstore.MemoryStore.asearch`."""
        work = self.asearch(
            user_id,
            query,
            namespace=namespace,
            limit=limit,
            score_threshold=score_threshold,
            filter=filter,
            auth_policy=auth_policy,
            mode=mode,
        )
        return blocking(work, "asearch")

    def get(
        self,
        user_id: Any,
        key: str,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        auth_policy: AuthPolicy | None = None,
    ) -> Memory | None:
        """Synchronous :meth:`~tenxstore.MemoryStore.aget`."""
        work = self.aget(user_id, key, namespace=namespace, auth_policy=auth_policy)
        return blocking(work, "aget")

    def update(
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
        """Synchronous :meth:`~tenxstore.MemoryStore.aupdate`."""
        work = self.aupdate(
            user_id,
            key,
            content=content,
            metadata=metadata,
            expected_version=expected_version,
            namespace=namespace,
            auth_policy=auth_policy,
            embed=embed,
        )
        return blocking(work, "aupdate")

    def delete(
        self,
        user_id: Any,
        key: str,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        auth_policy: AuthPolicy | None = None,
    ) -> bool:
        """Synchronous :meth:`~tenxstore.MemoryStore.adelete`."""
        work = self.adelete(user_id, key, namespace=namespace, auth_policy=auth_policy)
        return blocking(work, "adelete")

    def history(
        self,
        user_id: Any,
        key: str,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        auth_policy: AuthPolicy | None = None,
    ) -> builtins.list[Memory]:
        """Synchronous :meth:`~tenxstore.MemoryStore.ahistory`."""
        work = self.ahistory(user_id, key, namespace=namespace, auth_policy=auth_policy)
        return blocking(work, "ahistory")

    def list(
        self,
        user_id: Any,
        *,
        namespace: tuple[str, ...] = DEFAULT_NAMESPACE,
        limit: int = 50,
        offset: int = 0,
        auth_policy: AuthPolicy | None = None,
    ) -> builtins.list[Memory]:
        """Synchronous :meth:`~tenxstore.MemoryStore.alist`."""
        work = self.alist(
            user_id, namespace=namespace, limit=limit, offset=offset, auth_policy=auth_policy
        )
        return blocking(work, "alist")

    def list_namespaces(
        self,
        user_id: Any,
        *,
        prefix: tuple[str, ...] | None = None,
        suffix: tuple[str, ...] | None = None,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
        auth_policy: AuthPolicy | None = None,
    ) -> builtins.list[tuple[str, ...]]:
        """Synchronous :meth:`~tenxstore.MemoryStore.alist_namespaces`."""
        work = self.alist_namespaces(
            user_id,
            prefix=prefix,
            suffix=suffix,
            max_depth=max_depth,
            limit=limit,
            offset=offset,
            auth_policy=auth_policy,
        )
        return blocking(work, "alist_namespaces")

    def sweep_expired(self, *, batch_size: int = 500) -> int:
        """Synchronous :meth:`~tenxstore.MemoryStore.asweep_expired`."""
        return blocking(self.asweep_expired(batch_size=batch_size), "asweep_expired")

    def reembed(
        self,
        embedding: Any = None,
        *,
        batch_size: int = 100,
        text_of: Callable[[Memory], str | None] | None = None,
        missing: bool = False,
    ) -> int:
        """Synchronous :meth:`~tenxstore.MemoryStore.areembed`."""
        work = self.areembed(embedding, batch_size=batch_size, text_of=text_of, missing=missing)
        return blocking(work, "areembed")

    def close(self) -> None:
        """Synchronous :meth:`~tenxstore.MemoryStore.aclose`."""
        blocking(self.aclose(), "aclose")
