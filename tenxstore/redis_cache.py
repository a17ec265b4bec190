"""The Redis side of the cache: entries, fences, bounded calls, fail-open.

An entry is the state as JSON with two members spliced in front::

    {"__checkpoint_version__":7,"__checkpoint_incarnation__":42,"topic":"..."}

so a cached read restores both into the run's config, and a guard can compare them
without parsing the state. A *fence* is a small value that stands in for an entry::

    {"__checkpoint_fence__":[43,0]}

It reads as a miss, and the guarded put refuses anything below it. A delete fences
the thread's keys above the deleted incarnation; a write fences the other isolation
mode's key at its new version. Fences live :data:`FENCE_SECONDS`, and a put that was
prepared longer than :data:`MAX_PUT_AGE` before it is sent is not sent (it fences
instead): so a refill that read the database before a delete can never land after
that delete's fence has expired, and none lands before.

Redis is best effort. Every failure is logged and ignored; after one, Redis is left
alone for a back-off window, so a dead Redis costs one bounded wait, not one per call.
Invalidations that could not be sent are remembered and sent before anything else
once Redis answers again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ConnectionError,
    NoScriptError,
    ResponseError,
)

from . import telemetry
from .backends.driver import causes
from .loops import PerLoop, shut_down
from .serde import RESERVED_KEY, decode
from .validate import MAX_COUNT

__all__ = [
    "BLANKET",
    "FENCE_SECONDS",
    "INCARNATION_MEMBER",
    "MAX_PUT_AGE",
    "CacheStatus",
    "Entry",
    "Fence",
    "RedisCache",
    "decode_entry",
]

log = logging.getLogger(__name__)

INCARNATION_MEMBER = "__checkpoint_incarnation__"
FENCE_SECONDS = 60.0
MAX_PUT_AGE = 20.0  # well inside FENCE_SECONDS, with room for the call's own timeout
_MAX_DIRTY = 10_000
_FENCE_PREFIX = b'{"__checkpoint_fence__":'

Fence = tuple[int, int]
"""(incarnation, version): refuse anything below it."""
BLANKET: Fence = (2**53 - 1, 0)
"""A fence that refuses every put while it lives (the new incarnation is not known)."""

# Both scripts read a key's head (entry or fence) the same way. Numbers travel as
# strings and are compared with tonumber (exact below 2**53); a number is never turned
# back into text inside the script (Lua would write 1e+15).
_PARSE_HEAD = """
local function parse(key)
  local head = redis.call('GETRANGE', key, 0, 127)
  if head == '' then return nil end
  local i, v = string.match(head, '^{"__checkpoint_fence__":%[(%d+),(%d+)%]')
  if i then return i, v, true end
  v, i = string.match(head, '^ ?{"__checkpoint_version__":(%d+),"__checkpoint_incarnation__":(%d+)')
  if v then return i, v, false end
  v = string.match(head, '^ ?{"__checkpoint_version__":(%d+)')
  if v then return '0', v, false end
  return nil
end
local function below(i1, v1, i2, v2)
  local a, b = tonumber(i1), tonumber(i2)
  return a < b or (a == b and tonumber(v1) < tonumber(v2))
end
"""

# KEYS[1] key   ARGV[1] incarnation ('' = unknown: keep the cached one's)   ARGV[2] version
# ARGV[3] ttl in ms (0: none)   ARGV[4] '' or the stdlib mark ' '   ARGV[5] the state's
# members after its '{' (',"a":1}' or '}')   ARGV[6] '1': only replace, never create
# Returns 1 when stored, 0 when the key holds an entry or a fence above it, 2 when the
# key is empty and ARGV[6] forbids creating it.
PUT_SCRIPT = (
    _PARSE_HEAD
    + """
local ci, cv, fence = parse(KEYS[1])
if ARGV[6] == '1' and not ci then return 2 end
local inc = ARGV[1]
if inc == '' then
  if fence then return 0 end
  inc = ci or '0'
end
if ci and below(inc, ARGV[2], ci, cv) then return 0 end
local value = ARGV[4] .. '{"__checkpoint_version__":' .. ARGV[2]
  .. ',"__checkpoint_incarnation__":' .. inc .. ARGV[5]
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], value)
end
return 1
"""
)

# KEYS[1] key   ARGV[1] incarnation   ARGV[2] version   ARGV[3] fence ttl in ms
# Replaces what the key holds with a fence at (ARGV[1], ARGV[2]) unless it already holds
# an entry or a fence at or above it. Returns 1 when fenced.
FENCE_SCRIPT = (
    _PARSE_HEAD
    + """
