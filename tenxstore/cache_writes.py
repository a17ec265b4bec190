"""The state written through the cache: to the database first, then to Redis.

After the commit, one guarded put stores the new state under the caller's key and
fences the other isolation mode's key at the new version; a stale write drops the
caller's entry. :meth:`CacheWrites.aput_state_cache` writes Redis alone, never
creating an entry on its own word.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from .cache_core import CacheCore
from .cache_entries import entry_body
from .cache_keys import cache_key
from .config import recorded_incarnation
from .errors import StaleStateError
from .serde import encode_state
from .telemetry import traced
from .types import Commit
from .validate import check_count

__all__ = ["CacheWrites"]

_EMPTY = 2  # RedisCache.put: the key was empty and the put may not create it


class CacheWrites(CacheCore):
    """The state's writes of :class:`~tenxstore.cache.CachedCheckpointer`."""

    @traced(write=True)
    async def aput_checkpoint(
        self,
        config: dict[str, Any],
        state: dict[str, Any],
        messages: Iterable[dict[str, Any]] = (),
        *,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Durable write (see the repository), then refresh the cache.

        On ``StaleStateError`` the cached entry is dropped before the error propagates,
        so the run's next read comes from the database (a fence stays).
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
        """:meth:`aput_checkpoint`, returning the repository's :class:`Commit`."""
        ids = self._ids(config)
        redis = self._redis
        master = ""
        if redis is not None:  # named before the write: its put lands only on that master
            known = self._prefix  # (no database read before the write checks its input)
            at = (
                None
                if known is None
                else cache_key(known, ids.thread_id, ids.user_id, ids.isolated)
            )
            master = await redis.master(at)
        prepared = time.monotonic()
        try:
            commit = await self.inner.acommit(config, state, messages, meta=meta)
        except StaleStateError:
            if redis is not None:
                prefix = await self._key_prefix()
                await redis.drop([cache_key(prefix, ids.thread_id, ids.user_id, ids.isolated)])
            raise
        if redis is not None:
            unscoped, scoped = await self._keys(commit.thread_id, commit.user_id)
            own, other = (scoped, unscoped) if ids.isolated else (unscoped, scoped)
            assert own is not None
            fence = (commit.incarnation, commit.version)
            others = [] if other is None else [(other, fence)]
            await self._put(
                own,
                state,
                commit.version,
                commit.incarnation,
                others,
                prepared,
                commit.state_text,
                commit.thread_id,
                commit.user_id if ids.isolated else None,
                master=master,
            )
        return commit

    @traced(write=True)
    async def aput_state(
        self, config: dict[str, Any], state: dict[str, Any], *, meta: dict[str, Any] | None = None
    ) -> int:
        """:meth:`aput_checkpoint` without messages."""
        return await self.aput_checkpoint(config, state, (), meta=meta)

    @traced()
    async def aput_state_cache(
        self, config: dict[str, Any], state: dict[str, Any], version: int
    ) -> bool:
        """Store ``state`` at ``version`` in the cache only, unless a newer one is cached.

        The thread's incarnation is the one the run recorded when it read; without one
        the cached entry's is kept. A put never creates an entry on its word alone: when
        the key is empty (expired, evicted, or fenced long ago) the thread's incarnation
        is read from the database first, and a run whose thread was deleted or replaced
        since it read is refused.

        Returns:
            Whether it was stored (False when refused or when Redis is unavailable).

        Raises:
            ConfigError: No key ring, and the store holds sealed values (the entry
                would be plaintext).
        """
        ids = self._ids(config)
        version = check_count("version", version)
        text = encode_state(state)  # a state that cannot be stored is an error, cache or not
        redis = self._redis
        if redis is None:
            return False
        prefix = await self._key_prefix()  # the store is ready: its marker was read
        if self.keys is None:
            # plaintext into Redis beside a sealed store is what a keyless write to
            # the database would be (the wrapped repository's own check)
            refused = self.inner.store.refusal()
            if refused is not None:
                raise refused
        key = cache_key(prefix, ids.thread_id, ids.user_id, ids.isolated)
        incarnation = recorded_incarnation(config)
        if incarnation is None and self.keys is not None:
            # a sealed entry names its incarnation: read it (the script cannot seal)
            incarnation = await self._incarnation(ids)
            if incarnation is None:
                return False  # the thread is gone, or not the caller's
        user = ids.user_id if ids.isolated else None
        body = entry_body(state, text, self.keys, ids.thread_id, key, version, incarnation, user)
        if body is None:
            return False
        master = await redis.master(key)
        stored = await redis.put(key, body, version, incarnation, master=master, replace_only=True)
        if stored != _EMPTY:
            return stored == 1
        prepared, master = time.monotonic(), redis.known_master(key)
        current = await self._incarnation(ids)
        if current is None or (incarnation is not None and incarnation != current):
            return False  # the thread is gone, or another life of it
        return await self._put(
            key, state, version, current, (), prepared, text, ids.thread_id, user, master=master
        )
