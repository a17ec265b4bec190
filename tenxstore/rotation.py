"""Key rotation: every stored payload sealed again under the key ring's current key.

:func:`arotate_keys` walks each payload table in primary-key order, ``batch_size``
rows at a time, reading only the rows that hold a value not sealed under the current
key (plaintext written before encryption was on, or another key's envelope). Each
batch is opened with the key ring (so the old key must still be in it), sealed again,
and written back in one short transaction of its own, every row by a compare-and-swap
on the value it read: a concurrent writer that changed the row meanwhile keeps its
write (the row is looked at again in the next pass), and no lock is held between
batches. The application keeps running; a stopped rotation is resumed by running it
again (what is current already is passed over in SQL).

When a pass ends with no row left behind, every payload is under the current key and
the old key can be removed from the ring (cache entries sealed under it are dropped
as misses when read, or expire).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, and_, bindparam, func, not_, or_, select, tuple_, update
from sqlalchemy.sql import ColumnElement

from .crypto import (
    ARGS,
    BLOB,
    CHECKPOINT,
    ERROR,
    MESSAGE,
    META,
    METADATA,
    NAME,
    RESULT,
    STATE,
    WRITE,
    KeyRing,
    bytes_head,
    text_head,
)
from .errors import ConfigError
from .validate import check_count

__all__ = ["DEFAULT_ROTATION_BATCH", "RotationResult", "arotate_keys", "astale_rows"]

DEFAULT_ROTATION_BATCH = 500
MAX_PASSES = 5

# table: (primary key columns, text payload columns, typed (type, bytes) column or None)
_TABLES: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...], tuple[str, str] | None]] = {
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
}
TABLES = tuple(_TABLES)
"""The tables a rotation walks, in order."""


@dataclass(frozen=True)
class RotationResult:
    """What a rotation did.

    Attributes:
        key_id: The key every value is now sealed under.
        rotated: Rows sealed again, by table.
        raced: Rows a concurrent writer changed between the read and the write (each
            was looked at again in a later pass).
        remaining: Rows still not under the current key after the last pass (0 when
            done; else run it again).
        passes: Passes made.
    """

    key_id: str
    rotated: dict[str, int]
    raced: int
    remaining: int
    passes: int

    @property
    def done(self) -> bool:
        """Whether every payload is under the current key (the old key can go)."""
        return self.remaining == 0


Progress = Callable[[str, int], None]
"""Called after each batch with the table and the rows sealed again in it so far."""


def _stale(keys: KeyRing, table: Any, texts: Any, typed: Any) -> ColumnElement[bool]:
    """Rows holding a value not sealed under the current key (SQL, on both databases)."""
    head = text_head(keys.current)
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
        marker = bytes_head(keys.current)
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
) -> RotationResult:
    """Seal every payload of a store again under its key ring's current key.

    Args:
        repository: A :class:`~tenxstore.CheckpointRepository` (or a checkpointer
            wrapping one, ``.inner``) with a key ring holding the current key and every
            key values are sealed under now.
        batch_size: Rows read and written back per transaction (1 to 10,000).
        progress: Called after each batch (see :data:`Progress`).

    Raises:
        ConfigError: No key ring, or a bad ``batch_size``.
        DecryptionError: A value is sealed under a key not in the ring, or damaged
            (the batches before it are done; nothing of its batch was written).
    """
    store, keys = _store_and_keys(repository)
    batch_size = check_count("batch_size", batch_size)
    if not 1 <= batch_size <= 10_000:
        raise ConfigError(f"batch_size must be from 1 to 10000, not {batch_size}")
    await store.ensure_ready()
    rotated = dict.fromkeys(TABLES, 0)
    raced = passes = 0
    remaining = -1
    while passes < MAX_PASSES and remaining != 0:
        passes += 1
        missed = 0
        for name in TABLES:
            done, lost = await _rotate_table(store, keys, name, batch_size, progress, rotated)
            rotated[name] += done
            missed += lost
        raced += missed
        remaining = missed
        if missed:  # rows changed under us: another pass reads them again (and counts)
            remaining = await _count_stale(store, keys)
    return RotationResult(keys.current, rotated, raced, remaining, passes)


def _store_of(repository: Any) -> Any:
    """The store of a repository, or of the repository a checkpointer wraps (``.inner``)."""
    while not hasattr(repository, "_store") and hasattr(repository, "inner"):
        repository = repository.inner
    return repository._store


def _store_and_keys(repository: Any) -> tuple[Any, KeyRing]:
    store = _store_of(repository)
    keys: KeyRing | None = store.keys
    if keys is None:
        raise ConfigError("rotating keys needs a key ring (keys= or TENXSTORE_KEYS)")
    return store, keys


async def astale_rows(repository: Any) -> int:
    """How many rows hold a value not sealed under the key ring's current key
    (plaintext, or another key's): what :func:`arotate_keys` has left to do.

    Raises:
        ConfigError: No key ring.
    """
    store, keys = _store_and_keys(repository)
    await store.ensure_ready()
    return await _count_stale(store, keys)


async def _count_stale(store: Any, keys: KeyRing) -> int:
    total = 0
    for name in TABLES:
        table = getattr(store.tables, name)
        _, texts, typed = _TABLES[name]
        rows = await store.read(
            select(func.count()).select_from(table).where(_stale(keys, table, texts, typed))
        )
        total += int(rows[0][0])
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
    pk, texts, typed = _TABLES[name]
    key_columns = [table.c[c] for c in pk]
    payload = [table.c[c] for c, _ in texts]
    if typed is not None:
        payload += [table.c.type, table.c[typed[0]]]
    extra = [] if "thread_id" in pk else [table.c.thread_id]
    stale = _stale(keys, table, texts, typed)
    after: tuple[Any, ...] | None = None
    done = lost = 0
    while True:
        stmt = select(*key_columns, *extra, *payload).where(stale)
        if after is not None:
            stmt = stmt.where(tuple_(*key_columns) > tuple_(*after))
        stmt = stmt.order_by(*key_columns).limit(batch_size)
        rows = await store.read(stmt)
        if not rows:
            return done, lost
        after = tuple(getattr(rows[-1], c) for c in pk)
        changes = [_resealed(keys, row, texts, typed) for row in rows]
        # a short transaction per batch: its threads' row locks (in id order, as every
        # writer takes them), then a compare-and-swap per row
        async with store.write_many({row.thread_id for row in rows}) as (conn, _):
            for row, change in zip(rows, changes, strict=True):
                if not change:
                    continue
                where = [table.c[c] == getattr(row, c) for c in pk]
                # compare-and-swap: only the value read is replaced
                where += [table.c[c] == getattr(row, c) for c in change]
                result = await conn.execute(update(table).where(*where).values(**change))
                if result.rowcount == 1:
                    done += 1
                else:
                    lost += 1
        if progress is not None:
            progress(name, rotated[name] + done)
        if len(rows) < batch_size:
            return done, lost


def _resealed(keys: KeyRing, row: Any, texts: Any, typed: tuple[str, str] | None) -> dict[str, Any]:
    """The columns of a row to write back, sealed under the current key."""
    change: dict[str, Any] = {}
    thread_id = row.thread_id
    for name, column in texts:
        value = getattr(row, name)
        if value is not None and not keys.is_current(value):
            change[name] = keys.seal(keys.open(value, thread_id, column), thread_id, column)
    if typed is not None:
        data_name, column = typed
        # the row was read because its value is not under the current key (see _stale)
        kind, data = keys.open_typed(row.type, bytes(getattr(row, data_name)), thread_id, column)
        change["type"], change[data_name] = keys.seal_typed(kind, data, thread_id, column)
    return change
