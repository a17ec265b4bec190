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

import logging
import re
import time
from base64 import urlsafe_b64encode
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from . import telemetry
from .boundary import guard, guard_iter
from .config import RunIds, read_config, record_read, recorded_incarnation, recorded_version
from .crypto import CACHE, KeyRing, Life
from .errors import CacheUnreachable, ConfigError, DecryptionError, StaleStateError
from .langgraph.tables import LangGraphTables
from .langgraph.values import AllowedTypes
from .lifecycle import DEFAULT_BATCH_SIZE, DEFAULT_SAMPLE, BatchHook, DeleteResult, ProgressHook
from .protocol import Checkpointer
from .redis_cache import BLANKET, INCARNATION_MEMBER, MAX_PUT_AGE, Entry, Fence, RedisCache
from .redis_cache import decode_entry as _decode_entry
from .redis_client import make_client
from .serde import encode_state
from .statements import load
from .stats import StoreStats
from .telemetry import traced
from .types import (
    AuthPolicy,
    Commit,
    Health,
    Imported,
    ImportOutcome,
    OnConflict,
    StateSnapshot,
    ThreadExport,
    ThreadInfo,
    ToolExecution,
)
from .validate import IdType, check_count

__all__ = ["DEFAULT_KEY_PREFIX", "CachedCheckpointer", "cache_key"]

_EMPTY = 2  # RedisCache.put: the key was empty and the put may not create it

log = logging.getLogger(__name__)
_VERBATIM = re.compile(r"[A-Za-z0-9._-]+")
_UNSCOPED = "*"


class _DefaultPrefix(str):
    """``"state_cache"`` as the default argument, told apart from the same text passed
    on purpose: the default gets the store's namespace appended, an explicit prefix is
    used verbatim."""

    __slots__ = ()


DEFAULT_KEY_PREFIX: str = _DefaultPrefix("state_cache")


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


SEALED_MEMBER = "__checkpoint_sealed__"
"""The one member of an encrypted entry's state: the state's text, sealed."""


def _sealed_column(key: str, version: int, incarnation: int | None) -> str:
    """What a sealed entry is bound to besides its thread and life: the incarnation and
    version the guard reads in clear, and the key it is stored under. A sealed state
    replayed under another version, another life of the thread or another key (another
    user's) does not open: a miss."""
    return f"{CACHE}:{incarnation}:{version}:{key}"


def _entry_life(incarnation: int, user: Any) -> Life:
    """The life a cache entry is sealed for: the incarnation it carries, and as its
    owner the user its key names — the thread's owner for a call under isolation (which
    only ever reads its own threads), None for the unscoped entry (``*``: the cache
    cannot know the owner on a hit, which reads no database)."""
    return Life(incarnation, user)


def _body(
    state: dict[str, Any],
    text: str | None = None,
    keys: KeyRing | None = None,
    thread_id: Any = None,
    key: str = "",
    version: int = 0,
    incarnation: int | None = None,
    user: Any = None,
) -> tuple[str, str] | None:
    """A state's text (``text`` when the store has encoded it already) as (stdlib mark,
    members after ``{``); None when the state uses the incarnation's or the sealed
    member itself (it cannot be cached, and is served from the database instead).

    With ``keys`` the entry's state is one member, the state's text sealed for the
    thread, the key, the version and the incarnation (which stay in clear for the
    guard, and are bound by the associated data) and the user the key names (see
    :func:`_entry_life`); None when the incarnation is not known (the script would
    pick it, and the seal could not name it)."""
    if INCARNATION_MEMBER in state or SEALED_MEMBER in state:
        return None
    if text is None:
        text = encode_state(state)
    if keys is not None:  # an envelope is base64 and [A-Za-z0-9_.-:!]: no JSON escape
        if incarnation is None:
            return None
        column = _sealed_column(key, version, incarnation)
        sealed = keys.seal(text, thread_id, column, _entry_life(incarnation, user))
        return "", f',"{SEALED_MEMBER}":"{sealed}"}}'
    mark = " " if text.startswith(" ") else ""
    text = text[len(mark) :]
    return mark, ("}" if text == "{}" else "," + text[1:])


