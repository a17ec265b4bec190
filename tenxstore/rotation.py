"""Key rotation: every stored payload sealed again under the key ring's sealing key.

:func:`arotate_keys` walks each payload table in primary-key order, ``batch_size``
rows at a time, reading only the rows that hold a value not sealed under the sealing
key (plaintext written before encryption was on, or another key's envelope). Each
batch is opened with the key ring (so the old key must still be in it), sealed again,
and written back in one short transaction of its own, every row by a compare-and-swap
on the value it read: a concurrent writer that changed the row meanwhile keeps its
write (the row is looked at again in the next pass), and no lock is held between
batches. The application keeps running; a stopped rotation is resumed by running it
again (what is current already is passed over in SQL).

A pass cannot see what is written behind it: during a rolling deploy an instance
still sealing under the old key (or one without a key ring) adds rows to tables the
pass has walked. So every pass ends with a count in SQL, in one snapshot, of the rows
not under the sealing key, and another pass runs while that count is not 0 (at most
:data:`MAX_PASSES`). The result is :attr:`~RotationResult.done` only when the last
count was 0: then, at that moment, no row was under another key, and the old key can
be removed from the ring once no instance seals under it (cache entries sealed under
it are dropped as misses when read, or expire).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, and_, bindparam, func, not_, or_, select, tuple_, update
from sqlalchemy.sql import ColumnElement

from .crypto import (
    ARGS,
    BLOB,
    CHECKPOINT,
    ERROR,
    MEMORY_CONTENT,
    MEMORY_METADATA,
    MESSAGE,
    META,
    METADATA,
    NAME,
    RESULT,
    STATE,
    WRITE,
    KeyRing,
    Life,
    life_of,
)
from .errors import ConfigError
from .validate import check_count

__all__ = [
    "BINDING",
    "DEFAULT_ROTATION_BATCH",
    "MAX_PASSES",
    "Counted",
    "Progress",
    "RotationResult",
    "arotate_keys",
    "astale_rows",
    "binding",
]

DEFAULT_ROTATION_BATCH = 500
MAX_PASSES = 5
"""Passes a rotation makes at most: rows still written under another key after that
many (an instance still sealing under the old key) are left, and the result says so."""

SEALED_COLUMNS: dict[
    str, tuple[tuple[str, ...], tuple[tuple[str, str], ...], tuple[str, str] | None]
] = {
    "threads": (("thread_id",), (("name", NAME), ("metadata", METADATA)), None),
    "states": (("state_id",), (("state_data", STATE), ("meta", META)), None),
    "messages": (("seq",), (("payload", MESSAGE),), None),
    "tool_executions": (
        ("thread_id", "tool_call_id"),
        (("args", ARGS), ("result", RESULT), ("error", ERROR)),
        None,
    ),
    "lg_checkpoints": (
        ("thread_id", "checkpoint_ns", "checkpoint_id"),
        (),
        ("checkpoint", CHECKPOINT),
    ),
    "lg_writes": (
        ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"),
        (),
        ("value", WRITE),
    ),
    "lg_blobs": (("thread_id", "checkpoint_ns", "channel", "version"), (), ("blob", BLOB)),
    "memories": (("id",), (("content", MEMORY_CONTENT), ("metadata", MEMORY_METADATA)), None),
    "memory_versions": (
        ("memory_id", "version"),
        (("content", MEMORY_CONTENT), ("metadata", MEMORY_METADATA)),
        None,
    ),
}
"""Each table holding sealed values: (its primary key columns, its text payload columns
with the name each is bound to, its typed ``(type, bytes)`` column or None)."""
TABLES = tuple(SEALED_COLUMNS)
"""The tables a rotation walks, in order."""
BINDING = {"memories": "uid", "memory_versions": "uid"}
"""The column a table's values are bound to, where it is not ``thread_id``: a memory's
``uid`` (see :mod:`tenxstore.memory.rows`)."""
_MEMORY_ID = {"memories": "id", "memory_versions": "memory_id"}
"""The memory a row belongs to: a batch locks those memories' rows, as their writers
take them first (the other tables' batches lock their threads' rows)."""


def binding(name: str) -> str:
    """The column the values of table ``name`` are bound to (their envelopes' "thread")."""
    return BINDING.get(name, "thread_id")


@dataclass(frozen=True)
class RotationResult:
    """What a rotation did.

    Attributes:
        key_id: The sealing key the values were sealed again under.
        rotated: Rows sealed again, by table.
        raced: Rows a concurrent writer changed between the read and the write (each
            was looked at again in a later pass).
        remaining: Rows not under the sealing key at the final count, made in SQL
            after the last pass (0: done; else rows were written under another key
            meanwhile, or could not be read: run it again once every instance seals
            under ``key_id``).
        passes: Passes made (0 when the first count found nothing to do).
    """

    key_id: str
    rotated: dict[str, int]
    raced: int
    remaining: int
    passes: int

    @property
    def done(self) -> bool:
        """Whether the final count found no row under any key but ``key_id`` (nor in
        clear): the other keys can be removed from the ring once no instance seals
        under them."""
        return self.remaining == 0


Progress = Callable[[str, int], object]
"""Called after each batch with the table and the rows sealed again in it so far; what
it returns is awaited when it is awaitable (an ``async def`` hook)."""
Counted = Callable[[int], object]
"""Called with the rows not under the sealing key each time they are counted: before
the first pass and after each pass (awaited when awaitable)."""


async def _call(hook: Callable[..., object] | None, *args: Any) -> None:
    if hook is not None:
        outcome = hook(*args)
        if inspect.isawaitable(outcome):
            await outcome


def _stale(keys: KeyRing, table: Any, texts: Any, typed: Any) -> ColumnElement[bool]:
    """Rows holding a value not sealed under the sealing key in the current format (SQL,
    on every database): plaintext, another key's envelope, or a ``tx1`` one (bound to
    its thread but not to the thread's life)."""
    head = keys.head  # the sealing key's, in the ring's format: tx1 is sealed again
    # substr and =, not LIKE: SQLite's LIKE ignores case (a value under key "KEY" would
    # pass for one under "key" and never be rotated); = is exact on every database
    # (binary collations on MySQL, PostgreSQL's deterministic ones, SQLite's BINARY).
    clauses: list[ColumnElement[bool]] = [
        and_(
            table.c[name].is_not(None),
            func.substr(table.c[name], 1, len(head)) != bindparam(None, head, type_=String()),
        )
        for name, _ in texts
    ]
    if typed is not None:
        data = table.c[typed[0]]
        marker = keys.bytes_head
        clauses.append(
            or_(
                not_(table.c.type.startswith("!", autoescape=True)),
                func.substr(data, 1, len(marker)) != bindparam("marker", marker, type_=data.type),
            )
        )
    return or_(*clauses)


async def arotate_keys(
    repository: Any,
    *,
    batch_size: int = DEFAULT_ROTATION_BATCH,
    progress: Progress | None = None,
    counted: Counted | None = None,
) -> RotationResult:
    """Seal every payload of a store again under its key ring's sealing key.

    Counts the rows to do, walks them, and counts again after each pass, in SQL: a
    row written behind a pass under another key (an instance not yet sealing under
    the new key) is found by that count and rotated by another pass. The result is
    done only when the last count is 0.

    Args:
        repository: A :class:`~tenxstore.CheckpointRepository` (or a checkpointer
            wrapping one, ``.inner``) with a key ring holding the sealing key and every
            key values are sealed under now.
        batch_size: Rows read and written back per transaction (1 to 10,000).
        progress: Called after each batch (see :data:`Progress`).
        counted: Called with each count of the rows left (see :data:`Counted`): a
            progress bar's total is the rows sealed again so far plus the last count.

    Raises:
        ConfigError: No key ring, or a bad ``batch_size``.
        DecryptionError: A value is sealed under a key not in the ring, or damaged
            (the batches before it are done; nothing of its batch was written).
    """
    store, keys = _store_and_keys(repository)
    batch_size = check_count("batch_size", batch_size)
    if not 1 <= batch_size <= 10_000:
        raise ConfigError(f"batch_size must be from 1 to 10000, not {batch_size}")
    # a rotation is an operator saying the store is sealed: keyless writers refused
    await store.ensure_writable()
    rotated = dict.fromkeys(TABLES, 0)
    raced = passes = 0
    remaining = await _count_stale(store, keys)
    await _call(counted, remaining)
    while remaining and passes < MAX_PASSES:
        passes += 1
        for name in TABLES:
            done, lost = await _rotate_table(store, keys, name, batch_size, progress, rotated)
            rotated[name] += done
            raced += lost
        # Always counted again, whatever the pass saw: rows written behind it (by an
        # instance still sealing under another key, or without keys) are only found so.
        remaining = await _count_stale(store, keys)
        await _call(counted, remaining)
    return RotationResult(keys.current, rotated, raced, remaining, passes)


def store_of(repository: Any) -> Any:
    """The :class:`~tenxstore.store.Store` of a checkpointer (a repository, the cache
    decorator or a preset: each has ``store``)."""
    return repository.store


def _store_and_keys(repository: Any) -> tuple[Any, KeyRing]:
    store = store_of(repository)
    keys: KeyRing | None = store.keys
    if keys is None:
        raise ConfigError("rotating keys needs a key ring (keys= or TENXSTORE_KEYS)")
    return store, keys


async def astale_rows(repository: Any) -> int:
    """How many rows hold a value not sealed under the key ring's sealing key
    (plaintext, or another key's), counted in one snapshot: what
    :func:`arotate_keys` has left to do (0: the other keys can go).

    Raises:
        ConfigError: No key ring.
    """
    store, keys = _store_and_keys(repository)
    await store.ensure_ready()
    return await _count_stale(store, keys)


async def _count_stale(store: Any, keys: KeyRing) -> int:
    """Rows not under the sealing key, every table counted in one snapshot: a count
    of 0 means no such row at one moment, not each table at another moment while
    writers add to the tables counted before."""
    total = 0
    async with store.snapshot() as conn:
        for name in TABLES:
            table = getattr(store.tables, name)
            _, texts, typed = SEALED_COLUMNS[name]
            count = select(func.count()).select_from(table)
            found = await conn.execute(count.where(_stale(keys, table, texts, typed)))
            total += int(found.scalar_one())
    return total


async def _rotate_table(
    store: Any,
    keys: KeyRing,
    name: str,
    batch_size: int,
    progress: Progress | None,
    rotated: dict[str, int],
) -> tuple[int, int]:
    """One table walked in primary-key order; (rows sealed again, rows raced)."""
    table = getattr(store.tables, name)
    pk, texts, typed = SEALED_COLUMNS[name]
    key_columns = [table.c[c] for c in pk]
    payload = [table.c[c] for c, _ in texts]
    if typed is not None:
        payload += [table.c.type, table.c[typed[0]]]
    bound = binding(name)
    extra = [] if bound in pk else [table.c[bound]]
    # the thread's life (what each value is opened for, and sealed again for): joined
    # in, or the thread's own row's; a memory's values are bound to its uid, no life
    memory = name in _MEMORY_ID
    t = store.tables.threads
    named_by = table if name == "threads" else t
    life = [] if memory else [named_by.c.incarnation, named_by.c.user_id]
    stale = _stale(keys, table, texts, typed)
    after: tuple[Any, ...] | None = None
    done = lost = 0
    while True:
        stmt = select(*key_columns, *extra, *life, *payload).where(stale)
        if name != "threads" and not memory:
            stmt = stmt.join(t, t.c.thread_id == table.c.thread_id)
        if after is not None:
            stmt = stmt.where(tuple_(*key_columns) > tuple_(*after))
        stmt = stmt.order_by(*key_columns).limit(batch_size)
        rows = await store.read(stmt)
        if not rows:
            return done, lost
        after = tuple(getattr(rows[-1], c) for c in pk)
        changes = [
            _resealed(
                keys, row, texts, typed, getattr(row, bound), None if memory else life_of(row)
            )
            for row in rows
        ]
        written, raced = await _write_batch(store, name, rows, changes)
        done += written
        lost += raced
        await _call(progress, name, rotated[name] + done)
        if len(rows) < batch_size:
            return done, lost


async def _write_batch(
    store: Any, name: str, rows: Any, changes: list[dict[str, Any]]
) -> tuple[int, int]:
    """A batch of ``name``'s rows written back sealed again (``changes``, one per row);
    (rows written, rows raced)."""
    table = getattr(store.tables, name)
    pk = SEALED_COLUMNS[name][0]
    memory = name in _MEMORY_ID
    done = lost = 0
    # a short transaction per batch: its threads' (or memories') row locks, in id
    # order as every writer takes them, then a compare-and-swap per row
    async with _locked(store, name, rows) as (conn, locked):
        for row, change in zip(rows, changes, strict=True):
            if not change:
                continue
            now = None if memory else locked.get(row.thread_id)
            if not memory and (now is None or life_of(now) != life_of(row)):
                # the thread was deleted, created again or given to another owner
                # since the batch was read: its values are another life's now
                lost += 1
                continue
            where = [table.c[c] == getattr(row, c) for c in pk]
            # compare-and-swap: only the value read is replaced
            where += [table.c[c] == getattr(row, c) for c in change]
            result = await conn.execute(update(table).where(*where).values(**change))
            if result.rowcount == 1:
                done += 1
            else:
                lost += 1
    return done, lost


@asynccontextmanager
async def _locked(store: Any, name: str, rows: Any) -> AsyncIterator[tuple[Any, dict[Any, Any]]]:
    """A write transaction holding the row locks of the threads (or memories) that a
    batch of ``name``'s rows belongs to; yields (conn, {thread_id: locked row}) (a
    memory batch: no threads)."""
    column = _MEMORY_ID.get(name)
    if column is None:
        async with store.write_many({row.thread_id for row in rows}) as (conn, locked):
            yield conn, locked
        return
    m = store.tables.memories
    ids = sorted({getattr(row, column) for row in rows})
    lock = select(m.c.id).where(m.c.id.in_(ids)).order_by(m.c.id).with_for_update()
    async with store.write_rows(lock, {}) as (conn, _):
        await conn.execute(lock)  # every row of the batch's memories locked, in order
        yield conn, {}


def _resealed(
    keys: KeyRing,
    row: Any,
    texts: Any,
    typed: tuple[str, str] | None,
    thread_id: Any,
    life: Life | None,
) -> dict[str, Any]:
    """The columns of a row to write back, sealed under the current key in the current
    format, bound to ``thread_id`` (a memory's: its uid) and to the life of the thread
    they are stored in (read with them; a memory's: none). A ``tx1`` value names no
    life: it is bound to the life it is found in from here on."""
    change: dict[str, Any] = {}
    for name, column in texts:
        value = getattr(row, name)
        if value is not None and not keys.is_current(value):
            plain = keys.open(value, thread_id, column, life)
            change[name] = keys.seal(plain, thread_id, column, life)
    if typed is not None:
        data_name, column = typed
        # the row was read because its value is not under the current key (see _stale)
        stored = bytes(getattr(row, data_name))
        kind, data = keys.open_typed(row.type, stored, thread_id, column, life)
        change["type"], change[data_name] = keys.seal_typed(kind, data, thread_id, column, life)
    return change
