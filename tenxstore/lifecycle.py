"""Erasing a user and retiring idle threads, in bounded batches.

Both work the same way: candidates are picked by a read that holds no lock, then each
batch is deleted in its own short write transaction, which locks the batch's thread
rows in id order, checks each again under the lock (still the user's; still idle),
deletes their rows child tables first and commits. A thread is therefore the unit of
atomicity: after any crash it is either whole and readable or gone, never half
deleted, and running the same call again finishes the job (it picks what is left).

No write can slip in beside a batch: a state write updates the thread row (which the
batch holds locked), and every other row (messages, tool calls, LangGraph
checkpoints, writes and values) references it by a foreign key, whose check waits
for that lock; after the commit the thread is gone, and such a write fails or makes
a new life of the thread (a new incarnation, see :mod:`tenxstore.config`).

A cache decorator passes ``before_commit``: it is awaited inside each batch's
transaction, after its deletes and before its commit, with the threads the batch
deletes, so the cache is fenced before any reader could see the rows gone (and a
crash after the commit cannot leave an entry that serves deleted data).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Table, and_, delete, exists, func, or_, select

from .boundary import callers_own
from .errors import ConfigError
from .memory.lifecycle import MemoryLifecycle
from .memory.rows import MemoryRows
from .statements import thread_info
from .store import Store
from .types import Commit, ThreadInfo
from .validate import check_id, is_int

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_SAMPLE",
    "MAX_BATCH_SIZE",
    "BatchHook",
    "DeleteResult",
    "Lifecycle",
    "ProgressHook",
    "parse_duration",
]

DEFAULT_BATCH_SIZE = 200
MAX_BATCH_SIZE = 5000  # threads per transaction; also bounds SQLite's bound parameters
DEFAULT_SAMPLE = 10


@dataclass(frozen=True)
class DeleteResult:
    """What :meth:`~tenxstore.CheckpointRepository.adelete_user` or
    :meth:`~tenxstore.CheckpointRepository.aprune_idle` deleted (with ``dry_run``:
    what it would delete), by kind of row.

    Attributes:
        threads: Threads deleted (each with everything below).
        states: Retained state versions.
        messages: Messages.
        tool_executions: Tool-ledger records.
        checkpoints: LangGraph checkpoints (``lg_checkpoints``).
        checkpoint_writes: LangGraph pending writes (``lg_writes``).
        checkpoint_blobs: LangGraph channel values (``lg_blobs``).
        memories: Long-term memories (an erase: the user's; a prune: only with
            ``include_memories``).
        memory_versions: Their past versions.
        cache_keys: Cache keys fenced (a cached checkpointer: two per thread, the
            owner's and the unscoped one; 0 without a cache or in a dry run).
        batches: Write transactions committed (0 for a dry run).
        skipped: Candidates found again not to qualify under the lock (a prune: the
            thread was used meanwhile) and kept.
        dry_run: Nothing was deleted; the counts are what would go now.
        sample: With ``dry_run``: some of the threads that would go, least recently
            updated first.
    """

    threads: int = 0
    states: int = 0
    messages: int = 0
    tool_executions: int = 0
    checkpoints: int = 0
    checkpoint_writes: int = 0
    checkpoint_blobs: int = 0
    memories: int = 0
    memory_versions: int = 0
    cache_keys: int = 0
    batches: int = 0
    skipped: int = 0
    dry_run: bool = False
    sample: tuple[ThreadInfo, ...] = ()

    @property
    def rows(self) -> int:
        """Rows of every kind together."""
        return sum(getattr(self, name) for name in (*_ROW_FIELDS.values(), *_MEMORY_FIELDS))


# table name -> DeleteResult field (lg_heads, one mark per namespace, is not counted)
_ROW_FIELDS = {
    "states": "states",
    "messages": "messages",
    "tool_executions": "tool_executions",
    "lg_writes": "checkpoint_writes",
    "lg_blobs": "checkpoint_blobs",
    "lg_checkpoints": "checkpoints",
    "threads": "threads",
}
_MEMORY_FIELDS = ("memories", "memory_versions")
assert {*_ROW_FIELDS.values(), *_MEMORY_FIELDS} <= {f.name for f in fields(DeleteResult)}

BatchHook = Callable[[Sequence[Commit]], Awaitable[None]]
"""Awaited inside a batch's transaction, before its commit, with the threads it deletes
(owner, incarnation and last version): how a cache fences them."""
ProgressHook = Callable[[DeleteResult], Any]
"""Called after each batch commits with the totals so far (sync or async). Raising
stops the call there: the batches committed so far stay done, the rest is untouched."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+)([smhdw])")