class CachedCheckpointer:
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
        cache_ttl: Seconds an entry lives; ``None`` for no expiry.
        key_prefix: First segment(s) of every key. The default, ``"state_cache"``, is
            followed by the store's id; a prefix you pass is used verbatim, and then
            two stores that share a Redis must not share it (you own its uniqueness).
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
        key_prefix: str = DEFAULT_KEY_PREFIX,
        redis_timeout: float = 0.25,
        redis_backoff: float = 1.0,
        redis_options: dict[str, Any] | None = None,
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
        self.keys: KeyRing | None = getattr(inner, "keys", None)
        """The inner checkpointer's key ring: entries are sealed with it too."""
        self.cache_ttl = cache_ttl
        self._namespaced = isinstance(key_prefix, _DefaultPrefix)
        self._prefix: str | None = None if self._namespaced else key_prefix
        self._base_prefix = str(key_prefix)
        self._redis: RedisCache | None = None
        if (redis, redis_url, redis_pool) == (None, None, None) and not self._requires_redis():
            return  # a preset without a cache: every call goes to the inner checkpointer
        client, make, owns = make_client(redis, redis_url, redis_pool, redis_timeout, redis_options)
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

    # -- plumbing ----------------------------------------------------------------

    @property
    def redis(self) -> Any:
        """The Redis client of the running loop, or None for a preset without a cache."""
        return None if self._redis is None else self._redis.client

    @property
    def engine(self) -> AsyncEngine:
        """The wrapped repository's SQLAlchemy engine (of the running event loop), for
        instrumentation such as ``opentelemetry-instrumentation-sqlalchemy``."""
        engine = getattr(self.inner, "engine", None)
        if not isinstance(engine, AsyncEngine):
            raise AttributeError(f"{type(self.inner).__name__} has no SQLAlchemy engine")
        return engine

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
    ) -> bool:
        """The guarded put of ``key`` (of ``user``'s calls; None: the unscoped key) with
        fences of other keys; a put prepared too long ago (or a state that cannot be
        cached) only fences."""
        redis = self._redis
        assert redis is not None
        body = _body(state, text, self.keys, thread_id, key, version, incarnation, user)
        if body is None or time.monotonic() - prepared > MAX_PUT_AGE:
            own = (incarnation, version) if incarnation is not None else BLANKET
            await redis.fence([(key, own), *fences])
            return False
        return await redis.put(key, body, version, incarnation, fences) == 1

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

    # -- state -------------------------------------------------------------------

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
            )
        return commit

    @traced(write=True)
    async def aput_state(
        self, config: dict[str, Any], state: dict[str, Any], *, meta: dict[str, Any] | None = None
    ) -> int:
        """:meth:`aput_checkpoint` without messages."""
        return await self.aput_checkpoint(config, state, (), meta=meta)

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
        or wrote the thread since) is a miss too: the database answers, and the entry
        is refilled.
        """
        ids = self._ids(config)
        known = recorded_incarnation(config)
        user = ids.user_id if ids.isolated else None
        redis = self._redis
        if redis is None:
            return await self.inner.aget_state(config)
        prefix = await self._key_prefix()
        key = cache_key(prefix, ids.thread_id, ids.user_id, ids.isolated)
        raw = await redis.get(key)
        if raw is not None:
            try:
                entry = _decode_entry(raw)
            except ValueError as exc:
                where = f" ({key})" if telemetry.record_ids() else ""
                log.warning("dropping a cache entry that does not decode%s: %s", where, exc)
                await redis.drop([key])
                entry = None
            if entry is not None and known is not None and entry.incarnation != known:
                # An entry of a life this run knows is not the thread's now: cached before
                # a delete or an import, or replayed into Redis; never served.
                entry = None
            if entry is not None and (self.keys is not None or SEALED_MEMBER in entry.state):
                entry = await self._opened(entry, ids.thread_id, key, user)
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
            await self._put(key, state, version, life, (), prepared, None, ids.thread_id, user)
        return state

    async def _opened(self, entry: Entry, thread_id: Any, key: str, user: Any) -> Entry | None:
        """A sealed entry opened; None (a miss, the entry dropped) when it does not open:
        sealed under a key since removed, tampered with, replayed under another
        version, life or key, or (with a key ring) not sealed at all: an entry cached
        before encryption was turned on, or plaintext written into Redis. Never its
        ciphertext, never plaintext an encrypted store did not seal: the database
        answers instead, and the failure is logged."""
        assert self._redis is not None
        sealed = entry.state.get(SEALED_MEMBER)
        column = _sealed_column(key, entry.version, entry.incarnation)
        try:
            if len(entry.state) != 1 or not isinstance(sealed, str):
                raise DecryptionError(thread_id, CACHE, None, "not a sealed entry")
            if entry.incarnation is None:
                raise DecryptionError(thread_id, CACHE, None, "names no incarnation")
            life = _entry_life(entry.incarnation, user)
            state = load(self.keys, sealed, thread_id, column, life)
        except (DecryptionError, ValueError) as exc:
            where = f" ({key})" if telemetry.record_ids() else ""
            log.warning("dropping a cache entry that does not decrypt%s: %s", where, exc)
            await self._redis.drop([key])
            return None
        return Entry(state, entry.version, entry.incarnation)

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
            store = getattr(self.inner, "_store", None)
            refused = None if store is None else store.refusal()
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
        body = _body(state, text, self.keys, ids.thread_id, key, version, incarnation, user)
        if body is None:
            return False
        stored = await redis.put(key, body, version, incarnation, replace_only=True)
        if stored != _EMPTY:
            return stored == 1
        prepared = time.monotonic()
        current = await self._incarnation(ids)
        if current is None or (incarnation is not None and incarnation != current):
            return False  # the thread is gone, or another life of it
        return await self._put(
            key, state, version, current, (), prepared, text, ids.thread_id, user
        )

    async def _incarnation(self, ids: RunIds) -> int | None:
        """The thread's incarnation in the database (None: absent, or not the caller's)."""
        probe: dict[str, Any] = {
            "thread_id": ids.thread_id,
            "user_id": ids.user_id,
            "auth_policy": AuthPolicy(ids.isolated),
        }
        await self.inner.aget_state(probe)  # records the incarnation it read
        return recorded_incarnation(probe)

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

    # -- threads -----------------------------------------------------------------

    @traced(write=True)
    async def aput_thread(
        self,
        config: dict[str, Any],
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ThreadInfo:
        """Create or update the thread record (no state change, no cache change)."""
        return await self.inner.aput_thread(config, name, metadata)

    @traced()
    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """The thread record, or None."""
        return await self.inner.aget_thread(config)

    @traced()
    async def alist_threads(
        self, config: dict[str, Any], limit: int | None = 50, offset: int = 0
    ) -> list[ThreadInfo]:
        """The caller's threads, most recently updated first."""
        return await self.inner.alist_threads(config, limit, offset)

    @traced(write=True)
    async def aclean_thread(self, config: dict[str, Any]) -> bool:
        """Delete the thread and its data, then fence its cache entries of both modes.

        After this returns (and Redis answered), no read through the cache returns the
        deleted data, and no refill that read it before the delete can store it.
        """
        return await self.adelete(config) is not None

    @traced(write=True)
    async def adelete(self, config: dict[str, Any]) -> Commit | None:
        """:meth:`aclean_thread`, returning the repository's :class:`Commit`."""
        ids = self._ids(config)
        removed = await self.inner.adelete(config)
        redis = self._redis
        if redis is None:
            return removed
        if removed is None:  # nothing to delete: drop the entries this call's keys hold
            owner = ids.user_id if ids.isolated else None  # (a fence there stays)
            await redis.drop([k for k in await self._keys(ids.thread_id, owner) if k])
            return None
        fence = (removed.incarnation + 1, 0)  # nothing of the deleted life may land
        keys = await self._keys(removed.thread_id, removed.user_id)
        await redis.fence([(key, fence) for key in keys if key is not None])
        return removed

    # -- tool ledger: durable only, passed through -------------------------------

    @traced(write=True)
    async def abegin_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, tool_name: str, args: dict[str, Any]
    ) -> ToolExecution:
        """Claim a tool call (see the repository)."""
        return await self.inner.abegin_tool_execution(config, tool_call_id, tool_name, args)

    @traced(write=True)
    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any, *, attempt: int | None = None
    ) -> ToolExecution:
        """Record a tool call's result; the first success wins."""
        return await self.inner.acomplete_tool_execution(
            config, tool_call_id, result, attempt=attempt
        )

    @traced(write=True)
    async def afail_tool_execution(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        error: str | BaseException,
        *,
        attempt: int | None = None,
    ) -> ToolExecution:
        """Record a tool call's failure."""
        return await self.inner.afail_tool_execution(config, tool_call_id, error, attempt=attempt)

    @traced()
    async def aget_tool_execution(
        self, config: dict[str, Any], tool_call_id: str
    ) -> ToolExecution | None:
        """The ledger record of a tool call, or None."""
        return await self.inner.aget_tool_execution(config, tool_call_id)

    @traced(write=True)
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

    @traced()
    async def alist_tool_executions(self, config: dict[str, Any]) -> list[ToolExecution]:
        """Every tool call of the thread (see the repository)."""
        return await self.inner.alist_tool_executions(config)

    # -- whole threads: passed through; an import fences the thread's entries ------

    @guard_iter
    async def aiter_threads(self, batch: int = 500) -> AsyncIterator[ThreadInfo]:
        """Every thread of every user, in ``thread_id`` order."""
        async for info in self.inner.aiter_threads(batch):
            yield info

    @traced()
    async def aexport_thread(self, config: dict[str, Any]) -> ThreadExport | None:
        """Everything stored of one thread (see the repository)."""
        return await self.inner.aexport_thread(config)

    @traced(write=True)
    async def aimport_thread(
        self,
        export: ThreadExport,
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> ImportOutcome:
        """Write an exported thread back (see the repository); when that made a new
        life of the thread, fence its cache entries of both modes."""
        [outcome] = await self.aimport_threads(
            [export], on_conflict=on_conflict, allowed_types=allowed_types
        )
        return outcome

    @traced(write=True)
    async def aimport_threads(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[ImportOutcome]:
        """Write exported threads back in one transaction (see the repository), then
        fence the cache entries of every thread that got a new life."""
        done = await self.aimport(exports, on_conflict=on_conflict, allowed_types=allowed_types)
        return [imported.outcome for imported in done]

    @traced(write=True)
    async def aimport(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """:meth:`aimport_threads`, returning what each import did (see
        :meth:`aimport_stream`)."""
        given = list(exports)
        return await self.aimport_stream(
            lambda: ((None, export) for export in given),
            on_conflict=on_conflict,
            allowed_types=allowed_types,
        )

    @traced(write=True)
    async def aimport_stream(
        self,
        source: Callable[[], Iterable[tuple[str | None, ThreadExport]]],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """Import exports read twice from ``source`` (see the repository). The entries
        of each imported thread are fenced for its owner and for the owner of the life
        it replaced (who may be another user); a skipped thread's are left alone."""
        done = await self.inner.aimport_stream(
            source, on_conflict=on_conflict, allowed_types=allowed_types
        )
        if self._redis is not None:
            keys: set[str | None] = set()
            for imported in done:
                # "unchanged" too: an import run again re-sends what a lost one did not
                if imported.outcome != "skipped":
                    keys.update(await self._keys(imported.thread_id, imported.user_id))
                if imported.replaced is not None:
                    old = imported.replaced
                    keys.update(await self._keys(old.thread_id, old.user_id))
            fenced = sorted(key for key in keys if key is not None)
            await self._redis.fence([(key, BLANKET) for key in fenced])
        return done

    # -- data lifecycle: each batch fences its threads' entries before it commits -----

    def _fencing(self, then: BatchHook | None, fenced: list[int]) -> BatchHook | None:
        """A ``before_commit`` hook that fences the entries of the threads a batch
        deletes (both modes, above the deleted life, as :meth:`adelete` does), then
        calls ``then``. It runs before the batch commits: no reader can see the rows
        gone while an entry still holds them, and a crash right after the commit
        leaves fences, not entries (a fence lives ``FENCE_SECONDS``; after it, a
        refill finds no row). Unlike a single delete, which fails open, a batch whose
        fences Redis did not confirm is rolled back (:class:`CacheUnreachable`): its
        threads would otherwise be gone with nothing left to say their entries must
        go, and a run again would not find them."""
        redis = self._redis
        if redis is None:
            return then

        async def fence(gone: Sequence[Commit]) -> None:
            fences: list[tuple[str, Fence]] = []
            for removed in gone:
                above = (removed.incarnation + 1, 0)  # nothing of the deleted life may land
                for key in await self._keys(removed.thread_id, removed.user_id):
                    if key is not None:
                        fences.append((key, above))
            if not await redis.fence_many(fences):
                problem = redis.status().last_error or "Redis did not answer in time"
                raise CacheUnreachable(
                    f"the cache entries of {len(gone)} thread(s) could not be fenced "
                    f"({problem}); their batch was rolled back, nothing of it deleted. "
                    "Run the call again once Redis answers: it goes on where it stopped"
                )
            fenced[0] += len(fences)
            if then is not None:
                await then(gone)

        return fence

    @traced(write=True)
    async def adelete_user(
        self,
        user_id: Any,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        sample: int = DEFAULT_SAMPLE,
        on_batch: ProgressHook | None = None,
        before_commit: BatchHook | None = None,
    ) -> DeleteResult:
        """Erase a user (see the repository), fencing the cache entries of every
        thread in the batch that deletes it, before that batch commits."""
        fenced = [0]
        done = await self.inner.adelete_user(
            user_id,
            batch_size=batch_size,
            dry_run=dry_run,
            sample=sample,
            on_batch=on_batch,
            before_commit=self._fencing(before_commit, fenced),
        )
        return replace(done, cache_keys=done.cache_keys + fenced[0])

    @traced(write=True)
    async def aprune_idle(
        self,
        older_than: timedelta,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        sample: int = DEFAULT_SAMPLE,
        on_batch: ProgressHook | None = None,
        before_commit: BatchHook | None = None,
        include_memories: bool = False,
    ) -> DeleteResult:
        """Delete idle threads (and, ``include_memories``, idle memories: see the
        repository), fencing their cache entries as :meth:`adelete_user` does."""
        fenced = [0]
        done = await self.inner.aprune_idle(
            older_than,
            batch_size=batch_size,
            dry_run=dry_run,
            sample=sample,
            on_batch=on_batch,
            before_commit=self._fencing(before_commit, fenced),
            include_memories=include_memories,
        )
        return replace(done, cache_keys=done.cache_keys + fenced[0])

    @traced()
    async def astats(self, *, top: int = 10, exact: bool = False) -> StoreStats:
        """The repository's stats (see there), with the keys under this cache's prefix
        (entries and fences), counted with ``SCAN`` (never ``KEYS``)."""
        found = await self.inner.astats(top=top, exact=exact)
        if self._redis is None:
            return found
        pattern = _glob_escape(await self._key_prefix()) + ":*"
        try:
            keys = await self._redis.count_keys(pattern)
        except Exception as exc:  # a report reports; the cache fails open everywhere
            return replace(found, cache_error=f"{type(exc).__name__}: {exc}")
        return replace(found, cache_keys=keys)


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
