"""Resources bound to an event loop: one per loop that uses them, closed at its shutdown.

asyncpg and redis-py connections belong to the loop that opened them. A checkpointer
that lives longer than one loop — ``asyncio.run`` per request in a script, a Celery
task, a sync web app, LangGraph's sync API from worker threads — must not reuse them
on the next loop, and must not leave them to the garbage collector either (unclosed
sockets). :class:`PerLoop` gives each running loop its own resource and closes it when
that loop shuts down: it registers an async generator with the loop, and the loop
closes its async generators as it shuts down (``asyncio.run`` and ``asyncio.Runner``
do, in ``loop.shutdown_asyncgens()``), while it can still run the closing awaits.
"""

from __future__ import annotations

import asyncio
import atexit
import socket
import threading
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, Generic, TypeVar

__all__ = [
    "LANGGRAPH_LOOP",
    "SYNC_LOOP",
    "BackgroundLoop",
    "CrossLoopLock",
    "PerLoop",
    "shut_down",
]

T = TypeVar("T")


_KEEPERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[AsyncGenerator[None, None]]] = (
    weakref.WeakKeyDictionary()
)
"""Every loop's keepers, held strongly while the loop lives: a resource whose owner was
dropped without ``aclose()`` is still closed at its loop's shutdown, never torn apart by
the garbage collector first (its connections would then fail to close)."""
_BACKGROUND: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
"""The loops of :class:`BackgroundLoop`: tenxstore's own, closed from outside at aclose()."""


class PerLoop(Generic[T]):
    """A resource for each event loop that uses it, whichever thread runs the loop.

    Args:
        first: The resource made at construction; the first loop (and every later one
            once the loop before it has shut down) uses it.
        make: Makes another for a loop that runs while ``first`` is in use on another
            (None: only ``first`` exists, as for a resource the caller owns).
        close: Closes a resource when its loop shuts down; ``first`` is then ready for
            the next loop (None: nothing to close).
        reset: Called with ``first`` when its loop closed without shutting down
            properly (its connections died with it); returns what takes its place
            (``first`` made usable again, or a new resource).
        foreign: Called with ``first`` when a caller-owned resource is asked for on a
            loop other than its own (the old loop, or None); may raise.

    A resource stays bound to its loop until its close has completed, so a loop in
    another thread never gets one that is still being closed (it gets a new one).
    """

    def __init__(
        self,
        first: T,
        *,
        make: Callable[[], T] | None = None,
        close: Callable[[T], Awaitable[None]] | None = None,
        reset: Callable[[T], T] | None = None,
        foreign: Callable[[T, asyncio.AbstractEventLoop | None], None] | None = None,
    ) -> None:
        self.first = first
        self._make, self._close, self._reset, self._foreign = make, close, reset, foreign
        self._bound: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )
        self._first_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._keepers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncGenerator[None, None]
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # loops in several threads bind at once

    def current(self) -> T:
        """The resource of the running loop, else ``first``."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self.first
        return self._bound.get(loop, self.first)

    def bound(self) -> T | None:
        """The resource already bound to the running loop (None: call :meth:`get`)."""
        try:
            return self._bound.get(asyncio.get_running_loop())
        except RuntimeError:
            return None

    def all(self) -> list[T]:
        """Every resource in use, ``first`` included."""
        with self._lock:
            bound = list(self._bound.values())
        return [self.first, *(r for r in bound if r is not self.first)]

    async def get(self) -> T:
        """The resource of the running loop, bound to it on first use."""
        loop = asyncio.get_running_loop()
        found = self._bound.get(loop)
        if found is not None:
            return found
        with self._lock:
            found = self._bound.get(loop)
            if found is not None:
                return found
            owner = self._first_loop() if self._first_loop is not None else None
            if owner is None or owner.is_closed() or owner not in self._bound:
                if owner is not None and owner.is_closed() and self._reset is not None:
                    self.first = self._reset(self.first)  # its loop ended without shutting down
                if self._foreign is not None and owner is not None:
                    self._foreign(self.first, owner)
                resource = self.first
                self._first_loop = weakref.ref(loop)
            elif self._make is not None:
                resource = self._make()
            else:
                if self._foreign is not None:
                    self._foreign(self.first, owner)
                return self.first
            self._bound[loop] = resource
        if self._close is not None:
            keeper = self._keep(loop, resource)
            await keeper.__anext__()  # the loop now closes it as it shuts down
            self._keepers[loop] = keeper
            _KEEPERS.setdefault(loop, set()).add(keeper)
        return resource

    async def _keep(
        self, loop: asyncio.AbstractEventLoop, resource: T
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            try:
                assert self._close is not None
                await self._close(resource)
            finally:
                with self._lock:  # only now may another loop have it
                    if self._bound.get(loop) is resource:
                        del self._bound[loop]
                    self._keepers.pop(loop, None)

    async def _release(self, loop: asyncio.AbstractEventLoop) -> T | None:
        """Close what ``loop`` holds (from that loop): its resource, or None."""
        resource = self._bound.get(loop)
        keeper = self._keepers.get(loop)
        if keeper is not None:
            _KEEPERS.get(loop, set()).discard(keeper)
            await keeper.aclose()
        elif resource is not None:
            with self._lock:
                self._bound.pop(loop, None)
            if self._close is not None:
                await self._close(resource)
        return resource

    async def aclose_current(self) -> None:
        """Close the running loop's resource now, those of tenxstore's own background
        loop (:class:`BackgroundLoop`), and ``first`` when no other live loop uses it
        (it may have been used without binding: :meth:`current`)."""
        loop = asyncio.get_running_loop()
        resource = await self._release(loop)
        for other in [o for o in list(self._bound) if o in _BACKGROUND and o is not loop]:
            if other.is_running():
                done = asyncio.run_coroutine_threadsafe(self._release(other), other)
                await asyncio.wrap_future(done)
        owner = self._first_loop() if self._first_loop is not None else None
        elsewhere = owner is not None and owner is not loop and owner in self._bound
        if resource is not self.first and not elsewhere and self._close is not None:
            await self._close(self.first)


def shut_down(transports: Iterable[Any]) -> int:
    """End connections whose event loop closed without closing them (best effort).

    Such a transport can no longer close itself (it would schedule on the dead loop),
    and the garbage collector may come late; shutting its socket down ends the
    connection on the server now. The socket itself is closed with the transport.

    Returns:
        How many were shut down.
    """
    done = 0
    for transport in transports:
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is None:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            continue  # already gone
        done += 1
    return done


class CrossLoopLock:
    """A lock for coroutines of any event loop, in any thread (``asyncio.Lock`` belongs
    to one loop). Waiters are woken in turn on their own loop, never blocking it; a
    waiter whose loop has closed is skipped.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._waiters: deque[asyncio.Future[None]] = deque()

    def locked(self) -> bool:
        """Whether the lock is held now (as ``asyncio.Lock.locked``)."""
        return self._held

    async def acquire(self) -> None:
        """Wait for the lock (cancellable)."""
        with self._mutex:
            if not self._held:
                self._held = True
                return
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            with self._mutex:
                handed = waiter not in self._waiters
                if not handed:
                    self._waiters.remove(waiter)
            if handed:  # the lock was handed over as the cancellation came: pass it on
                self.release()
            raise

    def release(self) -> None:
        """Hand the lock to the next live waiter, or free it."""
        with self._mutex:
            while self._waiters:
                waiter = self._waiters.popleft()
                try:
                    waiter.get_loop().call_soon_threadsafe(_wake, waiter)
                except RuntimeError:  # its loop has closed
                    continue
                return
            self._held = False

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
    # a waiter cancelled meanwhile sees it was handed the lock, and passes it on


