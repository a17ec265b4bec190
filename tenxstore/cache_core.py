"""What every part of :class:`~tenxstore.cache.CachedCheckpointer` shares.

The wrapped checkpointer (``.inner``) and what it tells of itself, the Redis side
(``_redis``, None for a preset without a cache), the keys of a thread, and the
guarded put that every write and refill ends in. The parts — writes, reads, fences,
what passes through — are mixins of :class:`CacheCore`, assembled in
:mod:`tenxstore.cache`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from .cache_entries import entry_body
from .cache_keys import cache_key
from .config import RunIds, read_config, recorded_incarnation
from .crypto import KeyRing
from .langgraph.tables import LangGraphTables
from .protocol import Checkpointer
from .redis_cache import BLANKET, MAX_PUT_AGE, Fence, RedisCache
from .store import Store
from .types import AuthPolicy
from .validate import IdType

__all__ = ["CacheCore"]


class CacheCore:
    """The state and the steps the cache decorator's parts share (see the module)."""

    inner: Checkpointer
    keys: KeyRing | None
    cache_ttl: float | None
    _namespaced: bool
    _prefix: str | None
    _base_prefix: str
    _redis: RedisCache | None

    @property
    def redis(self) -> Any:
        """The Redis client of the running loop, or None for a preset without a cache."""
        return None if self._redis is None else self._redis.client

    @property
    def engine(self) -> AsyncEngine:
        """The wrapped repository's SQLAlchemy engine (of the running event loop), for
        instrumentation such as ``opentelemetry-instrumentation-sqlalchemy``."""
        return self.inner.engine

    @property
    def store(self) -> Store:
        """The wrapped checkpointer's :class:`~tenxstore.store.Store`."""
        return self.inner.store

    @property
    def key_prefix(self) -> str:
        """The prefix of every key (the default's namespace once the store is known)."""
        return self._prefix or self._base_prefix

    @property
    def pending_invalidations(self) -> int:
        """Invalidations that could not reach Redis yet (sent first once it answers)."""
        return 0 if self._redis is None else self._redis.status().pending_invalidations

    @property
    def state_history_limit(self) -> int:
        """State versions the wrapped repository retains per thread."""
        return self.inner.state_history_limit

    @property
    def enforce_user_isolation(self) -> bool:
        """Whether calls are scoped to ``config["user_id"]`` by default."""
        return self.inner.enforce_user_isolation

    @property
    def tool_lease_seconds(self) -> float:
        """Lease of a tool-call claim."""
        return self.inner.tool_lease_seconds

    @property
    def id_type(self) -> IdType:
        """Type of ``thread_id``."""
        return self.inner.id_type

    @property
    def user_id_type(self) -> IdType:
        """Type of ``user_id``."""
        return self.inner.user_id_type

    @property
    def langgraph(self) -> LangGraphTables:
        """The LangGraph tables of the wrapped repository."""
        return self.inner.langgraph

    def _ids(self, config: object) -> RunIds:
        inner = self.inner
        return read_config(
            config,
            isolation=inner.enforce_user_isolation,
            id_type=inner.id_type,
            user_id_type=inner.user_id_type,
        )

    async def _key_prefix(self) -> str:
        if self._prefix is None:
            self._prefix = f"{self._base_prefix}:{await self.inner.astore_id()}"
        return self._prefix

    async def _keys(self, thread_id: Any, owner: Any) -> tuple[str, str | None]:
        """(the unscoped key, the owner's scoped key or None) of a thread."""
        prefix = await self._key_prefix()
        scoped = None if owner is None else cache_key(prefix, thread_id, owner, True)
        return cache_key(prefix, thread_id, None, False), scoped

    async def _put(
        self,
        key: str,
        state: dict[str, Any],
        version: int,
        incarnation: int | None,
        fences: Iterable[tuple[str, Fence]],
        prepared: float,
        text: str | None = None,
        thread_id: Any = None,
        user: Any = None,
        *,
        master: str,
    ) -> bool:
        """The guarded put of ``key`` (of ``user``'s calls; None: the unscoped key) with
        fences of other keys; a put prepared too long ago (or a state that cannot be
        cached) only fences, as does one prepared under another master than ``master``
        (the one known when the put was prepared)."""
        redis = self._redis
        assert redis is not None
        body = entry_body(state, text, self.keys, thread_id, key, version, incarnation, user)
        if body is None or time.monotonic() - prepared > MAX_PUT_AGE:
            own = (incarnation, version) if incarnation is not None else BLANKET
            await redis.fence([(key, own), *fences])
            return False
        return await redis.put(key, body, version, incarnation, fences, master=master) == 1

    async def _incarnation(self, ids: RunIds) -> int | None:
        """The thread's incarnation in the database (None: absent, or not the caller's)."""
        probe: dict[str, Any] = {
            "thread_id": ids.thread_id,
            "user_id": ids.user_id,
            "auth_policy": AuthPolicy(ids.isolated),
        }
        await self.inner.aget_state(probe)  # records the incarnation it read
        return recorded_incarnation(probe)
