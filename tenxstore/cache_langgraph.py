"""The Redis hot cache of LangGraph graphs: the head of each thread's namespaces.

What :meth:`~tenxstore.langgraph.TenxCheckpointSaver.aget_tuple` returns for a
namespace's newest checkpoint (the checkpoint, its metadata and parent, its pending
writes and values) is kept in Redis, one entry per thread, namespace and reader (the
owner's calls under isolation, or ``*``), beside one *epoch* per thread::

    {prefix}:lg:{<thread>}                      the thread's epoch: a random token
    {prefix}:lg:{<thread>}:<user or *>:<ns>     a head entry: the token it was put under,
                                                its checkpoint id and writes' count, body

The thread is the keys' Redis Cluster hash tag, so an entry and its epoch share a slot
and one script reads or writes both. An entry is served only while its token is the
epoch's; so every write of a thread ends, after its commit, by giving the epoch a new
token (:data:`~tenxstore.redis_scripts.LG_ADVANCE_SCRIPT`): whatever any process cached
of the thread before is a miss from then on, in every namespace. A put also stores its
new head under that token, when no other write moved the epoch since it read the epoch
(before its commit): one write's head never replaces another's newer one. A refill
(a miss read from the database) is stored only under the epoch its reader saw before
the database read (:data:`~tenxstore.redis_scripts.LG_PUT_SCRIPT`), and never over a
later head of that epoch (a later checkpoint id, or more writes of the same one): a
refill that read the database before a write committed can never land after it. A read
that finds no epoch (a thread not written through the cache yet, or its epoch expired
or evicted) makes one before its database read; a refill never makes one, so a refill
whose epoch went since its read (maybe with the epoch of a write after it) is dropped.

Deletes, prunes, ``delete_for_runs``, copies, imports (the cache's own, and
:func:`~tenxstore.langgraph.aimport_langgraph`'s) and the data lifecycle give the
epoch of each thread they touched a new token the same way (after their commit; a
batched delete also before it, with the state cache's fences). Each step after a
commit runs on when its caller is cancelled. An epoch change that could not reach
Redis (failed, timed out, or its caller cancelled) is remembered: until it is sent the
thread's reads are misses and its puts refused in this process, and a background task
resends it with back-off (bounded) for the other processes, besides the next call.
An epoch lives at least :data:`~tenxstore.redis_cache.FENCE_SECONDS` (and as long as
the entries), and a refill prepared longer than
:data:`~tenxstore.redis_cache.MAX_PUT_AGE` ago is not sent: so an epoch that expired
cannot let an old refill land.

An entry's body is msgpack of the stored forms, opened; with a key ring it is sealed
whole, bound to its key, token and checkpoint id (a plain entry is then a miss). One
larger than :data:`MAX_ENTRY_BYTES` is not cached (counted in :class:`HeadStats`).
Redis is best effort, behind the state cache's bounded, fail-open calls and circuit
breaker: a failure never fails nor changes a read or a write.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeVar

import msgspec

from .cache_keys import segment as _segment
from .config import RunIds
from .crypto import CACHE, CHECKPOINT, WRITE, KeyRing, life_of, open_typed
from .errors import TenxStoreError
from .redis_cache import FENCE_SECONDS, MAX_PUT_AGE, RedisCache
from .redis_scripts import (
    LG_ADVANCE_SCRIPT,
    LG_PUT_SCRIPT,
    LG_READ_SCRIPT,
    LG_WRITES_SCRIPT,
    run_keys,
)

__all__ = ["MAX_ENTRY_BYTES", "Head", "HeadStats", "LangGraphCache"]

log = logging.getLogger("tenxstore.cache")

MAX_ENTRY_BYTES = 1 << 20
"""The largest head entry cached (its body, in bytes): a larger head is read from the
database each time."""

_MAX_PENDING = 10_000
_RETRY_FIRST, _RETRY_MAX, _RETRIES = 0.05, 30.0, 12  # the epoch changes that wait, resent
_PLAIN, _SEALED = b"P", b"S"
_PACK = msgspec.msgpack.Encoder()
_UNPACK = msgspec.msgpack.Decoder()

_T = TypeVar("_T")

Head = tuple[Any, list[Any], dict[str, tuple[str, bytes]]]
"""A checkpoint as the LangGraph tables read it: its row, its writes, its values."""


@dataclass
class HeadStats:
    """What the head cache did in this process: reads served from Redis (``hits``) and
    from the database (``misses``), heads stored (by a refill or a put), refills or
    puts refused (another head or write got there first), heads too large to cache
    (``oversized``), and calls that failed open."""

    hits: int = 0
    misses: int = 0
    stored: int = 0
    refused: int = 0
    oversized: int = 0
    fail_open: int = 0


def _token() -> str:
    return os.urandom(8).hex()  # 16 characters, as the scripts read them


class LangGraphCache:
    """The head cache of :mod:`tenxstore.langgraph` savers on a
    :class:`~tenxstore.cache.CachedCheckpointer` (see the module).

    Args:
        redis: The cache's Redis side (its bounded, fail-open calls).
        prefix: The cache's key prefix (awaited: the default names the store).
        keys: The key ring entries are sealed with, or None.
        max_bytes: The largest entry body cached.
    """

    def __init__(
        self,
        redis: RedisCache,
        prefix: Callable[[], Awaitable[str]],
        keys: KeyRing | None,
        max_bytes: int = MAX_ENTRY_BYTES,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._known_prefix: str | None = None
        self.keys = keys
        self.max_bytes = max_bytes
        self.stats = HeadStats()
        # threads whose epoch change waits to be sent -> how often it was asked for (a
        # flush lets a thread go only when no other change was asked for meanwhile)
        self._pending: dict[Any, int] = {}
        self._steps: set[asyncio.Future[Any]] = set()  # after-commit steps under way
        self._retrying: asyncio.Task[None] | None = None
        self._closed = False
        fence_ms = int(FENCE_SECONDS * 1000)
        self._epoch_ms = 0 if redis.ttl_ms == 0 else max(redis.ttl_ms, fence_ms)

    # -- keys ------------------------------------------------------------------------

    async def _prefix_now(self) -> str:
        if self._known_prefix is None:
            self._known_prefix = await self._prefix()
        return self._known_prefix

    def _epoch_key(self, prefix: str, thread_id: Any) -> str:
        return f"{prefix}:lg:{{{_segment(thread_id)}}}"

    def _entry_key(self, prefix: str, ids: RunIds, ns: str) -> str:
        user = _segment(ids.user_id) if ids.isolated else "*"
        return f"{self._epoch_key(prefix, ids.thread_id)}:{user}:{_segment(ns)}"

    # -- the bounded call, with the epoch changes that wait -----------------------------

    def forget(self, thread_ids: Iterable[Any]) -> None:
        """Give these threads' epochs a new token as soon as Redis answers (a write whose
        outcome is not known: failed, or cancelled maybe after its commit); until then
        their reads are misses and their puts refused in this process. A background
        task sends them, with back-off (other processes would serve the old heads until
        then), besides the next call that reaches Redis."""
        added = False
        for thread_id in thread_ids:
            if thread_id not in self._pending and len(self._pending) >= _MAX_PENDING:
                log.error("too many LangGraph heads await invalidation; relying on cache_ttl")
                break
            self._pending[thread_id] = self._pending.get(thread_id, 0) + 1
            added = True
        if added:
            self._retry_soon()

    async def after_commit(self, step: Awaitable[_T], thread_ids: Iterable[Any]) -> _T:
        """Await ``step``, what a write sends once it committed, where cancelling the
        caller does not cancel it (it goes on, kept here; :meth:`aclose` waits for it):
        when the caller is cancelled, its threads' epoch changes are also remembered
        (:meth:`forget`), so that no process waits for the step to serve the new head."""
        threads = list(thread_ids)
        task = asyncio.ensure_future(step)
        self._steps.add(task)
        task.add_done_callback(_settled(self._steps))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                self.forget(threads)
            raise

    def _retry_soon(self) -> None:
        """Start the background task that sends the epoch changes that wait, unless it
        runs already on this loop (outside a loop, or once closed: the next call sends
        them)."""
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        running = self._retrying
        if running is not None and not running.done() and running.get_loop() is loop:
            return
        self._retrying = loop.create_task(self._retry(), name="tenxstore-langgraph-flush")

    async def _retry(self) -> None:
        """Send the epoch changes that wait, retried with back-off (bounded: then the
        next call that reaches Redis sends them, and the entries' TTL bounds the rest)."""
        delay = _RETRY_FIRST
        for _ in range(_RETRIES):
            await asyncio.sleep(delay)
            if not self._pending:
                return
            try:
                prefix = await self._prefix_now()
            except Exception as exc:  # a background task logs, and tries again
                log.warning("the LangGraph heads' key prefix is not known: %s", exc)
            else:

                async def flush(client: Any, prefix: str = prefix) -> bool:
                    await self._flush(client, prefix)
                    return True

                if await self._redis.call("langgraph.flush", flush) and not self._pending:
                    return
            delay = min(delay * 2, _RETRY_MAX)
        log.warning(
            "%d LangGraph head invalidation(s) not sent yet; the next call sends them",
            len(self._pending),
        )

    async def aclose(self) -> None:
        """Stop the background sending of epoch changes; wait (bounded) for the steps
        after commits under way on this loop."""
        self._closed = True
        loop = asyncio.get_running_loop()
        running, self._retrying = self._retrying, None
        if running is not None and not running.done() and running.get_loop() is loop:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        steps = [t for t in self._steps if not t.done() and t.get_loop() is loop]
        if steps:
            _, late = await asyncio.wait(steps, timeout=self._redis.timeout + 1.0)
            for task in late:
                task.cancel()

    async def _call(self, what: str, make: Callable[[Any], Awaitable[Any]], touched: Any) -> Any:
        """One bounded, fail-open call (``None`` when it failed), after the epoch changes
        that wait; ``touched``: threads whose epoch the call changes, remembered when it
        did not get through."""
        prefix = await self._prefix_now()
        done = [False]

        async def run(client: Any) -> Any:
            if self._pending:
                await self._flush(client, prefix)
            result = await make(client)
            done[0] = True
            return result

        try:
            result = await self._redis.call(f"langgraph.{what}", run)
        except BaseException:  # a cancellation: it may not have got through
            if not done[0]:
                self.forget(touched)
            raise
        if not done[0]:
            self.stats.fail_open += 1
            self.forget(touched)
        return result

    async def _flush(self, client: Any, prefix: str) -> None:
        """Send the epoch changes that wait; a thread leaves the set once confirmed."""
        waiting = list(self._pending.items())
        await self._set_epochs(client, [self._epoch_key(prefix, t) for t, _ in waiting])
        for thread_id, asked in waiting:
            if self._pending.get(thread_id) == asked:
                del self._pending[thread_id]

    async def _set_epochs(self, client: Any, keys: Sequence[str]) -> None:
        ttl = {"px": self._epoch_ms} if self._epoch_ms else {}
        if self._redis.cluster:  # one key per command, side by side: cluster-safe
            await asyncio.gather(*(client.set(key, _token(), **ttl) for key in keys))
            return
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.set(key, _token(), **ttl)
        await pipe.execute()

    # -- reads -----------------------------------------------------------------------

    async def head(self, ids: RunIds, ns: str, known: int | None) -> tuple[Head | None, str | None]:
        """The cached head of a namespace (None: a miss) and the epoch seen (the lease a
        refill is put under, made now when the thread had none; None: Redis is not
        usable now, nothing is to be put), in one round trip. ``known``: the life of
        the thread the run recorded; an entry of another is a miss."""
        prefix = await self._prefix_now()
        entry_key = self._entry_key(prefix, ids, ns)
        keys = [entry_key, self._epoch_key(prefix, ids.thread_id)]

        # an epoch a read makes expires even without a TTL: reads of threads that do
        # not exist must not leave keys for ever (an epoch gone is only misses)
        args = [_token(), self._epoch_ms or int(FENCE_SECONDS * 1000)]

        async def read(client: Any) -> Any:
            if ids.thread_id in self._pending:
                return None
            return await run_keys(client, LG_READ_SCRIPT, keys, args)

        found = await self._call("get", read, ())
        if found is None:
            self.stats.misses += 1
            return None, None
        raw, epoch = bytes(found[0]), bytes(found[1]).decode()
        head = self._opened(raw, ids, entry_key, known) if raw else None
        if head is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return head, epoch

    def _opened(self, raw: bytes, ids: RunIds, key: str, known: int | None) -> Head | None:
        """An entry as a head; None (a miss) when it does not decode or open, or is of
        another life than ``known``."""
        try:
            n = int(raw[16:20])
            cid = raw[20 : 20 + n].decode()
            body = raw[28 + n :]
            if body[:1] == _SEALED and self.keys is not None:
                kind, data = _UNPACK.decode(body[1:])
                column = f"{CACHE}:lg:{cid}:{key}"
                _, body = self.keys.open_typed(kind, data, ids.thread_id, column, None)
            elif body[:1] == _PLAIN and self.keys is None:
                body = body[1:]
            else:
                return None  # plain under a key ring, or sealed without one
            head = _unpacked(_UNPACK.decode(body), cid)
        except (ValueError, TypeError, msgspec.DecodeError, TenxStoreError) as exc:
            log.warning("a LangGraph head in the cache does not decode: %s", exc)
            return None
        if known is not None and head[0].incarnation != known:
            return None
        return head

    # -- puts ------------------------------------------------------------------------

    def _suffix(self, key: str, ids: RunIds, head: Head) -> bytes | None:
        """An entry after its token (None: too large, counted)."""
        row, writes, values = head
        body = _packed(row, writes, values)
        cid = row.checkpoint_id
        if len(body) > self.max_bytes:
            self.stats.oversized += 1
            return None
        if self.keys is not None:
            column = f"{CACHE}:lg:{cid}:{key}"
            kind, data = self.keys.seal_typed("lg_head", body, ids.thread_id, column, None)
            body = _SEALED + _PACK.encode((kind, data))
        else:
            body = _PLAIN + body
        cid_bytes = cid.encode()
        return b"%04d%s%08d%s" % (len(cid_bytes), cid_bytes, len(writes), body)

    async def refill(
        self, ids: RunIds, ns: str, lease: str | None, prepared: float, rows: Sequence[Head]
    ) -> None:
        """Cache the head a miss read from the database (``rows``: none or one), under
        the epoch seen before that read (``lease``), unless a write moved the epoch
        since, or the key holds a later head of it."""
        if not lease or not rows or time.monotonic() - prepared > MAX_PUT_AGE:
            return
        prefix = await self._prefix_now()
        entry_key = self._entry_key(prefix, ids, ns)
        try:
            suffix = self._suffix(entry_key, ids, _plain(rows[0], self.keys))
        except TenxStoreError as exc:  # a value that does not open: served as it was
            log.warning("a LangGraph head could not be cached: %s", exc)
            return
        if suffix is None:
            return
        row, writes, _ = rows[0]
        args = [lease, row.checkpoint_id, len(writes), suffix, self._redis.ttl_ms]
        keys = [entry_key, self._epoch_key(prefix, ids.thread_id)]

        async def put(client: Any) -> Any:
            if ids.thread_id in self._pending:
                return 0
            return await run_keys(client, LG_PUT_SCRIPT, keys, args)

        self._count(await self._call("put", put, ()))

    async def before_write(self, ids: RunIds) -> str | None:
        """The thread's epoch before a write (``""``: none), which its head is put under
        after the commit if no other write moved it; None: not known (Redis is not
        usable now), the write then only changes the epoch."""
        prefix = await self._prefix_now()
        key = self._epoch_key(prefix, ids.thread_id)

        async def get(client: Any) -> Any:
            if ids.thread_id in self._pending:
                return None
            found = await client.get(key)
            return b"" if found is None else found

        found = await self._call("epoch", get, ())
        return None if found is None else bytes(found).decode()

    async def advance(
        self, ids: RunIds, ns: str, before: str | None, head: Head | None = None
    ) -> None:
        """After a write of the thread committed: a new epoch, and ``head`` (the
        namespace's new head, its stored forms opened) cached under it when the epoch
        was still ``before`` (:meth:`after_commit`: cancelling the caller does not stop
        it)."""
        await self.after_commit(self._advance(ids, ns, before, head), [ids.thread_id])

    async def _advance(self, ids: RunIds, ns: str, before: str | None, head: Head | None) -> None:
        prefix = await self._prefix_now()
        entry_key = self._entry_key(prefix, ids, ns)
        token = _token()
        suffix = None
        if head is not None and before is not None:
            suffix = self._suffix(entry_key, ids, head)
        args = [before or "", token, suffix or b"", self._redis.ttl_ms, self._epoch_ms]
        args.append("" if head is None else head[0].checkpoint_id)
        keys = [entry_key, self._epoch_key(prefix, ids.thread_id)]

        async def send(client: Any) -> Any:
            if ids.thread_id in self._pending:
                await self._flush(client, prefix)
            return await run_keys(client, LG_ADVANCE_SCRIPT, keys, args)

        stored = await self._call("advance", send, (ids.thread_id,))
        if suffix:
            self._count(stored)

    async def wrote(self, ids: RunIds, ns: str, checkpoint_id: str) -> None:
        """After a task's writes of a checkpoint committed: the namespace's cached head
        goes if it is that checkpoint (or an older one), for the owner's calls and the
        unscoped ones; an unscoped call, whose owner is not known, changes the epoch
        (:meth:`after_commit`)."""
        if not ids.isolated:
            await self.bump([ids.thread_id])
            return
        await self.after_commit(self._wrote(ids, ns, checkpoint_id), [ids.thread_id])

    async def _wrote(self, ids: RunIds, ns: str, checkpoint_id: str) -> None:
        prefix = await self._prefix_now()
        unscoped = RunIds(thread_id=ids.thread_id, user_id=None, isolated=False)
        keys = [self._entry_key(prefix, ids, ns), self._entry_key(prefix, unscoped, ns)]
        keys.append(self._epoch_key(prefix, ids.thread_id))
        args = [checkpoint_id, _token(), self._epoch_ms, self._redis.ttl_ms]

        async def send(client: Any) -> Any:
            if ids.thread_id in self._pending:
                await self._flush(client, prefix)
            return await run_keys(client, LG_WRITES_SCRIPT, keys, args)

        await self._call("writes", send, (ids.thread_id,))

    async def bump(self, thread_ids: Iterable[Any]) -> bool:
        """New epochs for these threads (deleted, pruned, copied into, imported...):
        every head cached of them is a miss from here on. Whether Redis confirmed
        (those it did not are sent once it answers); :meth:`after_commit`: cancelling
        the caller does not stop it."""
        threads = sorted(set(thread_ids), key=repr)
        return await self.after_commit(self.renew(threads), threads)

    async def renew(self, thread_ids: Iterable[Any]) -> bool:
        """:meth:`bump`, in the caller's task (for a caller that shields it itself)."""
        threads = sorted(set(thread_ids), key=repr)
        if not threads:
            return True
        prefix = await self._prefix_now()
        keys = [self._epoch_key(prefix, t) for t in threads]

        async def send(client: Any) -> bool:
            await self._set_epochs(client, keys)
            return True

        return bool(await self._call("invalidate", send, threads))

    def _count(self, stored: Any) -> None:
        if stored == 1:
            self.stats.stored += 1
        elif stored is not None:
            self.stats.refused += 1


def _settled(steps: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    """A step's done callback: forgotten, its exception retrieved (its caller may have
    been cancelled: nobody else awaits it)."""

    def done(task: asyncio.Future[Any]) -> None:
        steps.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a LangGraph head cache step failed: %r", task.exception())

    return done


def _plain(head: Head, keys: KeyRing | None) -> Head:
    """A head read from the database with its checkpoint and writes opened (its values
    are opened already)."""
    row, writes, values = head
    life = life_of(row)
    kind, data = open_typed(keys, row.type, bytes(row.checkpoint), row.thread_id, CHECKPOINT, life)
    opened = SimpleNamespace(
        **{name: getattr(row, name) for name in _ROW}, type=kind, checkpoint=data
    )
    plain_writes = []
    for w in writes:
        wkind, wdata = open_typed(keys, w.type, bytes(w.value), row.thread_id, WRITE, life)
        plain_writes.append(
            SimpleNamespace(task_id=w.task_id, channel=w.channel, type=wkind, value=wdata)
        )
    return opened, plain_writes, values


_ROW = (
    "thread_id",
    "checkpoint_ns",
    "checkpoint_id",
    "parent_checkpoint_id",
    "metadata",
    "versions",
    "incarnation",
    "user_id",
)


def _packed(row: Any, writes: list[Any], values: dict[str, tuple[str, bytes]]) -> bytes:
    """A head's body (its stored forms, opened)."""
    return _PACK.encode(
        (
            *(getattr(row, name) for name in _ROW),
            row.type,
            bytes(row.checkpoint),
            [(w.task_id, w.channel, w.type, bytes(w.value)) for w in writes],
            [(ch, kind, bytes(data)) for ch, (kind, data) in values.items()],
        )
    )


def _unpacked(body: Any, cid: str) -> Head:
    """A head from its body; the row's ``head`` is the checkpoint itself."""
    *fields, kind, data, writes, values = body
    row = SimpleNamespace(**dict(zip(_ROW, fields, strict=True)), type=kind, checkpoint=data)
    if row.checkpoint_id != cid:
        raise ValueError("a head entry names another checkpoint than its body")
    row.head = cid
    return (
        row,
        [SimpleNamespace(task_id=t, channel=c, type=k, value=v) for t, c, k, v in writes],
        {ch: (kind, value) for ch, kind, value in values},
    )