class BackgroundLoop:
    """An event loop in a daemon thread, for synchronous callers (LangGraph's sync
    API): every call runs there, so the resources bound to that loop (pooled
    connections) serve every sync call of the process. Started at the first call;
    at interpreter exit the loop shuts down properly (its resources are closed).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self._registered = False

    def run(self, work: Awaitable[T], what: str) -> T:
        """Run ``work`` on the background loop and wait for its result.

        Raises:
            RuntimeError: Called from a thread whose event loop is running: waiting here
                would block that loop (``what`` names the async method to use instead).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            if asyncio.iscoroutine(work):
                work.close()
            raise RuntimeError(
                f"a synchronous call from inside a running event loop would block it: use "
                f"{what} (await it), or make the sync call from a worker thread "
                "(await asyncio.to_thread(...))"
            )
        future = asyncio.run_coroutine_threadsafe(_awaited(work), self._running())
        return future.result()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._start:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                _BACKGROUND.add(loop)
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                if not self._registered:
                    atexit.register(self.close)
                    self._registered = True
            return self._loop

    def close(self) -> None:
        """Stop the loop and shut it down (its async generators close the resources
        bound to it); a later call starts another."""
        with self._start:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


async def _awaited(work: Awaitable[T]) -> T:
    return await work


SYNC_LOOP = BackgroundLoop("tenxstore-sync")
"""The loop every synchronous call of tenxstore runs its async twin on (a
checkpointer's sync methods, :mod:`tenxstore.twins`; the LangGraph saver's
``get_tuple``/``put``..., a ``ReplaySafeToolNode`` in a sync graph): one pool of
connections serves them all."""
LANGGRAPH_LOOP = SYNC_LOOP
"""The LangGraph saver's name for :data:`SYNC_LOOP`."""
