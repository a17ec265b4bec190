"""CachedCheckpointer: a Redis hot cache layered on any checkpointer, as a decorator.

The shape is dogpile.cache's ``ProxyBackend``: the same public methods, each
written out, and the wrapped object one attribute away (``.inner``). The
repository never knows Redis exists; the cache holds plain data and versions.

Keys are ``{key_prefix}:{thread_id}:{user_id}``, with ``*`` as the user of calls to
which isolation does not apply. The default prefix is ``state_cache:`` followed by
the store's own id (written into the database by its migrations), so stores that
share one Redis never share an entry, and one store reached two ways always does.
What Redis holds and how a stale write can never land is in
:mod:`tenxstore.redis_cache`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .boundary import guard
from .cache_entries import SEALED_MEMBER as SEALED_MEMBER  # importable here as before
from .cache_fences import CacheFences
from .cache_keys import DEFAULT_KEY_PREFIX, DefaultPrefix, cache_key, glob_escape
from .cache_passthrough import CachePassthrough
from .cache_reads import CacheReads
from .cache_writes import CacheWrites
from .crypto import KeyRing
from .errors import ConfigError
from .protocol import Checkpointer
from .redis_cache import RedisCache
from .redis_client import make_client
from .stats import StoreStats
from .telemetry import traced
from .twins import SyncCheckpointer
from .types import Health

__all__ = ["DEFAULT_KEY_PREFIX", "CachedCheckpointer", "cache_key"]


class CachedCheckpointer(CacheWrites, CacheReads, CacheFences, CachePassthrough, SyncCheckpointer):
    """A Redis hot cache in front of any :class:`~tenxstore.Checkpointer`.

    Writes go to the database first; only after commit is the state stored in Redis,
    by one Lua script that never replaces a newer cached version (nor a newer life of
    the thread). Reads through :meth:`aget_state_cache` try Redis first and refresh it
    on a miss. Once the database has committed, a call returns its result: a Redis
    error after the commit is logged, never raised (a cancellation still propagates,
    as asyncio requires: a cancelled write may have committed).

    Args:
        inner: The wrapped checkpointer (``.inner``).
        redis: A ``redis.asyncio`` client (also a ``RedisCluster``); stays the caller's.
        redis_url: A Redis URL; the client is created with short timeouts, one per
            event loop, each closed when its loop shuts down.
        redis_pool: A ``redis.asyncio.ConnectionPool``; stays the caller's.
        redis_options: Options for the client created from ``redis_url``
            (``Redis.from_url`` keywords, over short timeouts and no retries).
        sentinels: Instead: Redis behind Sentinel, as ``[(host, port), ...]`` of the
            sentinels; the client is redis-py's ``Sentinel(...).master_for(...)``, one
            per event loop, with no retries. After a failover the cache fails open
            (the database answers) until a call reaches the new master; a replica
            promoted without the last writes never serves what it held before (each
            entry names the master that stored it: see ``tenxstore.redis_scripts``).
        sentinel_service: The name the sentinels know the master by (``"mymaster"``).
        sentinel_options: Keywords of redis-py's ``Sentinel`` (``password=``,
            ``username=``, ``db=``, ``ssl=`` ... for the master; ``sentinel_kwargs=``,
            such as ``{"password": ...}``, for the sentinels; ``min_other_sentinels=``).
        cache_ttl: Seconds an entry lives; ``None`` for no expiry.
        key_prefix: First segment(s) of every key. The default, ``"state_cache"``, is
            followed by the store's id; a prefix you pass is used verbatim, and then
            two stores that share a Redis must not share it (you own its uniqueness).
        redis_timeout: Bound on every Redis call this class makes, in seconds.
        redis_backoff: First "down" window after a failure, doubling up to 30 s.

    Raises:
        ConfigError: Not exactly one of ``redis``, ``redis_url``, ``redis_pool`` and
            ``sentinels``, a ``sentinels`` that is not (host, port) pairs, no
            ``sentinel_service`` with it, or an invalid ``cache_ttl``.
    """

    def __init__(
        self,
        inner: Checkpointer,
        *,
        redis: Any = None,
        redis_url: str | None = None,
        redis_pool: Any = None,
        cache_ttl: float | None = 86400,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        redis_timeout: float = 0.25,
        redis_backoff: float = 1.0,
        redis_options: dict[str, Any] | None = None,
        sentinels: list[tuple[str, int]] | None = None,
        sentinel_service: str | None = None,
        sentinel_options: dict[str, Any] | None = None,
    ) -> None:
        if cache_ttl is not None and (
            isinstance(cache_ttl, bool) or not isinstance(cache_ttl, (int, float)) or cache_ttl <= 0
        ):
            raise ConfigError(f"cache_ttl must be a positive number or None, not {cache_ttl!r}")
        if not isinstance(key_prefix, str) or not key_prefix:
            raise ConfigError("key_prefix must be a non-empty str")
        for name, value in (("redis_timeout", redis_timeout), ("redis_backoff", redis_backoff)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{name} must be a positive number, not {value!r}")
        self.inner = inner
        self.keys: KeyRing | None = inner.keys
        """The inner checkpointer's key ring: entries are sealed with it too."""
        self.cache_ttl = cache_ttl
        self._namespaced = isinstance(key_prefix, DefaultPrefix)
        self._prefix: str | None = None if self._namespaced else key_prefix
        self._base_prefix = str(key_prefix)
        self._redis: RedisCache | None = None
        sides = (redis, redis_url, redis_pool, sentinels, sentinel_service, sentinel_options)
        if sides == (None,) * 6 and not self._requires_redis():
            return  # a preset without a cache: every call goes to the inner checkpointer
        client, make, owns = make_client(
            redis,
            redis_url,
            redis_pool,
            redis_timeout,
            redis_options,
            sentinels=sentinels,
            sentinel_service=sentinel_service,
            sentinel_options=sentinel_options,
        )
        ttl_ms = 0 if cache_ttl is None else max(1, int(cache_ttl * 1000))
        self._redis = RedisCache(
            client,
            make=make,
            owns=owns,
            timeout=redis_timeout,
            backoff=redis_backoff,
            max_backoff=30.0,
            ttl_ms=ttl_ms,
        )

    @classmethod
    def _requires_redis(cls) -> bool:
        """Presets whose Redis is optional override this."""
        return True

    # -- lifecycle ---------------------------------------------------------------

    @traced()
    async def asetup(self) -> None:
        """Migrate the wrapped repository's schema to head."""
        await self.inner.asetup()

    def setup(self) -> None:
        """Synchronous :meth:`asetup`."""
        self.inner.setup()

    @traced()
    async def astore_id(self) -> str:
        """The id of the wrapped store (see the repository)."""
        return await self.inner.astore_id()

    @traced()
    async def acheck(self) -> Health:
        """The wrapped store's check, and Redis's: a PING now (bounded by
        ``redis_timeout``), the back-off window and the invalidations still pending."""
        health = await self.inner.acheck()
        redis = self._redis
        if redis is None:
            return health
        status = redis.status()
        problem = await redis.probe()
        return replace(
            health,
            cache=redis.describe(),
            cache_error=problem,
            cache_down_for=status.down_for,
            pending_invalidations=status.pending_invalidations,
        )

    @guard
    async def aclose(self) -> None:
        """Close the wrapped repository and the Redis client this class created."""
        try:
            await self.inner.aclose()
        finally:
            if self._redis is not None:
                await self._redis.aclose()

    async def __aenter__(self) -> CachedCheckpointer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- stats -----------------------------------------------------------------

    @traced()
    async def astats(self, *, top: int = 10, exact: bool = False) -> StoreStats:
        """The repository's stats (see there), with the keys under this cache's prefix
        (entries and fences), counted with ``SCAN`` (never ``KEYS``)."""
        found = await self.inner.astats(top=top, exact=exact)
        if self._redis is None:
            return found
        pattern = glob_escape(await self._key_prefix()) + ":*"
        try:
            keys = await self._redis.count_keys(pattern)
        except Exception as exc:  # a report reports; the cache fails open everywhere
            return replace(found, cache_error=f"{type(exc).__name__}: {exc}")
        return replace(found, cache_keys=keys)
