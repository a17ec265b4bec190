"""Connections: those borrowed from SQLAlchemy's pool for driver-level hot statements,
the engine of one event loop, each connection's session set up once, and a
connection given back to the pool (reset, or discarded) without an error that is not
the caller's."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import QueuePool
from sqlalchemy.util import greenlet_spawn

from ..errors import ConnectionLost

__all__ = [
    "ASYNCPG",
    "Borrowed",
    "DriverOps",
    "EngineSet",
    "borrow",
    "give_back",
    "on_every_connection",
    "reset_or_discard",
]

log = logging.getLogger(__name__)


class DriverOps:
    """What :class:`Borrowed` asks of a driver connection (asyncpg's, this default)."""

    def closed(self, driver: Any) -> bool:
        """Whether it is closed."""
        return bool(driver.is_closed())

    def in_transaction(self, driver: Any) -> bool:
        """Whether a transaction is open on it."""
        return bool(driver.is_in_transaction())

    async def lend(self, driver: Any) -> None:
        """Make a connection just checked out of the pool ready for hot statements."""

    async def back(self, driver: Any) -> None:
        """Make a borrowed connection ready for the pool again (SQLAlchemy's use)."""

    async def settle(self, driver: Any) -> None:
        """After a statement cancelled mid-flight: return once it can no longer commit
        and the connection is usable (raise if it is not)."""
        await driver.fetchval("SELECT 1")  # asyncpg cancels it on the server meanwhile


ASYNCPG = DriverOps()


class Borrowed:
    """Connections borrowed from SQLAlchemy's pool for driver-level hot statements,
    kept between calls so a hot call pays no checkout.

    A hot call takes one (the last one given back, or a new checkout), runs its
    statement on the driver connection, and gives it back. At most ``capacity`` (the
    pool's size) are borrowed at once; a hot call beyond that waits here and is handed
    the next one given back, without a trip through the pool. The pool still owns
    every one: its limits bound them, and they go back to it at the loop's shutdown,
    at ``aclose()``, and after :data:`HOLD_SECONDS` (so the pool can recycle them).

    SQLAlchemy's own checkouts never starve: they count themselves as waiting
    (:meth:`checkout`), a connection given back while one waits goes to the pool
    (which serves its waiters in turn), and one that finds the pool empty first
    returns an idle connection to it.
    """

    HOLD_SECONDS = 300.0

    def __init__(self, engine: AsyncEngine, ops: DriverOps = ASYNCPG) -> None:
        self.engine = engine
        self.ops = ops
        pool = engine.sync_engine.pool
        self.capacity = pool.size() if isinstance(pool, QueuePool) else 0
        self._idle: list[tuple[Any, float]] = []
        self._held = 0  # borrowed now: in use by hot calls, or idle here
        self._waiting = 0  # checkouts waiting for the pool (hot and SQLAlchemy's)
        self._sqlalchemy_waiting = 0  # of which SQLAlchemy's own
        self._queue: collections.deque[asyncio.Future[tuple[Any, float] | None]] = (
            collections.deque()
        )
        self._giving: set[asyncio.Task[None]] = set()

    async def take(self) -> tuple[Any, float]:
        """A pooled connection (its driver connection is ``.driver_connection``) and the
        time it was checked out."""
        while True:
            now = time.monotonic()
            while self._idle:
                fairy, since = self._idle.pop()
                driver = fairy.driver_connection
                if self.ops.closed(driver) or self.ops.in_transaction(driver):
                    self.discard(fairy)
                elif now - since > self.HOLD_SECONDS:
                    await self._to_pool(fairy)
                else:
                    return fairy, since
            if self._held < self.capacity or not self.capacity:
                return await self._checkout(now)
            handed: asyncio.Future[tuple[Any, float] | None]
            handed = asyncio.get_running_loop().create_future()
            self._queue.append(handed)
            try:
                got = await handed
            except asyncio.CancelledError:
                if handed in self._queue:
                    self._queue.remove(handed)
                elif handed.done() and not handed.cancelled():
                    given = handed.result()
                    if given is not None:  # handed over as we were cancelled: pass it on
                        self.give_later(*given)
                    else:
                        self._wake()  # a slot came free: pass that on too
                raise
            if got is not None:
                return got
            # None: a borrowed connection left (closed or broken): check one out

    async def _checkout(self, now: float) -> tuple[Any, float]:
        self._held += 1
        self._waiting += 1
        try:
            fairy = await self.engine.raw_connection()
        except BaseException:
            self._held -= 1
            self._wake()
            raise
        finally:
            self._waiting -= 1
        driver: Any = fairy.driver_connection
        if self.ops.in_transaction(driver):  # pragma: no cover - a bug
            self.discard(fairy)
            raise AssertionError("a pooled connection arrived inside a transaction")
        try:
            await self.ops.lend(driver)
        except BaseException:
            self.discard(fairy)
            raise
        return fairy, now

    def _wake(self) -> None:
        """A borrowed connection left: a hot call waiting here may check one out."""
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _to_pool(self, fairy: Any) -> None:
        """Back to SQLAlchemy's pool, readied for it and reset — to the end even when
        the caller is cancelled meanwhile (then the cancellation goes on): a reset
        cancelled halfway would leave the connection mid-statement."""
        self._held -= 1
        self._wake()
        going = asyncio.ensure_future(self._readied_to_pool(fairy))
        cancelled: asyncio.CancelledError | None = None
        while not going.done():
            try:
                await asyncio.shield(going)
            except asyncio.CancelledError as exc:
                cancelled = exc
        if cancelled is not None:
            raise cancelled

    async def _readied_to_pool(self, fairy: Any) -> None:
        try:
            await self.ops.back(fairy.driver_connection)
        except Exception:  # broken: the pool must not get it back as it is
            fairy.invalidate()
        await greenlet_spawn(fairy.close)

    async def give(self, fairy: Any, since: float) -> None:
        """Back after a call that left it healthy: to SQLAlchemy when a checkout of its
        waits, else to a hot call waiting here, else idle (or to the pool when enough
        are idle)."""
        if not self._sqlalchemy_waiting:
            while self._queue:
                waiter = self._queue.popleft()
                if not waiter.done():
                    waiter.set_result((fairy, since))
                    return
            if not self._waiting and len(self._idle) < self.capacity:
                self._idle.append((fairy, since))
                return
        await self._to_pool(fairy)

    def give_later(self, fairy: Any, since: float) -> None:
        """:meth:`give`, from a caller that may not await (it is being cancelled)."""
        task = asyncio.ensure_future(self.give(fairy, since))
        self._giving.add(task)
        task.add_done_callback(self._giving.discard)

    @asynccontextmanager
    async def checkout(self) -> AsyncIterator[None]:
        """Around a SQLAlchemy checkout: an empty pool first gets an idle connection
        back, and while the checkout waits, connections given back go to the pool."""
        self._waiting += 1
        self._sqlalchemy_waiting += 1
        try:
            if self._idle and not self.engine.sync_engine.pool.checkedin():  # type: ignore[attr-defined]
                fairy, _ = self._idle.pop(0)  # the oldest: the newest stay warm
                await self._to_pool(fairy)
            yield
        finally:
            self._waiting -= 1
            self._sqlalchemy_waiting -= 1

    async def settle(self, fairy: Any, since: float) -> None:
        """After a cancelled statement: the driver cancels it on the server, and the
        connection's next statement waits until that is done; once it has run, the
        cancelled statement can no longer commit, and the connection is back.
        (Closing it at once would leave the statement running, to commit later.)"""
        try:
            await self.ops.settle(fairy.driver_connection)
        except Exception:
            self.discard(fairy)
            return
        await self.give(fairy, since)

    def discard(self, fairy: Any) -> None:
        """Never use it again (broken); no await needed."""
        self._held -= 1
        self._wake()
        fairy.invalidate()
        fairy.close()

    def after_disconnect(self) -> None:
        """A connection was found dead: the idle ones (borrowed and pooled) likely died
        with it (a restarted server), so none is reused. The borrowed ones are
        discarded; the pool recycles every connection it opened until now at its next
        checkout (closed, and opened anew), as SQLAlchemy does after a disconnect of
        its own (``Pool._invalidate``, here for all of them, whatever their age).

        The pool is not replaced (``engine.dispose()``): a connection in use meanwhile
        (another call's) would go back to the old pool, which nothing closes, and be
        left unclosed to the garbage collector, still open on the server until then."""
        idle, self._idle = self._idle, []
        for fairy, _ in idle:
            self.discard(fairy)
        self.engine.sync_engine.pool._invalidate_time = time.time()

    async def release_all(self) -> None:
        """Give every idle connection back to the pool."""
        idle, self._idle = self._idle, []
        for fairy, _ in idle:
            await self._to_pool(fairy)

    def forget(self) -> list[Any]:
        """Drop them without a word: their event loop is gone, so they cannot be closed
        (nor terminated). Each is detached from the pool, which forgets it; their
        driver connections are returned, to be ended by their sockets."""
        idle, self._idle = self._idle, []
        drivers = [fairy.driver_connection for fairy, _ in idle]
        for fairy, _ in idle:
            fairy.detach()
        self._held = 0
        self._queue.clear()
        return drivers


async def borrow(
    backend: Any, borrowed: Borrowed, attempt: int, errors: tuple[type[BaseException], ...]
) -> tuple[Any, float] | None:
    """A borrowed connection and when it was checked out, for try ``attempt`` of a hot
    call of ``backend``; None when it broke while it was opened (one of ``errors``) and
    another is to be tried (nothing was sent). A refusal is the backend's error."""
    try:
        return await borrowed.take()
    except errors as exc:
        failure = backend.opening_failed(exc)
        if isinstance(failure, ConnectionLost) and await backend.retry.again(
            attempt, _BACKEND_LOG, backend.name, "a connection broke while it was opened"
        ):
            return None
        raise failure from exc


_BACKEND_LOG = logging.getLogger("tenxstore.backends.base")  # a backend's messages


class EngineSet:
    """The engine of one event loop, its view for single-statement reads, and the
    connections borrowed from its pool for hot statements."""

    __slots__ = ("borrowed", "engine", "read")

    def __init__(
        self, engine: AsyncEngine, read_options: dict[str, Any], ops: DriverOps = ASYNCPG
    ) -> None:
        self.engine = engine
        self.read = engine.execution_options(**read_options)
        self.borrowed = Borrowed(engine, ops)


_SESSION_READY = "tenxstore_session_ready"


def on_every_connection(engine: Any, setup: Callable[[Any, Any], None]) -> None:
    """Run ``setup(dbapi_connection, connection_record)`` on every connection of a (sync)
    engine: as it is made, and — for one its pool held before tenxstore took the engine
    over (an application's engine, already used) — at its first checkout. Without that,
    such a connection kept the server's session defaults (no ``lock_timeout`` on
    PostgreSQL; REPEATABLE READ and a 50 s lock wait on MySQL; the driver's implicit
    transactions on SQLite)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        try:
            setup(dbapi_connection, record)
        except BaseException:
            # SQLAlchemy's pool lets go of a connection whose connect event failed
            # without closing it (the driver then warns of it, unclosed, when it is
            # collected: a backend ended while its session was set up, say).
            with contextlib.suppress(Exception):
                dbapi_connection.close()
            raise
        record.info[_SESSION_READY] = True

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if not record.info.get(_SESSION_READY):
            setup(dbapi_connection, record)
            record.info[_SESSION_READY] = True


def _one_line(exc: BaseException) -> str:
    """An error in one line: its class and its first line (for a WARNING)."""
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__


def reset_or_discard(engine: Any, name: str) -> None:
    """Reset each connection as it goes back to the pool (SQLAlchemy's rollback, which
    ``pool_reset_on_return=None`` turns off), and discard one that cannot be reset.

    A connection the server ended while it was checked out (a ``KILL``, a restart, an
    idle timeout) fails its rollback; SQLAlchemy's own reset logs that at ERROR with a
    traceback, for what is neither an error of the caller (its work was done, or
    failed, before) nor of tenxstore. It is one WARNING line here; the connection is
    discarded as SQLAlchemy would, and the pool opens a new one when it needs one."""

    @event.listens_for(engine, "reset")
    def _reset(dbapi_connection: Any, record: Any, state: Any) -> None:
        if state.transaction_was_reset or not state.asyncio_safe:
            return  # rolled back already / a garbage-collected connection: no I/O allowed
        try:
            dbapi_connection.rollback()
        except Exception as exc:
            log.warning(
                "%s: a connection could not be reset on its way back to the pool (%s); "
                "it is discarded",
                name,
                _one_line(exc),
            )
            if record is not None:
                record.invalidate(exc)


async def give_back(conn: AsyncConnection, name: str) -> None:
    """Close a connection (back to the pool), to the end even when the caller is
    cancelled meanwhile, then re-raise the cancellation.

    A close cancelled halfway leaves its reset (a rollback) undone: SQLAlchemy logs
    that at ERROR and discards the connection. A close that fails (the server ended
    the connection: its rollback cannot be sent) is not the caller's error: the work
    on it was done, or had failed, before; the connection is discarded (one WARNING).
    """
    closing = asyncio.ensure_future(conn.close())
    cancelled: asyncio.CancelledError | None = None
    while not closing.done():
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError as exc:
            cancelled = exc
    try:
        closing.result()
    except DBAPIError as exc:
        log.warning(
            "%s: a connection could not be closed cleanly (%s); it is discarded",
            name,
            _one_line(exc.orig or exc),
        )
    if cancelled is not None:
        raise cancelled
