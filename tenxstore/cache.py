"""CachedCheckpointer: a Redis hot cache layered on any repository, as a decorator.

The shape is dogpile.cache's ``ProxyBackend``: the same public methods, each
written out, and the wrapped object one attribute away (``.inner``). The
repository never knows Redis exists; the cache holds plain data and versions.

Redis is best effort. Every failure — refused, timed out, black-holed, NOSCRIPT,
cluster errors — is logged and ignored, and the call is served by the database.
After a failure Redis is not tried again for a back-off window ("down until"), so
a dead Redis costs one short timeout, not one per call; the first call after the
window probes it again. Keys whose invalidation or refresh could not be sent are
remembered and deleted once Redis answers again, so an entry that went stale while
Redis was unreachable from this process is not served after it returns.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from base64 import urlsafe_b64encode
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.retry import Retry

from .config import RunIds, read_config, recorded_version, set_recorded_version
from .errors import ConfigError, StaleStateError
from .langgraph_tables import LangGraphTables
from .protocol import Checkpointer
from .serde import RESERVED_KEY, decode, encode_state
from .types import (
    ImportOutcome,
    OnConflict,
    StateSnapshot,
    ThreadExport,
    ThreadInfo,
    ToolExecution,
)
from .validate import IdType

__all__ = ["CachedCheckpointer", "cache_key"]

log = logging.getLogger("tenxstore.cache")
T = TypeVar("T")

CACHE_ERRORS: tuple[type[BaseException], ...] = (
    RedisError,
    RedisClusterException,  # not a RedisError
    OSError,
    asyncio.TimeoutError,
    TimeoutError,
)
_VERBATIM = re.compile(r"[A-Za-z0-9._-]+")
_UNSCOPED = "*"
_MAX_DIRTY = 10_000

# KEYS[1] cache key   ARGV[1] version   ARGV[2] payload   ARGV[3] ttl in ms (0: none)
# returns 1 when stored, 0 when a newer version is already cached.
# The version is the payload's first member, so a 64-byte GETRANGE reads it without
# copying a multi-MB value into the script.
_PUT_IF_NEWER = """
local head = redis.call('GETRANGE', KEYS[1], 0, 63)
if head ~= '' then
  local cached = string.match(head, '^ ?{"__checkpoint_version__":(%d+)')
  if cached and tonumber(cached) > tonumber(ARGV[1]) then
    return 0
  end
