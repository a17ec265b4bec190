"""Read replicas: the reads that tolerate lag served by a PostgreSQL standby whose lag
is known to be within a bound, and by the primary otherwise.

A replica is used only while an upper bound of how far it is behind the primary is at
most ``max_replica_lag``. The bound is measured by a probe in two statements: the
primary's flushed WAL position is read (at time ``t0``), then the standby says
whether it has replayed that far. If it has, it holds every commit made before
``t0``: its lag is at most ``now - t0``. If it has not, its lag is at most the age of
the last transaction it replayed (``clock_timestamp() - pg_last_xact_replay_timestamp()``,
on the standby's clock). A lag bound grows by at most a second a second, so a
measurement stays valid without another round trip until it reaches the bound; the
probe runs again, inline on the read that finds it past half the bound, once per
replica at a time, and at most once per quarter of the bound (a replica found behind
is not probed by every read while it catches up).

A replica serves only while it is in recovery and streams this primary's timeline
(its WAL receiver ``streaming`` on the timeline the primary writes: a promoted standby,
one cut off, or a former primary whose history split from this one's serves nothing).
One that is down, refused us, fails that check, or does not answer a probe within
:data:`PROBE_TIMEOUT` is skipped for :data:`SKIP_SECONDS`; its reads go to the primary
meanwhile. A read that fails on a replica, or takes past :data:`REPLICA_TIMEOUT`, is
run on the primary (reads are idempotent), so a replica never makes a read fail that
the primary would have answered.

A process never reads its own writes as missing: :class:`Writes` records when it last
wrote (each thread, and anything), and a replica serves a read only once a probe shows
it holds the commits made before that time. What goes where is the caller's choice:
a read a write will compare against never comes here (:mod:`tenxstore.store` routes
only those that tolerate lag), and a read of a thread whose config recorded a version
sends a guarded statement that returns nothing on a replica that has not replayed it
(then the primary answers).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import ConnectionLost, DatabaseUnavailable
from ..types import ReadSource, ReplicaHealth

if TYPE_CHECKING:
    from .base import Backend

__all__ = [
    "DEFAULT_MAX_LAG",
    "PRIMARY",
    "SKIP_SECONDS",
    "ReplicaSet",
    "Writes",
    "lag_tolerated",
    "tolerating_lag",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_LAG = 5.0
"""Seconds a replica may be behind the primary and still serve reads (by default)."""
SKIP_SECONDS = 5.0
"""How long a replica that failed (down, refused, promoted, diverged) is left alone."""
PROBE_TIMEOUT = 1.0
"""Seconds each statement of a probe may take: a standby that hangs is skipped."""
REPLICA_TIMEOUT = 10.0
"""Seconds a read may take on a replica before the primary answers it instead."""
PRIMARY = ReadSource(None, 0.0)

# The primary's flushed WAL position and its timeline (the first 8 hex digits of the
# name of the WAL file that holds it: a function any role may call on a primary).
_PRIMARY_POSITION = text(
    "SELECT pg_current_wal_flush_lsn()::text,"
    " substr(pg_walfile_name(pg_current_wal_flush_lsn()), 1, 8)"
)
# Whether the standby is in recovery, has replayed that far, how old its last replayed
# transaction is, and its WAL receiver's state and timeline (NULL for a role without
# pg_read_all_stats: then it cannot be told to follow this primary).
_REPLICA_POSITION = text(
    "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn() >= CAST(CAST(:lsn AS text) AS pg_lsn),"
    " EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8,"
    " r.pid IS NOT NULL, r.status, r.received_tli"
    " FROM (SELECT 1) AS one LEFT JOIN pg_stat_wal_receiver AS r ON true"
)


class Writes:
    """When this process last wrote (monotonic seconds): anything, and each thread (the
    most recent ``size`` of them; a thread forgotten counts as written when the
    newest forgotten one was). A read that tolerates lag goes to a replica only when
    the replica holds what this process wrote before it."""

    def __init__(self, size: int = 10_000) -> None:
        self.last = float("-inf")
        self._threads: OrderedDict[Any, float] = OrderedDict()
        self._forgotten = float("-inf")
        self._size = size
        self._lock = threading.Lock()

    def wrote(self, thread_ids: Iterable[Any] = ()) -> None:
        """A write (of ``thread_ids``) has just ended, committed or not."""
        now = time.monotonic()
        with self._lock:
            self.last = now
            for thread_id in thread_ids:
                self._threads[thread_id] = now
                self._threads.move_to_end(thread_id)
            while len(self._threads) > self._size:
                _, at = self._threads.popitem(last=False)
                self._forgotten = max(self._forgotten, at)

    def of_thread(self, thread_id: Any) -> float:
        """When this process last wrote ``thread_id``."""
        with self._lock:
            return self._threads.get(thread_id, self._forgotten)


@dataclass
class Replica:
    """One standby and what is known of it."""

    backend: Backend
    name: str
    holds: float | None = None
    """A monotonic time before which it holds every commit (None: not known)."""
    probed: float = float("-inf")
    """When it was last probed: probed again only a quarter of the bound later, not by
    every read meanwhile."""
    skipped_until: float = 0.0
    why: str = "not measured yet"
    probing: bool = False
    served: int = 0

    def bound(self, now: float) -> float | None:
        """An upper bound of its lag now (None: not known)."""
        return None if self.holds is None else max(0.0, now - self.holds)


_AFTER: ContextVar[float | None] = ContextVar("tenxstore_lag_tolerated", default=None)


def lag_tolerated() -> float | None:
    """When the running call's reads tolerate lag (:func:`tolerating_lag`): what a
    replica must hold to serve them (the commits made before this monotonic time);
    else None."""
    return _AFTER.get()


@contextmanager
def tolerating_lag(after: float) -> Iterator[None]:
    """Within the block, the repository's reads may be served by a replica (each is,
    when one is within its bound and holds what was written before ``after``; writes
    and locks always go to the primary). Never around a ``yield`` of an async
    generator: a context variable set there leaks into its consumer."""
    token = _AFTER.set(after)
    try:
        yield
    finally:
        _AFTER.reset(token)


class ReplicaSet:
    """The standbys of a primary, used in turn while their lag is within bound.

    Args:
        primary: The primary's backend (it answers every read no replica may).
        replicas: A backend per standby (PostgreSQL, opened like the primary's).
        max_lag: Seconds a replica may be behind and still serve.
        clock: Monotonic seconds (tests give their own).
    """

    def __init__(
        self,
        primary: Backend,
        replicas: Sequence[Backend],
        max_lag: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.max_lag = max_lag
        self.replicas = [Replica(backend, backend.describe()) for backend in replicas]
        self._clock = clock
        self._turn = 0
        self.primary_reads = 0
        """Reads that tolerated lag and went to the primary (no replica fit)."""

    def bind(self, sql: Any) -> None:
        """Give each standby the primary's statements (its driver-level reads)."""
        for replica in self.replicas:
            replica.backend.bind(sql)

    async def aclose(self) -> None:
        """Close each standby's pool of the running loop."""
        for replica in self.replicas:
            await replica.backend.aclose()

    # -- choosing -------------------------------------------------------------------

    async def pick(self, after: float = float("-inf")) -> tuple[Replica, float] | None:
        """A replica within bound that holds what was written before ``after``, and its
        bound; each in turn. None: none is (the primary answers)."""
        count = len(self.replicas)
        start, self._turn = self._turn, (self._turn + 1) % count
        for step in range(count):
            replica = self.replicas[(start + step) % count]
            now = self._clock()
            if now < replica.skipped_until:
                continue
            if not self._fits(replica, now, after) and self._may_probe(replica, now):
                await self.probe(replica)
                now = self._clock()
            if self._fits(replica, now, after) and now >= replica.skipped_until:
                bound = replica.bound(now)
                assert bound is not None
                return replica, bound
        return None

    def _fits(self, replica: Replica, now: float, after: float) -> bool:
        holds = replica.holds
        return holds is not None and holds > after and now - holds <= self.max_lag

    def _may_probe(self, replica: Replica, now: float) -> bool:
        return not replica.probing and now - replica.probed >= self.max_lag / 4

    async def probe(self, replica: Replica) -> None:
        """Measure until when ``replica`` holds every commit (see the module)."""
        replica.probing = True
        try:
            started = replica.probed = self._clock()
            try:
                found = await _within(self.primary.read_here(_PRIMARY_POSITION))
            except Exception as exc:  # the reads then go to the primary, which says why
                replica.holds, replica.why = None, f"the primary's WAL position: {exc}"
                return
            first: Any = found[0]
            position, timeline = first[0], int(first[1], 16)
            asked = self._clock()
            try:
                row = (
                    await _within(replica.backend.read_here(_REPLICA_POSITION, {"lsn": position}))
                )[0]
            except Exception as exc:  # down, refused, hung (a timeout)
                self.failed(replica, exc)
                return
            self._measured(replica, row, timeline, started, asked)
        finally:
            replica.probing = False

    def _measured(
        self, replica: Replica, row: Any, timeline: int, started: float, asked: float
    ) -> None:
        recovering, caught_up, behind, receiving, status, received = tuple(row)
        if not recovering:
            self._skip(replica, "it is not in recovery: promoted, it follows no primary")
        elif receiving and status is None:
            self._skip(
                replica,
                "its WAL receiver cannot be seen (GRANT pg_read_all_stats to this role): "
                "it cannot be told to follow this primary",
            )
        elif status != "streaming" or received != timeline:
            self._skip(
                replica,
                f"it does not stream this primary's timeline {timeline} "
                f"(WAL receiver {status or 'stopped'}, timeline {received})",
            )
        else:
            replica.skipped_until = 0.0  # it answers, and follows this primary
            if caught_up:
                replica.holds, replica.why = started, ""
            elif behind is None:
                replica.holds, replica.why = None, "it has replayed no transaction yet"
            else:
                replica.holds = asked - max(0.0, float(behind))
                replica.why = "" if behind <= self.max_lag else "it lags past the bound"

    async def health(self) -> tuple[ReplicaHealth, ...]:
        """Each replica measured now: its lag bound, and why it serves no reads."""
        found = []
        for replica in self.replicas:
            await self.probe(replica)
            bound = replica.bound(self._clock())
            error = replica.why or None
            if error is None and (bound is None or bound > self.max_lag):
                error = f"it lags past max_replica_lag ({self.max_lag:g} s)"
            found.append(ReplicaHealth(replica.name, bound, error))
        return tuple(found)

    def failed(self, replica: Replica, exc: BaseException) -> None:
        """A read or probe on ``replica`` failed: skip it for a while."""
        self._skip(replica, str(exc) or type(exc).__name__)

    def _skip(self, replica: Replica, why: str) -> None:
        if replica.skipped_until <= self._clock():
            log.warning("replica %s skipped for %.0f s: %s", replica.name, SKIP_SECONDS, why)
        replica.holds, replica.why = None, why
        replica.skipped_until = self._clock() + SKIP_SECONDS

    # -- serving ---------------------------------------------------------------------

    async def serve(
        self,
        work: Callable[[Backend, bool], Awaitable[T]],
        accept: Callable[[T], bool] | None = None,
        after: float = float("-inf"),
    ) -> tuple[T, ReadSource]:
        """``work(backend, on_replica)`` on a replica within bound that holds what was
        written before ``after`` and whose result ``accept`` takes; else on the
        primary. A replica's failure (a timeout included) is never the caller's: the
        primary answers instead."""
        picked = await self.pick(after)
        if picked is not None:
            replica, bound = picked
            started = self._clock()
            try:
                result = await asyncio.wait_for(work(replica.backend, True), REPLICA_TIMEOUT)
            except (DatabaseUnavailable, ConnectionLost, asyncio.TimeoutError) as exc:
                self.failed(replica, exc)
            except Exception as exc:  # e.g. a conflict with recovery: not the caller's
                log.info("a read on replica %s failed (%s): the primary answers", replica.name, exc)
            else:
                if accept is None or accept(result):
                    replica.served += 1
                    elapsed = self._clock() - started
                    return result, ReadSource(replica.name, bound + elapsed)
        self.primary_reads += 1
        return await work(self.primary, False), PRIMARY

    @asynccontextmanager
    async def snapshot(
        self, enter: Callable[[Backend], Any], after: float
    ) -> AsyncIterator[AsyncConnection]:
        """A snapshot (``enter(backend)``, a context manager) on a replica within bound,
        else on the primary. Only its opening falls back: what runs inside is the
        caller's."""
        picked = await self.pick(after)
        async with AsyncExitStack() as stack:
            conn: AsyncConnection | None = None
            if picked is not None:
                replica, _ = picked
                try:
                    conn = await _within(stack.enter_async_context(enter(replica.backend)))
                except (DatabaseUnavailable, ConnectionLost, DBAPIError, TimeoutError) as exc:
                    self.failed(replica, exc)
                else:
                    replica.served += 1
            if conn is None:
                self.primary_reads += 1
                conn = await stack.enter_async_context(enter(self.primary))
            assert conn is not None
            yield conn


async def _within(work: Awaitable[T]) -> T:
    """``work`` bounded by :data:`PROBE_TIMEOUT` (``TimeoutError`` past it)."""
    try:
        return await asyncio.wait_for(work, PROBE_TIMEOUT)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no answer within {PROBE_TIMEOUT:g} s") from None
