"""A LangGraph checkpoint put and a task's writes: the locked path, and the backend's
one-round-trip path when it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    delete,
    select,
    tuple_,
    update,
)

from ..backends.records import LangGraphFastPath
from ..config import RunIds, recorded_incarnation
from ..crypto import BLOB, CHECKPOINT, WRITE, Life, check_type, life_of
from ..deltas import BlobWrite, Stored, blob_write, rebuild
from ..errors import StaleStateError
from ..serde import encode
from .core import (
    BATCH,
    REMEMBERED,
    Values,
)
from .sql import value_chain
from .upkeep import Upkeep

__all__ = ["Puts"]


@dataclass
class _Put:
    """What one put stores: the call's ids and config, the checkpoint's key, parent,
    serialized form and metadata, the moment, its run and its values."""

    ids: RunIds
    config: dict[str, Any]
    ns: str
    checkpoint_id: str
    parent_id: str | None
    typed: tuple[str, bytes]
    metadata: str
    now: Any
    run_id: str | None = None
    values: Values | None = None


def _check_head(
    put: _Put, seen_head: str | None, found_empty: bool, newest: Any, has_parent: Any
) -> None:
    """Refuse a put whose parent is not the namespace's ``newest`` checkpoint, nor the
    head its run saw (``seen_head``), or that finds a namespace its run read empty
    written since; ``has_parent`` None: the parent is no longer stored."""
    ids, parent_id = put.ids, put.parent_id
    if parent_id is None and found_empty and newest is not None:
        raise StaleStateError(
            ids.thread_id,
            "(none)",
            newest,
            message=f"thread {ids.thread_id!r}: another run wrote checkpoint {newest} "
            "after this run found the thread empty; two runs from one head cannot "
            "both commit: run again with the same input, its messages carrying ids "
            "(tenxstore.langgraph.ainvoke_retrying does both)",
        )
    if parent_id is not None and newest != parent_id:
        gone = has_parent is None
        if gone and recorded_incarnation(put.config) is not None:  # the same life
            raise StaleStateError(
                ids.thread_id,
                parent_id,
                newest or "(none)",
                message=f"thread {ids.thread_id!r}: checkpoint {parent_id} is no longer "
                "stored (pruned by history_limit, aprune or delete_for_runs): run "
                "from a newer checkpoint (get_state_history), or raise history_limit",
            )
        if gone or newest != seen_head:
            raise StaleStateError(
                ids.thread_id, seen_head or parent_id, newest or "(none)", replaced=gone
            )


def _unique_writes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A task's writes, one per ``(task_id, idx)``: the first write, or the latest
    special one (negative ``idx``)."""
    unique: dict[tuple[Any, int], dict[str, Any]] = {}
    for row in rows:  # within the call too: the first write, or the latest special one
        if row["idx"] < 0:
            unique[(row["task_id"], row["idx"])] = row
        else:
            unique.setdefault((row["task_id"], row["idx"]), row)
    return list(unique.values())