end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[2])
end
return 1
"""


def _segment(value: Any) -> str:
    text = str(value)
    if _VERBATIM.fullmatch(text):
        return text
    # "~" never appears in a verbatim segment and ":" never in base64url: no two ids
    # share a segment, and a key splits into its segments unambiguously.
    return "~" + urlsafe_b64encode(text.encode()).decode().rstrip("=")


def cache_key(prefix: str, thread_id: Any, user_id: Any, isolated: bool) -> str:
    """The cache key of a thread for a user, or for unscoped calls (``*``)."""
    user = _segment(user_id) if isolated else _UNSCOPED
    return f"{prefix}:{_segment(thread_id)}:{user}"


def _payload(state: dict[str, Any], version: int) -> str:
    """The state as JSON with its version spliced in as the first member."""
    body = encode_state(state)
    mark = " " if body.startswith(" ") else ""
    body = body.lstrip(" ")
    rest = "}" if body == "{}" else "," + body[1:]
    return f'{mark}{{"{RESERVED_KEY}":{version}{rest}'


class _Redis:
    """A Redis client behind a bounded, fail-open call and a down-until window."""

    def __init__(
        self, client: Any, *, owns: bool, timeout: float, backoff: float, max_backoff: float
    ) -> None:
        self.client = client
        self.owns = owns
        self.timeout = timeout
        self.backoff, self.max_backoff = backoff, max_backoff
        self.down_until = 0.0
        self.failures = 0
        self.dirty: set[str] = set()
        self.put_script = client.register_script(_PUT_IF_NEWER)
        self.cluster = isinstance(client, RedisCluster)

    def available(self) -> bool:
        return time.monotonic() >= self.down_until

    async def call(self, what: str, make: Callable[[], Any], keys: Iterable[str] = ()) -> Any:
        """Run one Redis call; on any failure log it, open the window, return None.

        ``keys`` are remembered for invalidation when the call does not get through.
        """
        if not self.available():
            self._remember(keys)
            return None
        try:
            result = await asyncio.wait_for(make(), self.timeout)
        except CACHE_ERRORS as exc:
            self._remember(keys)
            self.failures += 1
            window = min(self.backoff * 2 ** (self.failures - 1), self.max_backoff)
            self.down_until = time.monotonic() + window
            log.warning("redis %s failed (%r); not trying Redis for %.1fs", what, exc, window)
            return None
        if self.failures:
            self.failures = 0
            log.info("redis answers again")
        if self.dirty:
            await self._flush_dirty()
        return result

    def _remember(self, keys: Iterable[str]) -> None:
        for key in keys:
            if len(self.dirty) >= _MAX_DIRTY:
                log.error("too many cache keys await invalidation; relying on cache_ttl")
                return
            self.dirty.add(key)

    async def _flush_dirty(self) -> None:
        keys, self.dirty = list(self.dirty), set()
        # One key per command: safe on a cluster, where keys live on different slots.
        await self.call("invalidate", lambda: self.delete_each(keys), keys)

    async def put(self, key: str, args: list[Any], stale: list[str]) -> Any:
        """EVALSHA the guarded put and DEL the ``stale`` keys in one round trip.

        A pipeline, not a transaction: each command names one key. A Redis that lost
        its scripts (a restart) answers NOSCRIPT: the script is loaded and the put
        sent again. redis-py refuses scripts in a cluster pipeline, so on a cluster the
        put (one key, cluster-safe) and the deletions go out side by side instead.
        """
        if self.cluster:
            stored, *_ = await asyncio.gather(
                self.put_script(keys=[key], args=args),
                *(self.client.delete(other) for other in stale),
            )
            return stored
        pipe = self.client.pipeline(transaction=False)
        pipe.evalsha(self.put_script.sha, 1, key, *args)
        for other in stale:
            pipe.delete(other)
        results = await pipe.execute(raise_on_error=False)
        for failure in results[1:]:
            if isinstance(failure, Exception):
                raise failure
        stored = results[0]
        if isinstance(stored, NoScriptError):
            await self.client.script_load(_PUT_IF_NEWER)
            stored = await self.client.evalsha(self.put_script.sha, 1, key, *args)
        elif isinstance(stored, Exception):
            raise stored
        return stored

    async def delete_each(self, keys: list[str]) -> None:
        for key in keys:
            await self.client.delete(key)

    async def close(self) -> None:
        if self.owns:
            try:
                await self.client.aclose()
            except CACHE_ERRORS as exc:
                log.warning("closing redis failed: %r", exc)


def _make_client(
    redis: Any, redis_url: str | None, redis_pool: Any, timeout: float
) -> tuple[Any, bool]:
    given = [x for x in (redis, redis_url, redis_pool) if x is not None]
    if len(given) != 1:
        raise ConfigError("pass exactly one of redis=, redis_url= or redis_pool=")
    if redis is not None:
        return redis, False
    if redis_pool is not None:
        if not isinstance(redis_pool, ConnectionPool):
            raise ConfigError("redis_pool must be a redis.asyncio.ConnectionPool")
        return Redis(connection_pool=redis_pool), True  # the pool stays the caller's
    if not isinstance(redis_url, str):
        raise ConfigError(f"redis_url must be a str, not {type(redis_url).__name__}")
    # redis-py's defaults (5 s timeouts, retries with back-off) suit a database, not a
    # best-effort cache: fail fast and let the database answer.
    return (
        Redis.from_url(
            redis_url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        ),
        True,
    )


class CachedCheckpointer:
    """A Redis hot cache in front of any checkpointer with the repository's interface.

    Writes go to the database first; only after commit is the state stored in Redis,
    by one Lua script that never replaces a newer cached version. Reads through
    :meth:`aget_state_cache` try Redis first and refresh it on a miss.

    Args:
        inner: The wrapped repository (``.inner``).
        redis: A ``redis.asyncio`` client (also a ``RedisCluster``); stays the caller's.
        redis_url: A Redis URL; the client is created with short timeouts.
        redis_pool: A ``redis.asyncio.ConnectionPool``; stays the caller's.
        cache_ttl: Seconds an entry lives; ``None`` for no expiry.
        key_prefix: First segment of every key.
        redis_timeout: Bound on every Redis call this class makes, in seconds.
        redis_backoff: First "down" window after a failure, doubling up to 30 s.

    Raises:
        ConfigError: Not exactly one Redis argument, or an invalid ``cache_ttl``.
    """

    def __init__(
        self,
        inner: Checkpointer,
        *,
        redis: Any = None,
        redis_url: str | None = None,
        redis_pool: Any = None,
        cache_ttl: float | None = 86400,
        key_prefix: str = "state_cache",
        redis_timeout: float = 0.25,
        redis_backoff: float = 1.0,
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
        self.cache_ttl = cache_ttl
        self.key_prefix = key_prefix
        self._ttl_ms = 0 if cache_ttl is None else max(1, int(cache_ttl * 1000))
        self._redis: _Redis | None = None
        if (redis, redis_url, redis_pool) == (None, None, None) and not self._requires_redis():
            return  # a preset without a cache: every call goes to the inner repository
        client, owns = _make_client(redis, redis_url, redis_pool, redis_timeout)
        self._redis = _Redis(
            client, owns=owns, timeout=redis_timeout, backoff=redis_backoff, max_backoff=30.0
        )

    @classmethod
    def _requires_redis(cls) -> bool:
        """Presets whose Redis is optional override this."""
        return True

    # -- plumbing ----------------------------------------------------------------

    @property
    def redis(self) -> Any:
        """The Redis client, or None for a preset without a cache."""
        return None if self._redis is None else self._redis.client

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

    def _key(self, ids: RunIds) -> str:
        return cache_key(self.key_prefix, ids.thread_id, ids.user_id, ids.isolated)

    def _other_keys(self, ids: RunIds) -> list[str]:
        """The entries of the other isolation mode that a write makes stale."""
        if ids.isolated:
            return [cache_key(self.key_prefix, ids.thread_id, None, False)]
        if ids.user_id is not None:
            return [cache_key(self.key_prefix, ids.thread_id, ids.user_id, True)]
        return []

    async def _put(
        self, key: str, state: dict[str, Any], version: int, stale: list[str] | None = None
    ) -> bool:
        """The guarded put of ``key``, and the deletion of ``stale`` keys, best effort."""
        payload = _payload(state, version)
        redis = self._redis
        if redis is None:
            return False
        args, others = [version, payload, self._ttl_ms], stale or []
        stored = await redis.call("put", lambda: redis.put(key, args, others), [key, *others])
        return bool(stored)

    async def _delete(self, keys: list[str]) -> None:
        redis = self._redis
        if keys and redis is not None:
            await redis.call("delete", lambda: redis.delete_each(keys), keys)

    async def _after_write(self, ids: RunIds, state: dict[str, Any], version: int) -> None:
        await self._put(self._key(ids), state, version, self._other_keys(ids))

    # -- lifecycle ---------------------------------------------------------------

    async def asetup(self) -> None:
        """Migrate the wrapped repository's schema to head."""
        await self.inner.asetup()

    def setup(self) -> None:
        """Synchronous :meth:`asetup`."""
        self.inner.setup()

    async def aclose(self) -> None:
        """Close the wrapped repository and the Redis client this class created."""
        try:
            await self.inner.aclose()
        finally:
            if self._redis is not None:
                await self._redis.close()

    async def __aenter__(self) -> CachedCheckpointer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- state -------------------------------------------------------------------

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
        so the run's next read comes from the database.
        """
        ids = self._ids(config)
        try:
            version = await self.inner.aput_checkpoint(config, state, messages, meta=meta)
        except StaleStateError:
            await self._delete([self._key(ids)])
            raise
        await self._after_write(ids, state, version)
        return version

    async def aput_state(
        self, config: dict[str, Any], state: dict[str, Any], *, meta: dict[str, Any] | None = None
    ) -> int:
        """:meth:`aput_checkpoint` without messages."""
        return await self.aput_checkpoint(config, state, (), meta=meta)

    async def aget_state(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The latest durable state, from the database (the cache is not consulted)."""
        return await self.inner.aget_state(config)

    async def aget_state_cache(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The latest state: Redis first, then the database (refreshing Redis).

        Records the version read in ``config["_checkpoint_version"]`` (0 for no state).
        """
        ids = self._ids(config)
        redis = self._redis
        if redis is None:
            return await self.aget_state(config)
        key = self._key(ids)
        raw = await redis.call("get", lambda: redis.client.get(key))
        if raw is not None:
            cached: dict[str, Any] = decode(raw)
            set_recorded_version(config, cached.pop(RESERVED_KEY))
            return cached
        state = await self.inner.aget_state(config)
        if state is not None:
            await self._put(key, state, recorded_version(config) or 0)
        return state

    async def aput_state_cache(
        self, config: dict[str, Any], state: dict[str, Any], version: int
    ) -> bool:
        """Store ``state`` at ``version`` in the cache only, unless a newer one is cached.

        Returns:
            Whether it was stored (False when refused or when Redis is unavailable).
        """
        ids = self._ids(config)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ConfigError(f"version must be a non-negative int, not {version!r}")
        return await self._put(self._key(ids), state, version)

    async def alist_states(
        self, config: dict[str, Any], limit: int | None = None
    ) -> list[StateSnapshot]:
        """Retained history, newest first (from the database)."""
        return await self.inner.alist_states(config, limit)

    async def aget_messages(
        self, config: dict[str, Any], limit: int | None = None, after_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Messages in insertion order (from the database)."""
        return await self.inner.aget_messages(config, limit, after_id)

    # -- threads -----------------------------------------------------------------

    async def aput_thread(
        self,
        config: dict[str, Any],
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ThreadInfo:
        """Create or update the thread record (no state change, no cache change)."""
        return await self.inner.aput_thread(config, name, metadata)

    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """The thread record, or None."""
        return await self.inner.aget_thread(config)

    async def alist_threads(
        self, config: dict[str, Any], limit: int = 50, offset: int = 0
    ) -> list[ThreadInfo]:
        """The caller's threads, most recently updated first."""
        return await self.inner.alist_threads(config, limit, offset)

    async def aclean_thread(self, config: dict[str, Any]) -> bool:
        """Delete the thread and its data, then its cache entries of both modes."""
        ids = self._ids(config)
        removed = await self.inner.aclean_thread(config)
        await self._delete([self._key(ids), *self._other_keys(ids)])
        return removed

    # -- tool ledger: durable only, passed through -------------------------------

    async def abegin_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, tool_name: str, args: dict[str, Any]
    ) -> ToolExecution:
        """Claim a tool call (see the repository)."""
        return await self.inner.abegin_tool_execution(config, tool_call_id, tool_name, args)

    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any
    ) -> ToolExecution:
        """Record a tool call's result; the first success wins."""
        return await self.inner.acomplete_tool_execution(config, tool_call_id, result)

    async def afail_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, error: str | BaseException
    ) -> ToolExecution:
        """Record a tool call's failure."""
        return await self.inner.afail_tool_execution(config, tool_call_id, error)

    async def aget_tool_execution(
        self, config: dict[str, Any], tool_call_id: str
    ) -> ToolExecution | None:
        """The ledger record of a tool call, or None."""
        return await self.inner.aget_tool_execution(config, tool_call_id)

    async def arun_tool_once(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        tool_name: str,
        args: dict[str, Any],
        fn: Callable[..., Any],
    ) -> Any:
        """Replay-safe tool call (see the repository)."""
        return await self.inner.arun_tool_once(config, tool_call_id, tool_name, args, fn)

    # -- whole threads: passed through; an import invalidates the thread's entries -

    async def alist_tool_executions(self, config: dict[str, Any]) -> list[ToolExecution]:
        """Every tool call of the thread (see the repository)."""
        return await self.inner.alist_tool_executions(config)

    async def aiter_threads(self, batch: int = 500) -> AsyncIterator[ThreadInfo]:
        """Every thread of every user, in ``thread_id`` order."""
        async for info in self.inner.aiter_threads(batch):
            yield info

    async def aexport_thread(self, config: dict[str, Any]) -> ThreadExport | None:
        """Everything stored of one thread (see the repository)."""
        return await self.inner.aexport_thread(config)

    async def aimport_thread(
        self, export: ThreadExport, *, on_conflict: OnConflict = "fail"
    ) -> ImportOutcome:
        """Write an exported thread back (see the repository), then drop its cache
        entries of both isolation modes."""
        outcome = await self.inner.aimport_thread(export, on_conflict=on_conflict)
        thread = export.thread
        await self._delete(
            [
                cache_key(self.key_prefix, thread.thread_id, None, False),
                *(
                    [cache_key(self.key_prefix, thread.thread_id, thread.user_id, True)]
                    if thread.user_id is not None
                    else []
                ),
            ]
        )
        return outcome