def parse_duration(text: str) -> timedelta:
    """A duration such as ``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or ``1d12h``.

    Raises:
        ConfigError: Anything else (a ``ValueError``), or a zero duration.
    """
    if not isinstance(text, str):
        raise ConfigError(f"a duration is a str such as '90d', not {type(text).__name__}")
    compact = text.strip().lower()
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ConfigError(
            f"not a duration: {text!r} (write a number and a unit: s, m, h, d or w, "
            "e.g. 90d, 12h, 30m, 1d12h)"
        )
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds == 0:
        raise ConfigError(f"a duration must be longer than zero, not {text!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ConfigError(f"the duration {text!r} is too long") from None


def _check_batch_size(batch_size: object) -> int:
    if not is_int(batch_size) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ConfigError(
            f"batch_size must be an int from 1 to {MAX_BATCH_SIZE}, not {batch_size!r}"
        )
    return batch_size


def _check_sample(sample: object) -> int:
    if not is_int(sample) or not 0 <= sample <= 1000:
        raise ConfigError(f"sample must be an int from 0 to 1000, not {sample!r}")
    return sample


async def _progress(hook: ProgressHook | None, totals: DeleteResult) -> None:
    if hook is None:
        return
    try:
        outcome = hook(totals)
        if isinstance(outcome, Awaitable):
            await outcome
    except Exception as exc:
        callers_own(exc)  # the caller's hook: through the boundary as it is
        raise


class Lifecycle:
    """Bulk deletes over a repository's :class:`~tenxstore.store.Store`."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.memories = MemoryLifecycle(store, MemoryRows(store, history_limit=1))
        """The memories' bulk deletes (an erase covers them; a prune, when asked)."""

    # -- predicates ------------------------------------------------------------------

    def _of_user(self, user_id: Any) -> ColumnElement[bool]:
        clause: ColumnElement[bool] = self._store.tables.threads.c.user_id == user_id
        return clause

    def _idle(self, cutoff: datetime) -> ColumnElement[bool]:
        """A thread not used since ``cutoff``: its record and state not updated, no
        LangGraph checkpoint written and no tool call claimed or finished (those do
        not touch the thread row's ``updated_at``)."""
        tables = self._store.tables
        t, c, x = tables.threads, tables.lg_checkpoints, tables.tool_executions
        return and_(
            t.c.updated_at < cutoff,
            ~exists().where(c.c.thread_id == t.c.thread_id, c.c.created_at >= cutoff),
            ~exists().where(
                x.c.thread_id == t.c.thread_id,
                or_(x.c.started_at >= cutoff, x.c.finished_at >= cutoff),
            ),
        )

    # -- the public calls ------------------------------------------------------------

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
        """Delete every thread ``user_id`` owns (see the repository's method)."""
        store = self._store
        user_id = check_id("user_id", user_id, store.settings.user_id_type)
        batch_size = _check_batch_size(batch_size)
        sample = _check_sample(sample)
        where = self._of_user(user_id)
        mine = self.memories.of_user(user_id)
        if dry_run:
            return await self._with_memories(await self._count(where, sample), mine)
        t = store.tables.threads

        async def pick(_after: Any) -> list[Any]:
            # No order and no key set: deleted rows leave the index, so the next pick
            # starts where the last ended, and only a pass that finds nothing ends.
            rows = await store.read(select(t.c.thread_id).where(where).limit(batch_size))
            return [row.thread_id for row in rows]

        totals = await self._delete(pick, where, None, on_batch, before_commit)
        totals = await self._delete_memories(totals, lambda: mine, batch_size, on_batch)
        await self.memories.forget_scopes(user_id)  # nothing names the user any more
        return totals

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
        """Delete every thread not used for ``older_than`` (see the repository's method);
        with ``include_memories``, the memories not written for that long too."""
        if not isinstance(include_memories, bool):
            raise ConfigError(f"include_memories must be a bool, not {include_memories!r}")
        if not isinstance(older_than, timedelta) or older_than <= timedelta(0):
            raise ConfigError(f"older_than must be a positive timedelta, not {older_than!r}")
        batch_size = _check_batch_size(batch_size)
        sample = _check_sample(sample)
        store = self._store
        try:
            cutoff = store.now() - older_than
        except OverflowError:
            raise ConfigError(f"older_than reaches before year 1: {older_than!r}") from None
        idle = self._idle(cutoff)
        quiet = self.memories.idle(cutoff)
        if dry_run:
            counted = await self._count(idle, sample)
            return await self._with_memories(counted, quiet) if include_memories else counted
        t = store.tables.threads

        async def pick(after: Any) -> list[Any]:
            # Key set on the primary key: one walk over the threads in all, however many.
            stmt = select(t.c.thread_id).where(idle)
            if after is not None:
                stmt = stmt.where(t.c.thread_id > after)
            rows = await store.read(stmt.order_by(t.c.thread_id).limit(batch_size))
            return [row.thread_id for row in rows]

        totals = await self._delete(pick, None, idle, on_batch, before_commit, keyset=True)
        if not include_memories:
            return totals
        return await self._delete_memories(totals, lambda: quiet, batch_size, on_batch)

    async def _with_memories(
        self, counted: DeleteResult, where: ColumnElement[bool]
    ) -> DeleteResult:
        """A dry run's counts with the memories ``where`` picks."""
        memories, versions = await self.memories.count(where)
        return replace(counted, memories=memories, memory_versions=versions)

    async def _delete_memories(
        self,
        totals: DeleteResult,
        where: Callable[[], ColumnElement[bool]],
        batch_size: int,
        on_batch: ProgressHook | None,
    ) -> DeleteResult:
        """After the threads: the memories ``where()`` picks, in batches (their own
        transactions: a memory is whole or gone), counted into ``totals``."""
        memories, versions, batches = await self.memories.delete(where, batch_size)
        if not batches:
            return totals
        totals = replace(
            totals,
            memories=totals.memories + memories,
            memory_versions=totals.memory_versions + versions,
            batches=totals.batches + batches,
        )
        await _progress(on_batch, totals)
        return totals

    # -- the work --------------------------------------------------------------------

    async def _count(self, where: ColumnElement[bool], sample: int) -> DeleteResult:
        """What a delete of the threads matching ``where`` would take, in one snapshot."""
        store = self._store
        t = store.tables.threads
        chosen = select(t.c.thread_id).where(where)
        counts: dict[str, int] = {}
        async with store.snapshot() as conn:
            for table in store.tables.of_thread:
                if table.name not in _ROW_FIELDS:  # bookkeeping (lg_heads): not counted
                    continue
                if table is t:
                    stmt = select(func.count()).select_from(t).where(where)
                else:
                    stmt = (
                        select(func.count()).select_from(table).where(table.c.thread_id.in_(chosen))
                    )
                counts[_ROW_FIELDS[table.name]] = (await conn.execute(stmt)).scalar_one()
            shown: tuple[ThreadInfo, ...] = ()
            if sample:
                rows = await conn.execute(
                    select(*t.c).where(where).order_by(t.c.updated_at, t.c.thread_id).limit(sample)
                )
                shown = tuple(thread_info(row, self._store.keys) for row in rows)
        return DeleteResult(**counts, dry_run=True, sample=shown)

    async def _delete(
        self,
        pick: Callable[[Any], Awaitable[list[Any]]],
        owner: ColumnElement[bool] | None,
        recheck: ColumnElement[bool] | None,
        on_batch: ProgressHook | None,
        before_commit: BatchHook | None,
        *,
        keyset: bool = False,
    ) -> DeleteResult:
        totals = DeleteResult()
        after: Any = None
        while True:
            candidates = await pick(after)
            if not candidates:
                return totals
            if keyset:
                after = candidates[-1]
            counts, skipped = await self._delete_batch(candidates, owner, recheck, before_commit)
            totals = replace(
                totals,
                **{k: getattr(totals, k) + v for k, v in counts.items()},
                batches=totals.batches + 1,
                skipped=totals.skipped + skipped,
            )
            await _progress(on_batch, totals)

    async def _delete_batch(
        self,
        candidates: list[Any],
        owner: ColumnElement[bool] | None,
        recheck: ColumnElement[bool] | None,
        before_commit: BatchHook | None,
    ) -> tuple[dict[str, int], int]:
        """One transaction: lock the candidates in id order, keep those that still
        qualify, delete them; (rows deleted by field, candidates kept)."""
        store = self._store
        t = store.tables.threads
        ordered = sorted(set(candidates))
        counts = dict.fromkeys(_ROW_FIELDS.values(), 0)
        # store.write takes the first row's lock (and sets lock_timeout); the rest are
        # locked by one statement, in id order, as every multi-thread writer takes them.
        async with store.write(ordered[0], deletes_only=True) as (conn, _):
            lock = (
                select(t.c.thread_id, t.c.user_id, t.c.incarnation, t.c.version)
                .where(t.c.thread_id.in_(ordered))
                .order_by(t.c.thread_id)
                .with_for_update()
            )
            if owner is not None:
                lock = lock.where(owner)
            locked = (await conn.execute(lock)).all()
            if recheck is not None and locked:
                # Asked again in a statement of its own, now that the rows are locked: it
                # sees every write that committed before the locks were granted (one
                # that held only a foreign key's share lock does not re-run the first).
                still = select(t.c.thread_id).where(
                    t.c.thread_id.in_([row.thread_id for row in locked]), recheck
                )
                keep = {row.thread_id for row in (await conn.execute(still)).all()}
                locked = [row for row in locked if row.thread_id in keep]
            ids = [row.thread_id for row in locked]
            if ids:
                for table in store.tables.of_thread:
                    done = await conn.execute(_delete_rows(table, ids))
                    if table.name in _ROW_FIELDS:
                        counts[_ROW_FIELDS[table.name]] += max(done.rowcount, 0)
                if before_commit is not None:
                    gone = [
                        Commit(row.thread_id, row.user_id, row.incarnation, row.version)
                        for row in locked
                    ]
                    try:
                        await before_commit(gone)
                    except Exception as exc:
                        callers_own(exc)  # the caller's hook: as it is
                        raise
        return counts, len(ordered) - len(ids)


def _delete_rows(table: Table, ids: list[Any]) -> Any:
    return delete(table).where(table.c.thread_id.in_(ids))