local ci, cv = parse(KEYS[1])
if ci and not below(ci, cv, ARGV[1], ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], '{"__checkpoint_fence__":[' .. ARGV[1] .. ',' .. ARGV[2] .. ']}',
  'PX', ARGV[3])
return 1
"""
)


# KEYS[1] key. Deletes an entry (or anything else) but never a fence: a fence is
# dropped only by its expiry or replaced by something above it. Returns 1 when deleted.
DROP_SCRIPT = (
    _PARSE_HEAD
    + """
local _, _, fence = parse(KEYS[1])
if fence then return 0 end
return redis.call('DEL', KEYS[1])
"""
)


async def _nothing() -> None:
    return None


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()  # Redis names scripts so


_PUT_SHA, _FENCE_SHA, _DROP_SHA = _sha(PUT_SCRIPT), _sha(FENCE_SCRIPT), _sha(DROP_SCRIPT)
_SCRIPTS = {_PUT_SHA: PUT_SCRIPT, _FENCE_SHA: FENCE_SCRIPT, _DROP_SHA: DROP_SCRIPT}
_FLUSH_CHUNK = 500  # remembered invalidations sent per pipeline


@dataclass(frozen=True)
class Entry:
    """A cached state with the version and incarnation it was cached at."""

    state: dict[str, Any]
    version: int
    incarnation: int | None


def decode_entry(raw: bytes) -> Entry | None:
    """An entry as read from Redis; None for a fence (a miss).

    Raises:
        ValueError: Not an entry: not JSON, truncated, not an object, no version...
    """
    if raw.startswith(_FENCE_PREFIX):
        return None
    try:
        data = decode(raw)  # a JSONDecodeError is a ValueError
    except RecursionError as exc:  # the stdlib decoder on absurd nesting
        raise ValueError("a cache entry nested too deep") from exc
    if not isinstance(data, dict):
        raise ValueError(f"a cache entry must be a JSON object, not {type(data).__name__}")
    version = data.pop(RESERVED_KEY, None)
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_COUNT:
        raise ValueError(f"a cache entry needs a version from 0 to 2**63-1, not {version!r}")
    incarnation = data.pop(INCARNATION_MEMBER, None)  # a state never holds it (see _body)
    if incarnation is not None and (
        isinstance(incarnation, bool)
        or not isinstance(incarnation, int)
        or not 0 <= incarnation <= MAX_COUNT
    ):
        raise ValueError(f"a cache entry's incarnation is out of range: {incarnation!r}")
    return Entry(data, version, incarnation)


async def _within(work: Awaitable[Any], seconds: float) -> Any:
    """``work``, bounded: in the calling task where asyncio allows it (3.11), which
    spares a task per call."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await work
    return await asyncio.wait_for(work, seconds)  # pragma: no cover - Python 3.10


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    return any(isinstance(seen, kind) for seen in causes(exc))


def _problem(exc: BaseException) -> str:
    """What an operator should check, by the class of a Redis failure."""
    if isinstance(exc, AuthenticationError):
        return "Redis refused the credentials: check the password (or user) in the Redis URL"
    if isinstance(exc, AuthorizationError):
        return "the Redis user may not run these commands (GET, SET, EVALSHA, DEL)"
    if isinstance(exc, ResponseError):
        return f"Redis refused a command ({exc}); a wrong database index or a server setting"
    if _caused_by(exc, ssl.SSLError):
        return "the TLS handshake with Redis failed: use rediss:// only if Redis serves TLS"
    if isinstance(exc, (ConnectionError, OSError)):
        detail = str(exc) or type(exc).__name__
        return f"Redis is unreachable ({detail}); is it running, and does it need TLS (rediss://)?"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "Redis did not answer in time"
    return f"Redis failed unexpectedly: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class CacheStatus:
    """What a health check reports of the cache."""

    available: bool
    down_for: float
    failures: int
    last_error: str | None
    pending_invalidations: int


