"""The state read through the cache: Redis first, then the database.

A hit restores the version and incarnation into the run's config; a miss (no entry,
a fence, an entry that does not decode or open, one of another life of the thread, or
one another Redis master stored) reads the database and refills Redis through the
guarded put, on the master that answered the read. History and messages
come from the database.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from . import telemetry
from .cache_core import CacheCore
from .cache_entries import SEALED_MEMBER, entry_life, sealed_column
from .cache_keys import cache_key
from .config import record_read, recorded_incarnation, recorded_version
from .crypto import CACHE
from .errors import DecryptionError
from .redis_cache import Entry
from .redis_cache import decode_entry as _decode_entry
from .statements import load
from .telemetry import traced
from .types import StateSnapshot

__all__ = ["CacheReads"]

log = logging.getLogger("tenxstore.cache")  # the log lines keep the logger they had


class CacheReads(CacheCore):
    """The state's reads of :class:`~tenxstore.cache.CachedCheckpointer`."""

    @traced()
    async def aget_state(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The latest durable state, from the database (the cache is not consulted)."""
        return await self.inner.aget_state(config)

    @traced()
    async def aget_state_cache(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The latest state: Redis first, then the database (refreshing Redis).

        Records the version read (0 for no state), and the thread's incarnation, in
        the config. An entry that does not decode is a miss: it is logged and dropped.
        An entry of another life of the thread than the one the run recorded (it read
        or wrote the thread since), or of an older version of that life than the run
        recorded, is a miss too: the database answers, and the entry is refilled. So a
        run never reads its own state going back.
        """
        ids = self._ids(config)
        known = recorded_incarnation(config)
        seen = recorded_version(config) if known is not None else None
        user = ids.user_id if ids.isolated else None
        redis = self._redis
        if redis is None:
            return await self.inner.aget_state(config)
        prefix = await self._key_prefix()
        key = cache_key(prefix, ids.thread_id, ids.user_id, ids.isolated)
        raw, current = await redis.get(key)
        master = redis.known_master(key)  # the one that answered: a refill lands only there
        if raw is not None:
            entry = await self._cached(raw, current, key, known, ids.thread_id, user)
            if entry is not None and seen is not None and entry.version < seen:
                # older than what this run read or wrote of this life: an entry whose
                # invalidation was lost (a Redis failover's window); never served, and
                # the refill below replaces it with the database's head
                entry = None
            if entry is not None:
                telemetry.cache_lookup("hit")
                record_read(config, entry.version, entry.incarnation)
                return entry.state
        telemetry.cache_lookup("fail_open" if redis.down else "miss")
        prepared = time.monotonic()
        state = await self.inner.aget_state(config)
        if state is not None:
            version = recorded_version(config) or 0
            life = recorded_incarnation(config)
            await self._put(
                key, state, version, life, (), prepared, None, ids.thread_id, user, master=master
            )
        return state

    async def _cached(
        self, raw: bytes, current: bool, key: str, known: int | None, thread_id: Any, user: Any
    ) -> Entry | None:
        """The entry ``raw`` holds, to serve; None (a miss) when it does not decode, names
        no master (``current`` False: dropped), is of another life of the thread than
        the one the run recorded (``known``), or (sealed) does not open."""
        assert self._redis is not None
        try:
            entry = _decode_entry(raw)
        except ValueError as exc:
            where = f" ({key})" if telemetry.record_ids() else ""
            log.warning("dropping a cache entry that does not decode%s: %s", where, exc)
            await self._redis.drop([key])
            return None
        if entry is not None and not current:
            # cached by a release that did not name the master: it may be a promoted
            # replica's copy of an old state; the database answers, and it is refilled
            await self._redis.drop([key])
            return None
        if entry is not None and known is not None and entry.incarnation != known:
            # An entry of a life this run knows is not the thread's now: cached before
            # a delete or an import, or replayed into Redis; never served.
            return None
        if entry is not None and (self.keys is not None or SEALED_MEMBER in entry.state):
            return await self._opened(entry, thread_id, key, user)
        return entry

    async def _opened(self, entry: Entry, thread_id: Any, key: str, user: Any) -> Entry | None:
        """A sealed entry opened; None (a miss, the entry dropped) when it does not open:
        sealed under a key since removed, tampered with, replayed under another
        version, life or key, or (with a key ring) not sealed at all: an entry cached
        before encryption was turned on, or plaintext written into Redis. Never its
        ciphertext, never plaintext an encrypted store did not seal: the database
        answers instead, and the failure is logged."""
        assert self._redis is not None
        sealed = entry.state.get(SEALED_MEMBER)
        column = sealed_column(key, entry.version, entry.incarnation)
        try:
            if len(entry.state) != 1 or not isinstance(sealed, str):
                raise DecryptionError(thread_id, CACHE, None, "not a sealed entry")
            if entry.incarnation is None:
                raise DecryptionError(thread_id, CACHE, None, "names no incarnation")
            life = entry_life(entry.incarnation, user)
            state = load(self.keys, sealed, thread_id, column, life)
        except (DecryptionError, ValueError) as exc:
            where = f" ({key})" if telemetry.record_ids() else ""
            log.warning("dropping a cache entry that does not decrypt%s: %s", where, exc)
            await self._redis.drop([key])
            return None
        return Entry(state, entry.version, entry.incarnation)

    @traced()
    async def alist_states(
        self, config: dict[str, Any], limit: int | None = None
    ) -> list[StateSnapshot]:
        """Retained history, newest first (from the database)."""
        return await self.inner.alist_states(config, limit)

    @traced()
    async def aget_messages(
        self, config: dict[str, Any], limit: int | None = None, after_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Messages in insertion order (from the database)."""
        return await self.inner.aget_messages(config, limit, after_id)
