"""Reading LangGraph checkpoints: one (with its writes and values), a list, and counts;
the values rebuilt from their chains (a ``DeltaChannel`` history: :mod:`.histories`).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from sqlalchemy import (
    case,
    func,
    null,
    select,
    tuple_,
)

from ..backends.records import LangGraphFastPath
from ..config import RunIds
from ..crypto import BLOB, life_of, open_typed
from ..deltas import MAX_DEPTH, Base, BrokenChain, Stored, rebuild
from ..errors import SerializationError
from ..serde import decode
from .columns import BLOB_COLUMNS, write_order
from .core import (
    BATCH,
    TablesCore,
    has_metadata,
    json_pair,
)
from .sql import value_chain

__all__ = ["Reads"]


class Reads(TablesCore):
    """Checkpoints read back as LangGraph wrote them."""

    async def rows(
        self,
        config: dict[str, Any],
        ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None,
        metadata: dict[str, Any] | None = None,
    ) -> list[tuple[Any, list[Any], dict[str, tuple[str, bytes]]]]:
        """Checkpoints newest first (with their writes, and the values they name in
        ``lg_blobs``: ``{channel: (type, blob)}``), narrowed as asked.

        A config without a thread lists every thread the caller may see: the user's
        while isolation applies, every thread otherwise. ``metadata`` keeps the
        checkpoints whose metadata has those top-level values: narrowed in SQL by
        each pair's JSON text (for keys and values whose text is plain), then checked
        exactly; writes are read only for the checkpoints returned. One checkpoint
        of a thread's namespace is read in one round trip where the backend has such
        a path.
        """
        store = self._store
        ids = store.ids(config, need_thread=False)
        one_thread = ids.thread_id is not None
        single = one_thread and ns is not None and limit == 1 and before is None
        single = single and not metadata
        learn = single and checkpoint_id is None  # a run's read of the head
        if store.store_id is None:
            await store.ensure_ready()
        one = self._one_statement()
        if one is not None and single:
            assert ns is not None
            return await self._read_at_once(one, ids, ns, checkpoint_id)
        stmt = self._rows_statement(ids, ns, checkpoint_id, before, limit, metadata)
        async with store.snapshot() as conn:
            rows = (await conn.execute(stmt)).all()
            if metadata:
                rows = [r for r in rows if has_metadata(r.metadata, metadata)][:limit]
            writes = await self._writes_of(conn, rows)
            values = await self._values(conn, rows, learn=learn)
        return [
            (
                row,
                writes[(row.thread_id, row.checkpoint_ns, row.checkpoint_id)],
                values.get((row.thread_id, row.checkpoint_ns, row.checkpoint_id), {}),
            )
            for row in rows
        ]

    def _rows_statement(
        self,
        ids: RunIds,
        ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None,
        metadata: dict[str, Any] | None,
    ) -> Any:
        """The checkpoints :meth:`rows` reads (with their thread's life and owner, and
        their namespace's head), narrowed in SQL as far as it can be."""
        store = self._store
        c, t = store.tables.lg_checkpoints, store.tables.threads
        one_thread = ids.thread_id is not None
        newest = c.alias("newest")
        head = (
            select(func.max(newest.c.checkpoint_id))
            .where(
                newest.c.thread_id == c.c.thread_id,
                newest.c.checkpoint_ns == c.c.checkpoint_ns,
            )
            .scalar_subquery()
        )
        stmt = select(*c.c, t.c.incarnation, t.c.user_id, head.label("head")).join(
            t, t.c.thread_id == c.c.thread_id
        )
        if one_thread:
            stmt = stmt.where(c.c.thread_id == store.visible_thread(ids))
        elif ids.isolated:
            stmt = stmt.where(t.c.user_id == ids.user_id)
        if ns is not None:
            stmt = stmt.where(c.c.checkpoint_ns == ns)
        if checkpoint_id is not None:
            stmt = stmt.where(c.c.checkpoint_id == checkpoint_id)
        if before is not None:
            stmt = stmt.where(c.c.checkpoint_id < before)
        for name, value in (metadata or {}).items():
            fragment = json_pair(name, value)
            if fragment is not None:
                stmt = stmt.where(c.c.metadata.like(f"%{fragment}%", escape="\\"))
        if one_thread:  # newest first across its namespaces
            stmt = stmt.order_by(c.c.checkpoint_id.desc(), c.c.checkpoint_ns)
        else:
            stmt = stmt.order_by(c.c.thread_id, c.c.checkpoint_ns, c.c.checkpoint_id.desc())
        if limit is not None and not metadata:
            stmt = stmt.limit(limit)
        return stmt

    async def _writes_of(
        self, conn: Any, rows: Sequence[Any]
    ) -> dict[tuple[Any, str, str], list[Any]]:
        """The pending writes of these checkpoints, by ``(thread, namespace, id)``."""
        w = self._store.tables.lg_writes
        writes: dict[tuple[Any, str, str], list[Any]] = {
            (r.thread_id, r.checkpoint_ns, r.checkpoint_id): [] for r in rows
        }
        # One query per batch of checkpoints, not one per checkpoint.
        for start in range(0, len(rows), BATCH):
            batch = rows[start : start + BATCH]
            found = await conn.execute(
                select(
                    w.c.thread_id,
                    w.c.checkpoint_ns,
                    w.c.checkpoint_id,
                    w.c.task_id,
                    w.c.channel,
                    w.c.type,
                    w.c.value,
                )
                .where(
                    w.c.thread_id.in_({r.thread_id for r in batch}),
                    w.c.checkpoint_id.in_({r.checkpoint_id for r in batch}),
                )
                .order_by(*write_order(w))
            )
            for write in found:
                key = (write.thread_id, write.checkpoint_ns, write.checkpoint_id)
                if key in writes:
                    writes[key].append(write)
        return writes

    async def counts(self, thread_ids: Sequence[Any]) -> dict[Any, int]:
        """How many LangGraph checkpoints each of these threads has (those with none
        are left out); no user scoping: the caller has already read the threads."""
        c = self._store.tables.lg_checkpoints
        found: dict[Any, int] = {}
        wanted = sorted(set(thread_ids))
        for start in range(0, len(wanted), BATCH):
            stmt = (
                select(c.c.thread_id, func.count().label("n"))
                .where(c.c.thread_id.in_(wanted[start : start + BATCH]))
                .group_by(c.c.thread_id)
            )
            found.update({row.thread_id: int(row.n) for row in await self._store.read(stmt)})
        return found

    async def _read_at_once(
        self, one: LangGraphFastPath, ids: RunIds, ns: str, checkpoint_id: str | None
    ) -> list[tuple[Any, list[Any], dict[str, tuple[str, bytes]]]]:
        """One checkpoint (the head when no id is given) with its writes and values, in
        one round trip."""
        held = self._bases.held(ids.thread_id, ns)
        found = await one.read(
            ids.isolated,
            {
                "t": ids.thread_id,
                "ns": ns,
                "u": ids.user_id,
                "id": checkpoint_id,
                "kc": list(held),
                "kv": [base.version for base in held.values()],
                "ku": [base.uid for base in held.values()],
            },
        )
        if found is None:
            return []
        row = SimpleNamespace(**found)
        writes = [
            SimpleNamespace(task_id=task, channel=channel, type=kind, value=value)
            for task, channel, kind, value in zip(
                row.w_task_id or (),
                row.w_channel or (),
                row.w_type or (),
                row.w_value or (),
                strict=True,
            )
        ]
        stored: dict[str, dict[str, Stored]] = {}
        life = life_of(row)  # read with the checkpoint, in the same statement
        for channel, version, kind, blob, base, splice, skip, uid in zip(
            *(getattr(row, f"b_{name}") or () for name in BLOB_COLUMNS), strict=True
        ):
            kind, blob = open_typed(self._store.keys, kind, blob, row.thread_id, BLOB, life)
            stored.setdefault(channel, {})[version] = Stored(kind, blob, base, splice, skip, uid)
        values: dict[str, tuple[str, bytes]] = {}
        if row.versions is not None:
            values = self._rebuilt(
                row.thread_id,
                ns,
                decode(row.versions),
                stored,
                learn=checkpoint_id is None,
                held=held,
            )
        return [(row, writes, values)]

    def _rebuilt(
        self,
        thread_id: Any,
        ns: str,
        versions: dict[str, str],
        stored: dict[str, dict[str, Stored]],
        *,
        learn: bool,
        held: dict[str, Base] | None = None,
    ) -> dict[str, tuple[str, bytes]]:
        """A checkpoint's values ``{channel: (type, bytes)}`` from the rows of their
        chains (``learn``: remember them as the next versions' bases), or from the
        values the process ``held`` when the stored row is the one held (its
        version and uid: the read did not fetch such a value's chain)."""
        values: dict[str, tuple[str, bytes]] = {}
        for channel, version in versions.items():
            rows = stored.get(channel)
            if not rows or version not in rows:
                continue  # a channel without a value
            mine = held.get(channel) if held else None
            on_chain = mine is not None and _on_chain(rows, version, mine)
            if on_chain and mine is not None:
                if mine.version == version:
                    values[channel] = (mine.type, mine.value)
                    continue
                # the chain is read down to the value held (no further): start from it
                rows = {**rows, mine.version: Stored(mine.type, mine.value, uid=mine.uid)}
            try:
                kind, data, depth, tails = rebuild(rows, version)
            except BrokenChain as exc:
                raise SerializationError(
                    f"thread {thread_id!r}: the value of channel {channel!r} at version "
                    f"{version} cannot be rebuilt: {exc}"
                ) from exc
            if on_chain and mine is not None:  # the depth and tails of the whole chain
                depth, tails = depth + mine.depth, tails + mine.tails
            values[channel] = (kind, data)
            if learn and rows[version].uid:  # uid 0: migrated or imported, not unique
                base = Base(version, rows[version].uid, kind, data, depth, tails)
                self._bases.put((thread_id, ns, channel), base)
        return values

    async def _values(
        self,
        conn: Any,
        rows: Sequence[Any],
        *,
        learn: bool = False,
    ) -> dict[tuple[Any, str, str], dict[str, tuple[str, bytes]]]:
        """The ``lg_blobs`` values of these checkpoints: ``{channel: (type, blob)}``
        each, read with the chains of their deltas in one query per namespace and batch
        of versions (a version shared by many checkpoints is read once), opened for
        the life of each thread (read with its checkpoints, in the same snapshot)."""
        b = self._store.tables.lg_blobs
        wanted: dict[tuple[Any, str], set[tuple[str, str]]] = {}
        named: list[tuple[Any, dict[str, str]]] = []
        lives = {row.thread_id: life_of(row) for row in rows}
        for row in rows:
            if row.versions is None:  # its values are inline (written before 0005)
                continue
            versions = decode(row.versions)
            named.append((row, versions))
            wanted.setdefault((row.thread_id, row.checkpoint_ns), set()).update(versions.items())
        found: dict[tuple[Any, str], dict[str, dict[str, Stored]]] = {}
        held: dict[tuple[Any, str], dict[str, Base]] = {}
        for (thread_id, ns), pairs in wanted.items():
            ordered = sorted(pairs)
            space = found.setdefault((thread_id, ns), {})
            mine = held[(thread_id, ns)] = self._bases.held(thread_id, ns) if learn else {}
            for start in range(0, len(ordered), BATCH):
                batch = ordered[start : start + BATCH]
                base: Any = b.c.base
                if mine:  # a value the process holds is not followed down its bases
                    known = [(ch, x.version, x.uid) for ch, x in mine.items()]
                    base = case(
                        (tuple_(b.c.channel, b.c.version, b.c.uid).in_(known), null()), else_=base
                    )
                keys = select(b.c.channel, b.c.version, base.label("base")).where(
                    b.c.thread_id == thread_id,
                    b.c.checkpoint_ns == ns,
                    tuple_(b.c.channel, b.c.version).in_(batch),
                )
                life = lives[thread_id]
                for r in await conn.execute(value_chain(self._store, thread_id, ns, keys)):
                    space.setdefault(r.channel, {})[r.version] = self._stored(
                        thread_id, r, r.blob, life
                    )
        values: dict[tuple[Any, str, str], dict[str, tuple[str, bytes]]] = {}
        for row, versions in named:
            t, ns = row.thread_id, row.checkpoint_ns
            stored = found.get((t, ns), {})
            values[(t, ns, row.checkpoint_id)] = self._rebuilt(
                t, ns, versions, stored, learn=learn, held=held.get((t, ns))
            )
        return values


def _on_chain(rows: dict[str, Stored], version: str, held: Base) -> bool:
    """Whether the value ``held`` is on the chain of ``version`` in ``rows`` (its row
    there, with its uid): the chain's rows below it were not read."""
    at: str | None = version
    for _ in range(4 * MAX_DEPTH):
        if at is None:
            return False
        row = rows.get(at)
        if row is None:
            return False
        if at == held.version:
            return row.uid == held.uid
        at = row.base
    return False
