"""Reading LangGraph checkpoints: one (with its writes and values), a list, counts, and
a ``DeltaChannel`` history.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from sqlalchemy import (
    func,
    literal,
    select,
    tuple_,
)

from ..backends.base import LangGraphFastPath
from ..config import RunIds
from ..crypto import BLOB, Life, life_of, open_typed
from ..deltas import Base, BrokenChain, Stored, rebuild
from ..errors import SerializationError
from ..serde import decode
from .columns import BLOB_COLUMNS, write_order
from .core import (
    BATCH,
    WALK,
    TablesCore,
    has_metadata,
    json_pair,
)
from .sql import (
    HISTORY_CHANNELS,
    HISTORY_COLUMNS,
    HISTORY_DEPTH,
    by_key,
    history_statement,
    value_chain,
    verbatim_in_json,
)

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
        c, w = store.tables.lg_checkpoints, store.tables.lg_writes
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
        t = store.tables.threads
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
        async with store.snapshot() as conn:
            rows = (await conn.execute(stmt)).all()
            if metadata:
                rows = [r for r in rows if has_metadata(r.metadata, metadata)][:limit]
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
            values = await self._values(conn, rows, learn=learn)
        return [
            (
                row,
                writes[(row.thread_id, row.checkpoint_ns, row.checkpoint_id)],
                values.get((row.thread_id, row.checkpoint_ns, row.checkpoint_id), {}),
            )
            for row in rows
        ]

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
        found = await one.read(
            ids.isolated, {"t": ids.thread_id, "ns": ns, "u": ids.user_id, "id": checkpoint_id}
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
                row.thread_id, ns, decode(row.versions), stored, learn=checkpoint_id is None
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
    ) -> dict[str, tuple[str, bytes]]:
        """A checkpoint's values ``{channel: (type, bytes)}`` from the rows of their
        chains (``learn``: remember them as the next versions' bases)."""
        values: dict[str, tuple[str, bytes]] = {}
        for channel, version in versions.items():
            rows = stored.get(channel)
            if not rows or version not in rows:
                continue  # a channel without a value
            try:
                kind, data, depth, tails = rebuild(rows, version)
            except BrokenChain as exc:
                raise SerializationError(
                    f"thread {thread_id!r}: the value of channel {channel!r} at version "
                    f"{version} cannot be rebuilt: {exc}"
                ) from exc
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
        for (thread_id, ns), pairs in wanted.items():
            ordered = sorted(pairs)
            space = found.setdefault((thread_id, ns), {})
            for start in range(0, len(ordered), BATCH):
                batch = ordered[start : start + BATCH]
                keys = select(b.c.channel, b.c.version, b.c.base).where(
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
            values[(t, ns, row.checkpoint_id)] = self._rebuilt(t, ns, versions, stored, learn=learn)
        return values

    async def history(
        self, config: dict[str, Any], ns: str, checkpoint_id: str | None, channels: set[str]
    ) -> tuple[Life | None, list[tuple[str, list[Any], dict[str, tuple[str, bytes]], Any]]]:
        """What a walk of a checkpoint's ancestors for ``channels`` needs (LangGraph's
        ``DeltaChannel`` history), parent first, up to the nearest ancestor that holds a
        value of each channel: per ancestor, its id, its writes to those channels
        (LangGraph's order), the values of those channels it holds, and — when some of
        its values are inline (written before 0005, or a channel name longer than
        the table's key) — its row (``type``, ``checkpoint``), else None.

        Read in one snapshot, a batch of ancestors at a time (one query each for the
        ancestors, which of them hold values, their writes, and the values): neither
        the checkpoints nor other channels' writes are read or decoded. Returned with
        the thread's life, read in the same snapshot: what the writes and inline
        checkpoints (opened by the caller) are sealed for (None: nothing was read).
        """
        store = self._store
        c, w, b = store.tables.lg_checkpoints, store.tables.lg_writes, store.tables.lg_blobs
        ids = store.ids(config)
        asked = sorted(channels)
        if 0 < len(asked) <= HISTORY_CHANNELS and all(
            self.limits.storable(ch) and verbatim_in_json(ch) for ch in asked
        ):
            at_once = await self._history_at_once(ids, ns, checkpoint_id, asked)
            if at_once is not None:
                return at_once
        thread = store.visible_thread(ids)
        steps: list[tuple[str, list[Any], dict[str, tuple[str, bytes]], Any]] = []
        remaining = set(channels)
        async with store.snapshot() as conn:
            found_life = (
                await conn.execute(select(*store.life_columns).where(store.owned(ids)))
            ).first()
            if found_life is None:  # absent, or not the caller's: nothing to walk
                return None, steps
            life = life_of(found_life)
            start = checkpoint_id
            if start is None:
                newest = select(func.max(c.c.checkpoint_id)).where(
                    c.c.thread_id == thread, c.c.checkpoint_ns == ns
                )
                start = (await conn.execute(newest)).scalar()
            first = True
            held: set[tuple[str, str]] | None = None
            while start is not None and remaining:
                chain = await self._walk(conn, ids.thread_id, thread, ns, start, skip=first)
                first = False
                if not chain:
                    break
                named = {
                    r.checkpoint_id: {
                        ch: v for ch, v in decode(r.versions).items() if ch in remaining
                    }
                    for r in chain
                    if r.versions is not None
                }
                # kept inline: looked at
                long = any(not self.limits.storable(ch) for ch in remaining)
                inline = [
                    r.checkpoint_id
                    for r in chain
                    if r.versions is None
                    or long
                    or "" in named.get(r.checkpoint_id, {}).values()  # a None, inline
                ]
                if held is None:  # the stored versions of those channels (few: snapshots)
                    rows = await conn.execute(
                        select(b.c.channel, b.c.version).where(
                            b.c.thread_id == ids.thread_id,
                            b.c.checkpoint_ns == ns,
                            b.c.channel.in_(sorted(remaining)),
                        )
                    )
                    held = {(r.channel, r.version) for r in rows}
                # the ancestors walked: up to the one where the last channel found a value
                walked, seeds, looking = [], {}, set(remaining)
                for r in chain:
                    walked.append(r)
                    versions = named.get(r.checkpoint_id, {})
                    for ch in [ch for ch in looking if (ch, versions.get(ch)) in held]:
                        seeds[(r.checkpoint_id, ch)] = versions[ch]
                        looking.discard(ch)
                    looking -= {ch for ch in looking if versions.get(ch) == ""}  # inline
                    if not looking:
                        break
                walked_ids = [r.checkpoint_id for r in walked]
                writes: dict[str, list[Any]] = {cid: [] for cid in walked_ids}
                # the ids of one path sort by time: a range (a branch's ids in it are
                # read and left out), one statement text whatever the count
                rows = await conn.execute(
                    select(w.c.checkpoint_id, w.c.task_id, w.c.channel, w.c.type, w.c.value)
                    .where(
                        w.c.thread_id == ids.thread_id,
                        w.c.checkpoint_ns == ns,
                        w.c.checkpoint_id.between(min(walked_ids), max(walked_ids)),
                        w.c.channel.in_(sorted(remaining)),
                    )
                    .order_by(w.c.checkpoint_id, *write_order(w))
                )
                for row in rows:
                    if row.checkpoint_id in writes:
                        writes[row.checkpoint_id].append(row)
                wanted = sorted({(ch, v) for (_, ch), v in seeds.items()})
                values: dict[str, dict[str, Stored]] = {}
                if wanted:
                    keys = select(b.c.channel, b.c.version, b.c.base).where(
                        b.c.thread_id == ids.thread_id,
                        b.c.checkpoint_ns == ns,
                        tuple_(b.c.channel, b.c.version).in_(wanted),
                    )
                    for r in await conn.execute(value_chain(store, ids.thread_id, ns, keys)):
                        values.setdefault(r.channel, {})[r.version] = self._stored(
                            ids.thread_id, r, r.blob, life
                        )
                inline_rows = {}
                if inline:
                    found = await conn.execute(
                        select(c.c.checkpoint_id, c.c.type, c.c.checkpoint).where(
                            c.c.thread_id == ids.thread_id,
                            c.c.checkpoint_ns == ns,
                            c.c.checkpoint_id.in_([i for i in inline if i in walked_ids]),
                        )
                    )
                    inline_rows = {r.checkpoint_id: r for r in found}
                for r in walked:
                    held_here = {
                        ch: version
                        for (cid, ch), version in seeds.items()
                        if cid == r.checkpoint_id
                    }
                    steps.append(
                        (
                            r.checkpoint_id,
                            writes[r.checkpoint_id],
                            self._rebuilt(ids.thread_id, ns, held_here, values, learn=False),
                            inline_rows.get(r.checkpoint_id),
                        )
                    )
                    remaining -= set(held_here)
                if len(walked) < len(chain) or not remaining:
                    break
                start = chain[-1].checkpoint_id
                first = True
        return life, steps

    async def _history_at_once(
        self, ids: RunIds, ns: str, checkpoint_id: str | None, channels: list[str]
    ) -> tuple[Life | None, list[tuple[str, list[Any], dict[str, tuple[str, bytes]], Any]]] | None:
        """:meth:`history` in one statement (one round trip; on a SQLite file one thread
        hop): None when a channel's walk ends at a value kept in the checkpoint itself
        (written before 0005, or a None) or goes deeper than one statement walks."""
        from ..backends.driver import DriverStatement

        store = self._store
        if store.store_id is None:
            await store.ensure_ready()
        key = (ids.isolated, len(channels))
        if key not in self._histories:
            stmt = history_statement(store, *key)
            self._histories[key] = (stmt, DriverStatement(stmt, store.backend.engine.dialect))
        stmt, driver = self._histories[key]
        values: dict[str, Any] = {"t": ids.thread_id, "ns": ns, "id": checkpoint_id}
        values["u"] = ids.user_id
        for i, channel in enumerate(channels):
            values[f"ch{i}"], values[f"p{i}"] = channel, f'$."{channel}"'
        one = self._one_statement()
        rows: Sequence[Any]
        if one is not None:
            rows = await one.fetch(driver, values)
        else:
            async with store.snapshot() as conn:
                rows = (await conn.execute(stmt, values)).all()
        walked: list[Any] = []
        writes: dict[str, list[Any]] = {}
        stored: dict[str, dict[str, Stored]] = {}
        found: list[Any] = []
        life: Life | None = None
        for row in rows:
            r = SimpleNamespace(**dict(zip(HISTORY_COLUMNS, row, strict=True)))
            if r.kind == 0:
                # MySQL types a UNION of its bit arithmetic as DECIMAL: back to int.
                r.came, r.rest = int(r.came), int(r.rest)
                walked.append(r)
            elif r.kind == 1:
                writes.setdefault(r.checkpoint_id, []).append(r)
            elif r.kind == 2:
                found.append(r)
            else:  # the thread's life: its incarnation (uid) and owner (channel, as text)
                life = Life(int(r.uid), r.channel)
        for r in found:  # opened for the life read in the same statement
            assert life is not None  # (a value is found only on a walk of a visible thread)
            stored.setdefault(r.channel, {})[r.version] = self._stored(
                ids.thread_id, r, r.value, life
            )
        if walked and walked[-1].rest and walked[-1].depth >= HISTORY_DEPTH:
            return None  # deeper than one statement walks: batches
        steps = []
        for r in walked:
            held: dict[str, str] = {}
            if r.came != r.rest:
                versions = {} if r.versions is None else decode(r.versions)
                for i, channel in enumerate(channels):
                    if r.came & (1 << i) and not r.rest & (1 << i):
                        version = versions.get(channel)
                        if not version:  # kept in the checkpoint: read the long way
                            return None
                        held[channel] = version
            steps.append(
                (
                    r.checkpoint_id,
                    writes.get(r.checkpoint_id, []),
                    self._rebuilt(ids.thread_id, ns, held, stored, learn=False),
                    None,
                )
            )
        return life, steps

    async def _walk(
        self, conn: Any, thread_id: Any, thread: Any, ns: str, start: str, *, skip: bool
    ) -> list[Any]:
        """Up to :data:`WALK` ancestors of ``start`` (its parent first; ``start`` itself
        too unless ``skip``), with their ``versions``, in ONE query: each step looks its
        parent up by the whole primary key (on PostgreSQL a lateral with LIMIT 1, so
        no plan scans the namespace per step however stale the statistics)."""
        c = self._store.tables.lg_checkpoints
        columns = (c.c.checkpoint_id, c.c.parent_checkpoint_id, c.c.versions)
        chain = (
            select(*columns, literal(0).label("depth"))
            .where(c.c.thread_id == thread, c.c.checkpoint_ns == ns, c.c.checkpoint_id == start)
            .cte("walk", recursive=True)
        )
        parent = by_key(
            self._store,
            c,
            (c.c.thread_id == thread_id, c.c.checkpoint_ns == ns),
            c.c.checkpoint_id == chain.c.parent_checkpoint_id,
            ["checkpoint_id", "parent_checkpoint_id", "versions"],
            "parent",
        )
        chain = chain.union_all(
            select(*parent.columns, chain.c.depth + 1)
            .select_from(chain)
            .join(parent.source, parent.on)
            .where(chain.c.depth < WALK)
        )
        rows = await conn.execute(
            select(chain.c.checkpoint_id, chain.c.versions)
            .where(chain.c.depth > (0 if skip else -1))
            .order_by(chain.c.depth)
        )
        return list(rows)