class Puts(Upkeep):
    """Checkpoints and writes stored (a put prunes what the history limit lets go)."""

    async def put(
        self,
        config: dict[str, Any],
        ns: str,
        checkpoint_id: str,
        parent_id: str | None,
        typed: tuple[str, bytes],
        metadata: str,
        history_limit: int | None,
        seen_head: str | None = None,
        run_id: str | None = None,
        values: Values | None = None,
        found_empty: bool = False,
    ) -> int:
        """Store one checkpoint; return the thread's incarnation.

        The namespace's newest checkpoint must be the parent (the run continues from
        the head), or the head the run saw when it read (``seen_head``: a run resumed
        from an older checkpoint forks from there, on purpose). Otherwise another run
        committed after this one read: StaleStateError, so two runs that started from
        the same head cannot both commit. A parent that no longer exists, or an
        incarnation in ``config`` (recorded when the run read) that is not the
        thread's, means the thread was deleted or replaced since the run read it:
        StaleStateError with ``replaced``.

        ``values`` are the checkpoint's channel values, kept in ``lg_blobs`` by
        channel and version: a version already stored is not serialized again. A
        first checkpoint (no parent) of a run that read the namespace empty
        (``found_empty``) needs it empty still.
        """
        ids = self._store.ids(config)
        put = _Put(ids, config, ns, checkpoint_id, parent_id, typed, metadata, self._store.now())
        put.run_id, put.values = run_id, values
        presumed = self._presumed(config, ids)
        sealing = self._store.keys is not None
        check_type(typed[0], sealed=sealing)  # sealed later, for its life: refused now
        key, at_once = (ids.thread_id, ns), parent_id is not None and values is not None
        probe, look = self._probe(key, history_limit)
        await self._store.ensure_writable()  # refused without keys on a sealed store
        if key in self._due and history_limit is not None:
            self._due.discard(key)
            await self._prune_due(ids.thread_id, ns, history_limit)
        blobs = self._blob_writes(ids.thread_id, ns, values)
        one = self._one_statement()
        if one is not None and at_once and (presumed is not None or not sealing):
            done = await self._put_at_once(one, put, blobs, probe or 0, look, presumed)
            if done is not None:
                self._learn(ids.thread_id, ns, blobs)
                if history_limit is not None and done[1] is not None:
                    self._prune_later(key)
                return done[0]
        async with self._store.write(ids.thread_id) as (conn, locked):
            self._same_life(config, ids, locked, parent_id)
            row = await self._store.claim_thread(conn, ids, locked, put.now)
            blobs = await self._put_locked(
                conn, put, life_of(row), blobs, probe, history_limit, seen_head, found_empty
            )
        self._learn(ids.thread_id, ns, blobs)
        incarnation: int = row.incarnation
        return incarnation

    def _prune_later(self, key: tuple[Any, str]) -> None:
        """A one-statement put found namespace ``key`` grown past its probe: pruned by
        the next put, before it writes."""
        if len(self._due) >= REMEMBERED:
            self._due.clear()  # bounded: those are looked at again later
        self._due.add(key)  # by the next put, before it writes

    def _probe(self, key: tuple[Any, str], limit: int | None) -> tuple[int | None, bool]:
        """When a put of namespace ``key`` looks for what to prune: the offset from the
        newest checkpoint at which a checkpoint means the namespace has grown enough
        (None: no limit), and whether the one-statement put looks there this time."""
        # pruned once the namespace holds half the limit more than it kept last (a
        # prune costs a transaction of its own: ~8 ms on PostgreSQL for 150 checkpoints)
        probe = (
            None
            if limit is None
            else max(self._kept.get(key, limit), limit) + max(limit // 2, 1) - 2
        )
        # the look costs a walk of the index past ``probe`` entries: made on a
        # namespace's first put in this process, then every tenth of the limit
        puts = self._puts.get(key, 0)
        look = limit is not None and puts % max(limit // 10, 1) == 0
        if len(self._puts) >= REMEMBERED and key not in self._puts:
            self._puts.clear()  # bounded: a namespace forgotten is looked at again
        self._puts[key] = puts + 1
        return probe, look

    async def _put_locked(
        self,
        conn: Any,
        put: _Put,
        life: Life,
        blobs: list[BlobWrite],
        probe: int | None,
        limit: int | None,
        seen_head: str | None,
        found_empty: bool,
    ) -> list[BlobWrite]:
        """The put under the thread's lock (its row claimed; every value this put stores
        is sealed for its ``life``); returns the values written."""
        ids, ns, checkpoint_id, parent_id = put.ids, put.ns, put.checkpoint_id, put.parent_id
        stored_typed = self._seal(put.typed[0], put.typed[1], ids.thread_id, CHECKPOINT, life)
        key_and_now = {"t": ids.thread_id, "now": put.now}
        newest, has_parent, beyond = (
            await conn.execute(
                self._sql.look,
                {**key_and_now, "ns": ns, "parent": parent_id, "off": probe or 0},
            )
        ).one()
        if self._sql.touch is not None:
            await conn.execute(self._sql.touch, key_and_now)
        _check_head(put, seen_head, found_empty, newest, has_parent)
        # a new newest checkpoint takes the mark; a checkpoint put again (or an
        # older one) leaves none where it replaced or deleted values, so a
        # one-statement put whose snapshot predates this one writes nothing
        head = newest is None or checkpoint_id > newest
        await self._write_checkpoint(conn, put, stored_typed, head)
        if put.values is not None:
            blobs, replaced = await self._put_values(
                conn, ids.thread_id, ns, put.values, blobs, life
            )
            if replaced and not head:
                await self._unmark(conn, ids.thread_id, ns)
        if limit is not None and beyond is not None:  # grown by half the limit since
            # (with the mark moved to this put, the old head's is gone already: a put
            # racing this one fails)
            kept, pruned = await self._prune_namespace(
                conn, ids.thread_id, ns, limit, unmark=not head
            )
            # Nothing to prune (a DeltaChannel graph's namespace, kept whole): look
            # again when it has doubled, so the looks cost O(1) per put.
            self._remember((ids.thread_id, ns), kept if pruned else 2 * kept)
        return blobs

    async def _write_checkpoint(
        self, conn: Any, put: _Put, stored_typed: tuple[str, bytes], head: bool
    ) -> None:
        """The checkpoint's row (its serialized form as stored: ``stored_typed``), and
        the namespace's head mark moved to it (``head``) or taken from it."""
        ids, ns, checkpoint_id = put.ids, put.ns, put.checkpoint_id
        await conn.execute(
            self._sql.put_checkpoint,
            {
                "thread_id": ids.thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
                "parent_checkpoint_id": put.parent_id,
                "type": stored_typed[0],
                "checkpoint": stored_typed[1],
                "metadata": put.metadata,
                "created_at": put.now,
                "run_id": put.run_id,
                "versions": None if put.values is None else encode(put.values.versions, "versions"),
            },
        )
        h = self._store.tables.lg_heads
        if head:  # the mark a one-statement put takes over moves to this one
            await conn.execute(
                self._sql.put_head,
                {
                    "thread_id": ids.thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                },
            )
        else:  # a checkpoint put again loses its mark (its row was replaced)
            await conn.execute(
                delete(h).where(
                    h.c.thread_id == ids.thread_id,
                    h.c.checkpoint_ns == ns,
                    h.c.checkpoint_id == checkpoint_id,
                )
            )

    async def _put_at_once(
        self,
        one: LangGraphFastPath,
        put: _Put,
        blobs: list[BlobWrite],
        probe: int,
        look: bool,
        presumed: Life | None,
    ) -> tuple[int, Any] | None:
        """The put in one round trip (the backend's :class:`LangGraphFastPath`):
        ``(incarnation, the checkpoint at offset probe or None)``, or None when it
        wrote nothing. Sealed, its values are sealed for ``presumed`` (see
        :meth:`_presumed`), and the put matches only that life and owner."""
        ids, values = put.ids, put.values
        assert put.parent_id is not None and values is not None
        life = recorded_incarnation(put.config)
        unchanged = {ch: v for ch, v in values.versions.items() if ch not in values.new}
        based = [bw for bw in blobs if bw.base is not None]
        sealing = self._store.keys is not None
        bound = presumed or Life(0, None)  # (plain: not sealed, the life unused)
        typed = self._seal(put.typed[0], put.typed[1], ids.thread_id, CHECKPOINT, bound)
        sealed = [self._seal(bw.type, bw.blob, ids.thread_id, BLOB, bound) for bw in blobs]
        return await one.put(
            ids.isolated or sealing,
            {
                "t": ids.thread_id,
                "ns": put.ns,
                "u": ids.user_id,
                "life": life,
                "id": put.checkpoint_id,
                "parent": put.parent_id,
                "type": typed[0],
                "checkpoint": typed[1],
                "metadata": put.metadata,
                "now": put.now,
                "run": put.run_id,
                "versions": encode(values.versions, "versions"),
                "old": encode(unchanged, "versions"),
                "bc": [bw.channel for bw in based],
                "bv": [bw.base.version for bw in based if bw.base is not None],
                "bu": [bw.base.uid for bw in based if bw.base is not None],
                "nb": len(based),
                "ch": [bw.channel for bw in blobs],
                "ver": [bw.version for bw in blobs],
                "ty": [kind for kind, _ in sealed],
                "bl": [data for _, data in sealed],
                "ba": [None if bw.base is None else bw.base.version for bw in blobs],
                "sp": [bw.splice for bw in blobs],
                "sk": [bw.skip for bw in blobs],
                "ui": [bw.uid for bw in blobs],
                "off": probe,
                "look": look,
            },
        )

    async def _put_values(
        self,
        conn: Any,
        thread_id: Any,
        ns: str,
        values: Values,
        fresh: list[BlobWrite],
        life: Life,
    ) -> tuple[list[BlobWrite], bool]:
        """Store a checkpoint's new values (``fresh``: a delta whose base is no longer
        there is written whole), and those of its other versions that are not stored
        yet (a run that goes on from a checkpoint written before 0005); what was
        written of ``fresh``, and whether a stored value was replaced (a version
        stored already is: a checkpoint put again with other values reads them)."""
        b = self._store.tables.lg_blobs
        here = (b.c.thread_id == thread_id, b.c.checkpoint_ns == ns)
        older = [(ch, v) for ch, v in values.versions.items() if ch in values.stored - values.new]
        bases = [(bw.channel, bw.base.version) for bw in fresh if bw.base is not None]
        keys = [(bw.channel, bw.version) for bw in fresh]
        wanted = sorted(set(older + bases + keys))
        there: set[tuple[str, str, int]] = set()
        for start in range(0, len(wanted), BATCH):  # under the thread's lock
            found = await conn.execute(
                select(b.c.channel, b.c.version, b.c.uid).where(
                    *here, tuple_(b.c.channel, b.c.version).in_(wanted[start : start + BATCH])
                )
            )
            there.update((r.channel, r.version, r.uid) for r in found)
        stored = {(channel, version) for channel, version, _ in there}
        # a delta is written on its base only if that very row is still there
        fresh = [
            bw
            if bw.base is None or (bw.channel, bw.base.version, bw.base.uid) in there
            else bw.as_whole()
            for bw in fresh
        ]
        replaced = stored & set(keys)
        if replaced:  # a checkpoint put again: what rests on its values is made whole
            await self._unbase(conn, thread_id, ns, sorted(replaced), life)
        unstored = [
            blob_write(ch, v, values.dump(ch), None) for ch, v in older if (ch, v) not in stored
        ]
        rows = [
            {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "channel": bw.channel,
                "version": bw.version,
                **self._sealed(bw.type, bw.blob, thread_id, BLOB, "blob", life),
                "base": None if bw.base is None else bw.base.version,
                "splice": bw.splice,
                "skip": bw.skip,
                "uid": bw.uid,
            }
            for bw in fresh + unstored
        ]
        if rows:  # one statement for all
            await conn.execute(self._sql.put_blob, rows)
        return fresh, bool(replaced)

    async def _unbase(
        self, conn: Any, thread_id: Any, ns: str, replaced: list[tuple[str, str]], life: Life
    ) -> None:
        """Before values stored at these versions are replaced (a checkpoint put again
        with other values), the deltas resting on them are written whole."""
        b = self._store.tables.lg_blobs
        here = (b.c.thread_id == thread_id, b.c.checkpoint_ns == ns)
        for start in range(0, len(replaced), BATCH):
            batch = replaced[start : start + BATCH]
            resting = select(b.c.channel, b.c.version, b.c.base).where(
                *here, b.c.base.is_not(None), tuple_(b.c.channel, b.c.base).in_(batch)
            )
            stored: dict[str, dict[str, Stored]] = {}
            for r in await conn.execute(value_chain(self._store, thread_id, ns, resting)):
                stored.setdefault(r.channel, {})[r.version] = self._stored(
                    thread_id, r, r.blob, life
                )
            for channel, rows in stored.items():
                for version, row in rows.items():
                    if row.base is None or (channel, row.base) not in batch:
                        continue
                    kind, whole, _, _ = rebuild(rows, version)
                    kind, whole = self._seal(kind, whole, thread_id, BLOB, life)
                    await conn.execute(
                        update(b)
                        .where(*here, b.c.channel == channel, b.c.version == version)
                        .values(type=kind, blob=whole, base=None, splice=None, skip=None)
                    )

    @staticmethod
    def _same_life(config: dict[str, Any], ids: RunIds, locked: Any, parent: Any) -> None:
        """Refuse a write of a run that read another life of the thread."""
        expected = recorded_incarnation(config)
        if expected is not None and (locked is None or locked.incarnation != expected):
            actual = "(none)" if locked is None else locked.version
            raise StaleStateError(ids.thread_id, parent or 0, actual, replaced=True)

    async def put_writes(
        self,
        config: dict[str, Any],
        ns: str,
        checkpoint_id: str,
        rows: list[dict[str, Any]],
    ) -> None:
        """Store a task's writes: a write already stored is kept, except the special
        channels (negative ``idx``: errors, interrupts...), whose latest write wins."""
        ids = self._store.ids(config)
        now = self._store.now()
        plain = _unique_writes(rows)
        presumed = self._presumed(config, ids)
        sealing = self._store.keys is not None
        for row in plain:  # a type too long to be sealed: refused before any I/O
            check_type(row["type"], sealed=sealing)
        await self._store.ensure_writable()  # refused without keys on a sealed store
        one = self._one_statement()
        # one statement when the thread is there, the run's (sealed: in the life its
        # values are sealed for, which the run recorded)
        if one is not None and plain and (presumed is not None or not sealing):
            rows = self._sealed_writes(plain, ids.thread_id, presumed or Life(0, None))
            if await self._writes_at_once(one, ids, config, ns, checkpoint_id, rows):
                return
        w = self._store.tables.lg_writes
        here = (w.c.thread_id == ids.thread_id, w.c.checkpoint_ns == ns)
        keep_first = self._store.backend.insert_ignore(
            w, "thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"
        )
        async with self._store.write(ids.thread_id) as (conn, locked):
            self._same_life(config, ids, locked, checkpoint_id)
            life = life_of(await self._store.claim_thread(conn, ids, locked, now))
            rows = self._sealed_writes(plain, ids.thread_id, life)
            for task_id in {row["task_id"] for row in rows if row["idx"] < 0}:
                special = [r["idx"] for r in rows if r["idx"] < 0 and r["task_id"] == task_id]
                await conn.execute(
                    delete(w).where(
                        *here,
                        w.c.checkpoint_id == checkpoint_id,
                        w.c.task_id == task_id,
                        w.c.idx.in_(special),
                    )
                )
            if rows:
                await conn.execute(
                    keep_first,
                    [
                        {
                            "thread_id": ids.thread_id,
                            "checkpoint_ns": ns,
                            "checkpoint_id": checkpoint_id,
                            **row,
                        }
                        for row in rows
                    ],
                )

    def _sealed_writes(
        self, plain: list[dict[str, Any]], thread_id: Any, life: Life
    ) -> list[dict[str, Any]]:
        """A task's write rows with their values as stored (sealed for ``life``)."""
        return [
            {**row, **self._sealed(row["type"], row["value"], thread_id, WRITE, "value", life)}
            for row in plain
        ]

    async def _writes_at_once(
        self,
        one: LangGraphFastPath,
        ids: RunIds,
        config: dict[str, Any],
        ns: str,
        checkpoint_id: str,
        rows: list[dict[str, Any]],
    ) -> bool:
        """A task's writes in one statement (the backend's :class:`LangGraphFastPath`),
        in the life the run recorded; False when it stored nothing."""
        life = recorded_incarnation(config)
        return await one.put_writes(
            ids.isolated or self._store.keys is not None,
            {
                "t": ids.thread_id,
                "ns": ns,
                "u": ids.user_id,
                "life": life,
                "id": checkpoint_id,
                **{
                    key: [row[name] for row in rows]
                    for key, name in (
                        ("ta", "task_id"),
                        ("ix", "idx"),
                        ("ch", "channel"),
                        ("ty", "type"),
                        ("va", "value"),
                        ("pa", "task_path"),
                    )
                },
            },
        )