class RedisCache:
    """A Redis client behind bounded, fail-open calls, one client per event loop.

    Args:
        client: The client for the first loop.
        make: Makes a client for another loop (None: the caller's client, used as is).
        owns: Whether the clients are closed by this class.
        timeout: Bound on every call, in seconds.
        backoff: First "down" window after a failure, doubling up to ``max_backoff``.
        ttl_ms: Entry lifetime in milliseconds (0: none).
    """

    def __init__(
        self,
        client: Any,
        *,
        make: Callable[[], Any] | None,
        owns: bool,
        timeout: float,
        backoff: float,
        max_backoff: float,
        ttl_ms: int,
    ) -> None:
        self._make = make
        self._clients = PerLoop(
            client,
            make=make,
            close=self._close_client if owns else None,
            reset=self._replace if owns and make is not None else None,
        )
        self.timeout = timeout
        self.backoff, self.max_backoff = backoff, max_backoff
        self.ttl_ms = ttl_ms
        self.fence_ms = int(FENCE_SECONDS * 1000)
        self.down_until = 0.0
        self.failures = 0
        self.last_error: str | None = None
        self.dirty: dict[str, Fence | None] = {}  # key -> fence to set (None: delete)
        self.cluster = isinstance(client, RedisCluster)

    @property
    def down(self) -> bool:
        """Whether Redis is left alone now (a failure's back-off window)."""
        return time.monotonic() < self.down_until

    @property
    def client(self) -> Any:
        """The client of the running loop (outside a loop: the first)."""
        return self._clients.current()

    def _replace(self, client: Any) -> Any:
        """A new client in place of one whose loop closed without closing it: its
        connections are ended (best effort) and forgotten, never reused."""
        pool = getattr(client, "connection_pool", None)
        if pool is not None:
            conns = [*pool._get_free_connections(), *pool._get_in_use_connections()]
            writers = (getattr(conn, "_writer", None) for conn in conns)
            shut_down(None if w is None else w.transport for w in writers)
            pool.reset()
        assert self._make is not None
        return self._make()

    @staticmethod
    async def _close_client(client: Any) -> None:
        try:
            await client.aclose()
        except Exception as exc:  # closing is best effort too
            log.debug("closing a redis client failed: %r", exc)

    def status(self) -> CacheStatus:
        """Whether Redis is being used now, and what went wrong last."""
        down_for = max(0.0, self.down_until - time.monotonic())
        return CacheStatus(
            available=down_for == 0.0,
            down_for=down_for,
            failures=self.failures,
            last_error=self.last_error,
            pending_invalidations=len(self.dirty),
        )

    def describe(self) -> str:
        """The Redis server(s), without a password, for messages."""
        client = self.client
        if self.cluster:
            nodes = client.get_nodes() if hasattr(client, "get_nodes") else []
            return "redis cluster " + ", ".join(f"{n.host}:{n.port}" for n in nodes)
        kwargs = client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
        return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"

    async def probe(self) -> str | None:
        """PING Redis now, down window or not (bounded); the problem, or None."""
        try:
            client = await self._clients.get()
            await asyncio.wait_for(client.ping(), self.timeout)
        except Exception as exc:  # a health check reports, it does not raise
            return _problem(exc)
        return None

    # -- the bounded, fail-open call -------------------------------------------------

    async def call(
        self,
        what: str,
        make: Callable[[Any], Awaitable[Any]],
        pending: dict[str, Fence | None] | None = None,
    ) -> Any:
        """Run one Redis call; on any failure log it, open the window, return None.

        ``pending`` holds the invalidations this call carries: remembered, and sent
        first thing once Redis answers, when the call does not get through.
        """
        if time.monotonic() < self.down_until:
            self._remember(pending)
            telemetry.cache_fail_open(what)
            return None
        try:
            client = self._clients.bound() or await self._clients.get()
            if self.dirty:  # what was deleted during an outage is fenced before anything
                await _within(self._flush(client), self.timeout)
            result = await _within(make(client), self.timeout)
        except asyncio.CancelledError:
            self._remember(pending)  # it may not have got through: make sure later
            raise
        except Exception as exc:  # fail open, whatever Redis (or its client) did
            self._remember(pending)
            self._failed(what, exc)
            telemetry.cache_fail_open(what)
            return None
        if self.failures:
            log.info("redis answers again after %d failed call(s)", self.failures)
            self.failures, self.last_error = 0, None
        return result

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        window = min(self.backoff * 2 ** (self.failures - 1), self.max_backoff)
        self.down_until = time.monotonic() + window
        problem = _problem(exc)
        if self.failures == 1 or problem != self.last_error:
            log.warning("redis %s failed: %s; serving from the database for now", what, problem)
        else:
            log.debug("redis %s failed again (%r); not tried for %.1fs", what, exc, window)
        self.last_error = problem

    def _remember(self, pending: dict[str, Fence | None] | None) -> None:
        for key, fence in (pending or {}).items():
            if key not in self.dirty:
                if len(self.dirty) >= _MAX_DIRTY:
                    log.error("too many cache keys await invalidation; relying on cache_ttl")
                    return
                self.dirty[key] = fence
            elif fence is not None:  # a fence is stronger than a delete; the higher wins
                known = self.dirty[key]
                self.dirty[key] = fence if known is None else max(fence, known)

    async def _flush(self, client: Any) -> None:
        """Send the remembered invalidations. A key leaves ``dirty`` only once its own
        command is confirmed (and was not made stronger meanwhile), and until then every
        read of it is a miss and every put of it refused (:meth:`pending`): a call that
        runs beside the flush, on this loop or another, can never get ahead of it."""
        while self.dirty:
            chunk = list(self.dirty.items())[:_FLUSH_CHUNK]
            if self.cluster:  # one key per command, side by side: cluster-safe
                await asyncio.gather(*(self._invalidate(client, k, f) for k, f in chunk))
            else:
                await self._execute(
                    client,
                    [
                        (_DROP_SHA, key, [])
                        if fence is None
                        else (_FENCE_SHA, key, self._fence_args(fence))
                        for key, fence in chunk
                    ],
                )
            for key, fence in chunk:
                if key in self.dirty and self.dirty[key] == fence:
                    del self.dirty[key]

    def pending(self, key: str) -> bool:
        """Whether an invalidation of ``key`` still waits to be sent."""
        return key in self.dirty

    async def _invalidate(self, client: Any, key: str, fence: Fence | None) -> None:
        if fence is None:
            await self._eval(client, _DROP_SHA, DROP_SCRIPT, key, [])
        else:
            await self._eval(client, _FENCE_SHA, FENCE_SCRIPT, key, self._fence_args(fence))

    @staticmethod
    async def _execute(client: Any, calls: list[tuple[str, str, list[Any]]]) -> list[Any]:
        """(sha, key, args) script calls in one pipeline; the scripts are loaded and the
        pipeline sent again when Redis lost them (a restart). The first failure is
        raised."""

        async def send() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for sha, key, args in calls:
                pipe.evalsha(sha, 1, key, *args)
            done: list[Any] = await pipe.execute(raise_on_error=False)
            return done

        results = await send()
        if any(isinstance(r, NoScriptError) for r in results):
            for script in _SCRIPTS.values():
                await client.script_load(script)
            results = await send()
        for failure in results:
            if isinstance(failure, Exception):
                raise failure
        return results

    # -- commands ----------------------------------------------------------------------

    def _fence_args(self, fence: Fence) -> list[Any]:
        return [fence[0], fence[1], self.fence_ms]

    @staticmethod
    async def _eval(client: Any, sha: str, script: str, key: str, args: list[Any]) -> Any:
        """EVALSHA, loading the script when Redis lost it (a restart)."""
        try:
            return await client.evalsha(sha, 1, key, *args)
        except NoScriptError:
            await client.script_load(script)
            return await client.evalsha(sha, 1, key, *args)

    async def get(self, key: str) -> bytes | None:
        """The raw value of ``key`` (None: absent, invalidation pending, or Redis
        unavailable)."""

        def get(client: Any) -> Awaitable[bytes | None]:
            if key in self.dirty:  # decided after the flush, right before the GET is sent
                return _nothing()
            result: Awaitable[bytes | None] = client.get(key)
            return result

        raw: bytes | None = await self.call("get", get)
        return raw

    async def put(
        self,
        key: str,
        body: tuple[str, str],
        version: int,
        incarnation: int | None,
        fences: Iterable[tuple[str, Fence]] = (),
        *,
        replace_only: bool = False,
    ) -> int:
        """The guarded put of ``key`` and the fences of other keys, in one round trip.

        ``body`` is the state's text split as (stdlib mark, members after ``{``). With
        ``replace_only`` an empty key is left empty.

        Returns:
            1 when stored; 0 when refused (or Redis unavailable); 2 when ``key`` is
            empty and ``replace_only`` forbade creating it.
        """
        others = dict(fences)
        pending: dict[str, Fence | None] = {
            key: (incarnation, version) if incarnation is not None else BLANKET,
            **others,
        }
        args = [
            "" if incarnation is None else incarnation,
            version,
            self.ttl_ms,
            *body,
            "1" if replace_only else "",
        ]
        stored = await self.call(
            "put", lambda client: self._put(client, key, args, others), pending
        )
        return int(stored or 0)

    async def _put(self, client: Any, key: str, args: list[Any], fences: dict[str, Fence]) -> Any:
        if self.pending(key):  # its invalidation is not confirmed yet: only fence others
            await self._fence_each(client, fences)
            return 0
        if self.cluster:  # redis-py refuses scripts in a cluster pipeline: side by side
            stored, *_ = await asyncio.gather(
                self._eval(client, _PUT_SHA, PUT_SCRIPT, key, args),
                *(
                    self._eval(client, _FENCE_SHA, FENCE_SCRIPT, other, self._fence_args(fence))
                    for other, fence in fences.items()
                ),
            )
            return stored
        calls = [(_PUT_SHA, key, args)]
        calls += [(_FENCE_SHA, other, self._fence_args(fence)) for other, fence in fences.items()]
        return (await self._execute(client, calls))[0]

    async def fence(self, fences: Iterable[tuple[str, Fence]]) -> None:
        """Fence each key (see the module's docstring)."""
        pending: dict[str, Fence | None] = dict(fences)
        if pending:
            await self.call("invalidate", lambda client: self._fence_each(client, pending), pending)

    async def fence_many(self, fences: Iterable[tuple[str, Fence]]) -> bool:
        """Fence many keys, in pipelines of up to 500 scripts (side by side on a
        cluster), each pipeline one bounded call. Whether Redis confirmed them all
        (those it did not are remembered for later, as every invalidation is)."""
        items = list(fences)
        confirmed = True
        for start in range(0, len(items), _FLUSH_CHUNK):
            chunk: dict[str, Fence | None] = dict(items[start : start + _FLUSH_CHUNK])

            async def send(client: Any, chunk: dict[str, Fence | None] = chunk) -> bool:
                await self._fence_all(client, chunk)
                return True

            confirmed = bool(await self.call("invalidate", send, chunk)) and confirmed
        return confirmed

    async def _fence_all(self, client: Any, fences: Mapping[str, Fence | None]) -> None:
        """Fence keys in one pipeline (side by side on a cluster)."""
        if self.cluster:
            await asyncio.gather(*(self._invalidate(client, k, f) for k, f in fences.items()))
            return
        calls = [(_FENCE_SHA, k, self._fence_args(f)) for k, f in fences.items() if f is not None]
        await self._execute(client, calls)

    async def _fence_each(self, client: Any, fences: Mapping[str, Fence | None]) -> None:
        for key, fence in fences.items():
            await self._invalidate(client, key, fence)

    async def drop(self, keys: Iterable[str]) -> None:
        """Delete the entries of keys, never a fence (one command each: cluster-safe)."""
        pending: dict[str, Fence | None] = dict.fromkeys(keys)
        if pending:
            await self.call("delete", lambda client: self._drop_each(client, pending), pending)

    async def _drop_each(self, client: Any, keys: Iterable[str]) -> None:
        for key in keys:
            await self._eval(client, _DROP_SHA, DROP_SCRIPT, key, [])

    async def count_keys(self, pattern: str, page_timeout: float = 5.0) -> int:
        """Keys matching the glob ``pattern``, by ``SCAN`` pages of 1000, each bounded
        by ``page_timeout`` (never ``KEYS``: it blocks Redis). For reports: a failure
        is raised, not swallowed."""
        client = await self._clients.get()
        count = 0
        if self.cluster:  # redis-py walks every primary
            async for _ in client.scan_iter(match=pattern, count=1000):
                count += 1
            return count
        cursor = 0
        while True:
            cursor, page = await asyncio.wait_for(
                client.scan(cursor, match=pattern, count=1000), page_timeout
            )
            count += len(page)
            if cursor == 0:
                return count

    async def aclose(self) -> None:
        """Close the running loop's client, if this class created it."""
        await self._clients.aclose_current()
