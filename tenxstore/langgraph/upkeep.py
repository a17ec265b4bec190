"""Pruning, deleting runs, and copying a thread: the LangGraph tables' upkeep."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    and_,
    delete,
    insert,
    select,
    tuple_,
)
from sqlalchemy.exc import DBAPIError

from ..config import RunIds
from ..crypto import BLOB, CHECKPOINT, WRITE, Life, life_of, open_typed
from ..errors import TenxStoreError
from ..serde import decode
from .core import (
    BATCH,
    INTERRUPT,
    NS_END,
    NS_SEP,
    TablesCore,
    needed,
    root_of,
    run_id_of,
)

__all__ = ["Upkeep"]


class Upkeep(TablesCore):
    """Bounded history (pruning a namespace, a subgraph's runs), runs deleted, threads copied."""

    async def _prune_due(self, thread_id: Any, ns: str, limit: int) -> None:
        """Prune a namespace that a one-statement put found grown (in a transaction of
        its own, before the next put writes: a put that committed never fails, nor is
        held up, by housekeeping). A prune that cannot run now (a lock held too long, a
        lost connection, any database error) is left for a later put, which looks
        again; a cancellation propagates (nothing of this put was written)."""
        try:
            async with self._store.write(thread_id) as (conn, _):
                kept, pruned = await self._prune_namespace(conn, thread_id, ns, limit)
        except (TenxStoreError, DBAPIError):
            return
        self._remember((thread_id, ns), kept if pruned else 2 * kept)

    async def _prune_namespace(
        self,
        conn: Any,
        thread_id: Any,
        ns: str,
        newest: int,
        *,
        branches: bool = True,
        unmark: bool = True,
    ) -> tuple[int, int]:
        """Delete a namespace's checkpoints (and writes) but the newest ``newest`` and
        what they need (:func:`needed`; with ``branches``, the heads of branches left
        at an interrupt, and the subgraph runs of the root checkpoints it pruned); how
        many are kept, and how many pruned."""
        c, w = self._store.tables.lg_checkpoints, self._store.tables.lg_writes
        here = and_(c.c.thread_id == thread_id, c.c.checkpoint_ns == ns)
        rows = (
            await conn.execute(
                select(c.c.checkpoint_id, c.c.parent_checkpoint_id, c.c.metadata).where(here)
            )
        ).all()
        waiting: list[str] = []
        if branches:
            has_child = {r.parent_checkpoint_id for r in rows}
            heads = [r.checkpoint_id for r in rows if r.checkpoint_id not in has_child]
            for start in range(0, len(heads), BATCH):
                found = await conn.execute(
                    select(w.c.checkpoint_id)
                    .where(
                        w.c.thread_id == thread_id,
                        w.c.checkpoint_ns == ns,
                        w.c.checkpoint_id.in_(heads[start : start + BATCH]),
                        w.c.channel == INTERRUPT,
                    )
                    .distinct()
                )
                waiting.extend(found.scalars())
        keep = needed(rows, newest, waiting)
        doomed = [r.checkpoint_id for r in rows if r.checkpoint_id not in keep]
        await self._delete(conn, thread_id, ns, doomed, unmark=unmark)
        if ns == "" and doomed and branches:  # aprune keeps each namespace's newest
            await self._prune_subgraph_runs(conn, thread_id, keep)
        return len(keep), len(doomed)

    async def _delete(
        self, conn: Any, thread_id: Any, ns: str, doomed: list[str], *, unmark: bool = True
    ) -> None:
        """Delete these checkpoints of a namespace, with their writes and the values no
        checkpoint left needs. With ``unmark``, the namespace's head loses its mark, so
        a one-statement put whose snapshot predates this deletion writes nothing (its
        delta's base may be gone): the next put takes the locked path and marks again."""
        c, w = self._store.tables.lg_checkpoints, self._store.tables.lg_writes
        for start in range(0, len(doomed), BATCH):
            batch = doomed[start : start + BATCH]
            for table in (w, c):
                await conn.execute(
                    delete(table).where(
                        table.c.thread_id == thread_id,
                        table.c.checkpoint_ns == ns,
                        table.c.checkpoint_id.in_(batch),
                    )
                )
        if doomed:
            if unmark:
                await self._unmark(conn, thread_id, ns)
            await self._collect(conn, thread_id, ns)

    async def _collect(self, conn: Any, thread_id: Any, ns: str) -> None:
        """Delete the values of a namespace that no checkpoint of it needs any more: not
        named by one, nor the base of a delta that is kept."""
        c, b = self._store.tables.lg_checkpoints, self._store.tables.lg_blobs
        needed: set[tuple[str, str]] = set()
        versions = select(c.c.versions).where(
            c.c.thread_id == thread_id, c.c.checkpoint_ns == ns, c.c.versions.is_not(None)
        )
        for text in (await conn.execute(versions)).scalars():
            needed.update(decode(text).items())
        here = (b.c.thread_id == thread_id, b.c.checkpoint_ns == ns)
        stored = await conn.execute(select(b.c.channel, b.c.version, b.c.base).where(*here))
        base_of = {(r.channel, r.version): r.base for r in stored}
        walk = [key for key in needed if key in base_of]
        while walk:
            channel, version = walk.pop()
            base = base_of[(channel, version)]
            if base is not None and (channel, base) not in needed:
                needed.add((channel, base))
                if (channel, base) in base_of:
                    walk.append((channel, base))
        doomed = sorted(set(base_of) - needed)
        for start in range(0, len(doomed), BATCH):
            batch = doomed[start : start + BATCH]
            await conn.execute(delete(b).where(*here, tuple_(b.c.channel, b.c.version).in_(batch)))

    async def _prune_subgraph_runs(self, conn: Any, thread_id: Any, roots: set[str]) -> None:
        """Delete the namespaces of subgraph runs (``node:task``: one per run) all of
        whose checkpoints ran under root checkpoints older than every one kept (ids
        sort by time). A subgraph with a namespace of its own across runs
        (``checkpointer=True``) is left alone."""
        c = self._store.tables.lg_checkpoints
        rows = await conn.execute(
            select(c.c.checkpoint_ns, c.c.checkpoint_id, c.c.metadata).where(
                c.c.thread_id == thread_id, c.c.checkpoint_ns != ""
            )
        )
        spaces: dict[str, list[Any]] = {}
        for row in rows:
            spaces.setdefault(row.checkpoint_ns, []).append(row)
        for ns, members in spaces.items():
            if not all(NS_END in part for part in ns.split(NS_SEP)):
                continue
            under = {root_of(r.metadata) for r in members}
            # Older than every root checkpoint kept: a run under a root checkpoint
            # whose own put has not landed yet (puts run concurrently) stays.
            if None not in under and max(under) < min(roots):
                await self._delete(conn, thread_id, ns, [r.checkpoint_id for r in members])
                self._kept.pop((thread_id, ns), None)

    async def delete_runs(self, config: dict[str, Any], run_ids: list[str]) -> int:
        """Delete the checkpoints (and their writes) whose metadata names one of
        ``run_ids``, in the threads the caller may see; how many were deleted.

        Found by the indexed ``run_id`` column, then deleted thread by thread under
        the thread's lock.
        """
        store = self._store
        c, t = store.tables.lg_checkpoints, store.tables.threads
        ids = store.ids(config, need_thread=False)
        wanted = sorted({key for run in run_ids if (key := run_id_of({"run_id": run}))})
        if not wanted:
            return 0
        found: dict[Any, list[tuple[str, str]]] = {}
        for start in range(0, len(wanted), BATCH):
            stmt = select(c.c.thread_id, c.c.checkpoint_ns, c.c.checkpoint_id).where(
                c.c.run_id.in_(wanted[start : start + BATCH])
            )
            if ids.isolated:
                stmt = stmt.join(t, t.c.thread_id == c.c.thread_id).where(
                    t.c.user_id == ids.user_id
                )
            for row in await store.read(stmt):
                found.setdefault(row.thread_id, []).append((row.checkpoint_ns, row.checkpoint_id))
        for thread_id, doomed in found.items():
            self._forget(thread_id)
            async with store.write(thread_id) as (conn, _):
                spaces: dict[str, list[str]] = {}
                for ns, checkpoint_id in doomed:
                    spaces.setdefault(ns, []).append(checkpoint_id)
                for ns, ids_of_runs in spaces.items():
                    await self._delete(conn, thread_id, ns, ids_of_runs)
        return sum(len(doomed) for doomed in found.values())

    async def prune(self, configs: Iterable[dict[str, Any]], keep_latest: bool) -> None:
        """Keep only each namespace's newest checkpoint (with its writes), or nothing, of
        each config's thread (another user's: ThreadOwnershipError).

        Raises:
            NotImplementedError: ``keep_latest`` on a thread of a ``DeltaChannel``
                graph (its values are rebuilt from the ancestors), as LangGraph's own
                savers do; nothing of any thread is pruned then.
        """
        store = self._store
        c, w = store.tables.lg_checkpoints, store.tables.lg_writes
        every = [store.ids(config) for config in configs]  # all checked before any I/O
        if keep_latest and every:
            delta = select(c.c.thread_id).where(
                c.c.thread_id.in_([ids.thread_id for ids in every]),
                c.c.metadata.like(r'%"counters\_since\_delta\_snapshot"%', escape="\\"),
            )
            found = await store.read(delta.limit(1))
            if found:
                raise NotImplementedError(
                    f"thread {found[0].thread_id!r} uses a DeltaChannel: its values are "
                    "rebuilt from every ancestor since the last snapshot, so keep_latest "
                    "cannot prune it; use strategy='delete' or keep its history"
                )
        for ids in every:
            thread_id = ids.thread_id
            self._forget(thread_id)
            async with store.write(thread_id) as (conn, locked):
                if locked is None:
                    continue
                store.check_owner(ids, locked)
                if not keep_latest:
                    for table in (w, store.tables.lg_blobs, store.tables.lg_heads, c):
                        await conn.execute(delete(table).where(table.c.thread_id == thread_id))
                    continue
                spaces = select(c.c.checkpoint_ns).where(c.c.thread_id == thread_id).distinct()
                for ns in (await conn.execute(spaces)).scalars().all():
                    await self._prune_namespace(conn, thread_id, ns, 1, branches=False)

    def _forget(self, thread_id: Any) -> None:
        """Drop what this process remembers of a thread's last prunes."""
        for key in [key for key in self._kept if key[0] == thread_id]:
            del self._kept[key]

    async def copy(self, source: dict[str, Any], target: dict[str, Any]) -> None:
        """Copy the checkpoints, writes and values of the source config's thread to the
        target's.

        The source is read as the caller may see it (another user's thread is absent:
        nothing is copied). The target is created for the caller (or, for an operator,
        for the source's owner); another user's target is a ThreadOwnershipError.
        """
        store = self._store
        c, w, b = store.tables.lg_checkpoints, store.tables.lg_writes, store.tables.lg_blobs
        src, dst = store.ids(source), store.ids(target)
        async with store.snapshot() as conn:
            found = await conn.execute(select(*store.life_columns).where(store.owned(src)))
            owner = found.first()
            rows = {
                table: [
                    dict(r._mapping)
                    for r in await conn.execute(
                        select(*table.c).where(table.c.thread_id == src.thread_id)
                    )
                ]
                for table in (c, w, b)
            }
        if owner is None or not rows[c]:
            return
        user = dst.user_id if dst.isolated else owner.user_id
        ids = RunIds(thread_id=dst.thread_id, user_id=user, isolated=dst.isolated)
        source_life = life_of(owner)
        async with store.write(dst.thread_id) as (conn, locked):
            target_life = life_of(await store.claim_thread(conn, ids, locked, store.now()))
            lives = (source_life, target_life)
            for table in (w, b, store.tables.lg_heads, c):
                await conn.execute(delete(table).where(table.c.thread_id == dst.thread_id))
            for table, (data, column) in (
                (c, ("checkpoint", CHECKPOINT)),
                (w, ("value", WRITE)),
                (b, ("blob", BLOB)),
            ):
                if rows[table]:
                    await conn.execute(
                        insert(table),
                        [
                            self._moved(r, data, column, src.thread_id, dst.thread_id, lives)
                            for r in rows[table]
                        ],
                    )

    def _moved(
        self,
        row: dict[str, Any],
        data: str,
        column: str,
        src: Any,
        dst: Any,
        lives: tuple[Life, Life],
    ) -> dict[str, Any]:
        """A row copied to thread ``dst``: a sealed value opened for the source's life
        and sealed again for the target's (its associated data names the thread and
        its life: ``lives`` is the source's and the target's)."""
        moved = {**row, "thread_id": dst}
        if row["type"][:1] == "!" or self._store.keys is not None:
            keys = self._store.keys
            kind, plain = open_typed(keys, row["type"], bytes(row[data]), src, column, lives[0])
            moved["type"], moved[data] = self._seal(kind, plain, dst, column, lives[1])
        return moved
