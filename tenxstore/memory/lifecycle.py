"""Memories deleted in bounded batches: expired ones swept, a user's erased, idle ones
pruned.

Each works as the threads' :mod:`tenxstore.lifecycle` does: candidates picked by a
read that holds no lock, then each batch deleted in its own short write transaction
that locks the batch's memory rows in id order (as a writer of a memory takes its row
first), keeps those that still qualify under the lock, deletes their past versions
and then them, and commits. A memory is whole or gone; a call stopped halfway is
finished by calling it again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, func, select

from ..errors import ConfigError
from ..store import Store
from ..validate import is_int
from .rows import MemoryRows

__all__ = ["DEFAULT_SWEEP_BATCH", "MAX_SWEEP_BATCH", "MemoryLifecycle"]

DEFAULT_SWEEP_BATCH = 500
MAX_SWEEP_BATCH = 5000


def check_batch_size(batch_size: object) -> int:
    """A ``batch_size``: memories per transaction, 1 to :data:`MAX_SWEEP_BATCH`."""
    if not is_int(batch_size) or not 1 <= batch_size <= MAX_SWEEP_BATCH:
        raise ConfigError(
            f"batch_size must be an int from 1 to {MAX_SWEEP_BATCH}, not {batch_size!r}"
        )
    return batch_size


class MemoryLifecycle:
    """Bulk deletes of memories over a :class:`~tenxstore.store.Store`."""

    def __init__(self, store: Store, rows: MemoryRows) -> None:
        self._store = store
        self._rows = rows

    def expired(self, now: datetime) -> ColumnElement[bool]:
        """Expired at ``now``."""
        m = self._rows.m
        return m.c.expires_at <= now

    def of_user(self, user_id: Any) -> ColumnElement[bool]:
        """Owned by ``user_id``."""
        clause: ColumnElement[bool] = self._rows.m.c.user_id == user_id
        return clause

    def idle(self, cutoff: datetime) -> ColumnElement[bool]:
        """Not written since ``cutoff``."""
        clause: ColumnElement[bool] = self._rows.m.c.updated_at < cutoff
        return clause

    async def count(self, where: ColumnElement[bool]) -> tuple[int, int]:
        """(memories, past versions) matching ``where``, in one snapshot."""
        m, v = self._rows.m, self._rows.v
        chosen = select(m.c.id).where(where)
        async with self._store.snapshot() as conn:
            memories = (
                await conn.execute(select(func.count()).select_from(m).where(where))
            ).scalar_one()
            versions = (
                await conn.execute(
                    select(func.count()).select_from(v).where(v.c.memory_id.in_(chosen))
                )
            ).scalar_one()
        return int(memories), int(versions)

    async def delete(
        self,
        where: Callable[[], ColumnElement[bool]],
        batch_size: int,
        *,
        on_batch: Callable[[int, int], Any] | None = None,
    ) -> tuple[int, int, int]:
        """Delete every memory matching ``where()`` (asked again for each batch, so a
        time in it may move) in batches: (memories, past versions, batches)."""
        store, rows = self._store, self._rows
        m = rows.m
        memories = versions = batches = 0
        while True:
            clause = where()
            picked = await store.read(
                select(m.c.id).where(clause).order_by(m.c.id).limit(batch_size)
            )
            ids = [row.id for row in picked]
            if not ids:
                return memories, versions, batches
            lock = select(m.c.id).where(m.c.id.in_(ids), clause).order_by(m.c.id).with_for_update()
            async with store.write_rows(lock, {}, deletes_only=True) as (conn, _):
                still = [row.id for row in (await conn.execute(lock)).all()]
                done, past = await rows.remove(conn, still)
            memories, versions, batches = memories + done, versions + past, batches + 1
            if on_batch is not None:
                on_batch(memories, versions)

    async def forget_scopes(self, user_id: Any) -> int:
        """After an erase: delete ``user_id``'s rows of ``memory_revisions`` whose scope
        holds no memory any more (they name the user and its namespaces, in clear);
        how many. A scope written again gets a new row with a new random stamp, so a
        matrix cached by any process never matches it."""
        store, rows = self._store, self._rows
        r, m = rows.r, rows.m
        empty = ~exists().where(m.c.user_id == r.c.user_id, m.c.namespace == r.c.namespace)
        lock = select(r.c.namespace).where(r.c.user_id == user_id).with_for_update()
        async with store.write_rows(lock, {}, deletes_only=True) as (conn, _):
            done = await conn.execute(delete(r).where(r.c.user_id == user_id, empty))
        return max(done.rowcount, 0)

    async def asweep_expired(self, batch_size: int = DEFAULT_SWEEP_BATCH) -> int:
        """Delete the expired memories (and their history); how many."""
        batch_size = check_batch_size(batch_size)
        done, _, _ = await self.delete(lambda: self.expired(self._store.now()), batch_size)
        return done
