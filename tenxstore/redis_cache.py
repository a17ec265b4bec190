"""The Redis side of the cache: entries, fences, bounded calls, fail-open.

An entry is the state as JSON with two members spliced in front::

    {"__checkpoint_version__":7,"__checkpoint_incarnation__":42,"topic":"..."}

so a cached read restores both into the run's config, and a guard can compare them
without parsing the state. A *fence* is a small value that stands in for an entry::

    {"__checkpoint_fence__":[43,0]}

It reads as a miss, and the guarded put refuses anything below it. An entry is stored
behind the name of the master that stored it (``m:<master_replid>:``, cut off before
the entry is decoded; a fence has none): a read serves only the master's own entries,
and a put lands only on the master its caller knew before it read or wrote the
database (see :mod:`tenxstore.redis_scripts`), so a replica promoted without the last
writes and fences never serves an older state than the database holds. The name is a
prefix, not a member, so that a release before this one reads such a value as one that
does not decode (a miss), never as a member of the state. A delete fences
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
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio.cluster import RedisCluster

from . import telemetry
from .loops import PerLoop
from .redis_client import close_client, replace_client
from .redis_client import describe as _describe
from .redis_client import problem as _problem
from .redis_client import within as _within
from .redis_scripts import (
    DROP_SCRIPT,
    DROP_SHA,
    FENCE_SCRIPT,
    FENCE_SHA,
    GET_SCRIPT,
    GET_SHA,
    MASTER_SCRIPT,
    MASTER_SHA,
    PUT_SCRIPT,
    PUT_SHA,
    run_pipeline,
    run_script,
)
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


async def _nothing() -> None:
    return None


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
    incarnation = data.pop(INCARNATION_MEMBER, None)  # a state never holds it (cache_entries)
    if incarnation is not None and (
        isinstance(incarnation, bool)
        or not isinstance(incarnation, int)
        or not 0 <= incarnation <= MAX_COUNT
    ):
        raise ValueError(f"a cache entry's incarnation is out of range: {incarnation!r}")
    return Entry(data, version, incarnation)


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
            close=close_client if owns else None,
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
        self.masters: dict[str, str] = {}  # the id of the master of each node, last heard

    @property
    def down(self) -> bool:
        """Whether Redis is left alone now (a failure's back-off window)."""
        return time.monotonic() < self.down_until

    @property
    def client(self) -> Any:
        """The client of the running loop (outside a loop: the first)."""
        return self._clients.current()

    def _replace(self, client: Any) -> Any:
        """A new client in place of one whose loop closed without closing it (see
        :func:`~tenxstore.redis_client.replace_client`)."""
        assert self._make is not None
        return replace_client(client, self._make)

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
        return _describe(self.client, self.cluster)

    async def probe(self) -> str | None:
        """Ask Redis now which master it is, down window or not (bounded): the script
        every cached read runs the heart of (``INFO`` inside Lua, which a user the ACL
        denies it cannot run); the problem, or None. On a cluster, a PING of each node."""
        try:
            client = await self._clients.get()
            if self.cluster:
                await asyncio.wait_for(client.ping(), self.timeout)
            else:
                ask = run_script(client, MASTER_SHA, MASTER_SCRIPT, "tenxstore", [])
                await asyncio.wait_for(ask, self.timeout)
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
                await run_pipeline(
                    client,
                    [
                        (DROP_SHA, key, [])
                        if fence is None
                        else (FENCE_SHA, key, self._fence_args(fence))
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
            await run_script(client, DROP_SHA, DROP_SCRIPT, key, [])
        else:
            await run_script(client, FENCE_SHA, FENCE_SCRIPT, key, self._fence_args(fence))

    def _fence_args(self, fence: Fence) -> list[Any]:
        return [fence[0], fence[1], self.fence_ms]

    # -- the master ----------------------------------------------------------------------

    def _node(self, key: str | None) -> str | None:
        """The node ``key`` lives on, as :attr:`masters` names it ('' for one Redis;
        None on a cluster without a key, or whose slots the client has not read yet)."""
        if not self.cluster:
            return ""
        if key is None:
            return None
        try:
            return str(self.client.get_node_from_key(key).name)
        except Exception:  # the slots are read at the client's first call
            return None

    def known_master(self, key: str | None) -> str:
        """The id of ``key``'s master as last heard ('' when none was): a put prepared
        now lands only on that master (else it fences)."""
        node = self._node(key)
        return "" if node is None else self.masters.get(node, "")

    def _heard(self, key: str, master: Any) -> None:
        node = self._node(key)
        if node is not None and isinstance(master, bytes):
            self.masters[node] = master.decode("ascii")

    async def master(self, key: str | None) -> str:
        """:meth:`known_master`, asked of Redis (bounded, fail-open) when none was heard
        yet: what a write names before it goes to the database ('' when Redis did not
        answer, or a cluster's ``key`` is not known yet: the write's put then fences).
        One Redis needs no key."""
        known = self.known_master(key)
        if known or (self.cluster and key is None):
            return known
        at = "tenxstore" if key is None else key  # where a cluster routes the call

        def ask(client: Any) -> Awaitable[Any]:
            return run_script(client, MASTER_SHA, MASTER_SCRIPT, at, [])

        self._heard(at, await self.call("master", ask))
        return self.known_master(at)

    # -- commands ----------------------------------------------------------------------

    async def get(self, key: str) -> tuple[bytes | None, bool]:
        """(the raw value of ``key``, whether it is an entry of the master that answered).

        The value is None when the key is absent, holds a fence or another master's entry
        (dropped), when an invalidation of it is pending, or Redis is unavailable; an
        entry of this master comes without its name (``m:<master>:``), as
        :func:`decode_entry` reads it. A value that names no master (an earlier
        release's entry, or garbage) is returned with False: never to be served.
        """

        def get(client: Any) -> Awaitable[Any]:
            if key in self.dirty:  # decided after the flush, right before the GET is sent
                return _nothing()
            return run_script(client, GET_SHA, GET_SCRIPT, key, [])

        found = await self.call("get", get)
        if isinstance(found, bytes):  # an entry of the master that answered
            end = found.find(b":", 2)
            self._heard(key, found[2:end])
            return found[end + 1 :], True
        if not found:
            return None, False
        self._heard(key, found[0])
        return (None, False) if len(found) == 1 else (found[1], False)

    async def put(
        self,
        key: str,
        body: tuple[str, str],
        version: int,
        incarnation: int | None,
        fences: Iterable[tuple[str, Fence]] = (),
        *,
        master: str,
        replace_only: bool = False,
    ) -> int:
        """The guarded put of ``key`` and the fences of other keys, in one round trip.

        ``body`` is the state's text split as (stdlib mark, members after ``{``). With
        ``replace_only`` an empty key (or one of another master's entry) is left so.
        ``master`` is the master the caller knew before it read or wrote what it puts
        (:meth:`known_master` then): on another, the put fences instead.

        Returns:
            1 when stored; 0 when refused (or Redis unavailable); 2 when ``key`` is
            empty and ``replace_only`` forbade creating it; 3 when fenced instead (the
            master is not the one the caller knew).
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
            master,
            self.fence_ms,
        ]
        stored = await self.call(
            "put", lambda client: self._put(client, key, args, others), pending
        )
        if isinstance(stored, list):  # [code, the id of the master that ran it]
            self._heard(key, stored[1])
            return int(stored[0])
        return int(stored or 0)

    async def _put(self, client: Any, key: str, args: list[Any], fences: dict[str, Fence]) -> Any:
        if self.pending(key):  # its invalidation is not confirmed yet: only fence others
            await self._fence_each(client, fences)
            return 0
        if self.cluster:  # redis-py refuses scripts in a cluster pipeline: side by side
            stored, *_ = await asyncio.gather(
                run_script(client, PUT_SHA, PUT_SCRIPT, key, args),
                *(
                    run_script(client, FENCE_SHA, FENCE_SCRIPT, other, self._fence_args(fence))
                    for other, fence in fences.items()
                ),
            )
            return stored
        calls = [(PUT_SHA, key, args)]
        calls += [(FENCE_SHA, other, self._fence_args(fence)) for other, fence in fences.items()]
        return (await run_pipeline(client, calls))[0]

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
        calls = [(FENCE_SHA, k, self._fence_args(f)) for k, f in fences.items() if f is not None]
        await run_pipeline(client, calls)

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
            await run_script(client, DROP_SHA, DROP_SCRIPT, key, [])

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
