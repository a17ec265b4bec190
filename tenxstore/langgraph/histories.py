"""Reading a ``DeltaChannel`` history: a checkpoint's ancestors, their writes to some
channels, and the nearest values of those channels — in one statement where it can,
else a batch of ancestors at a time.
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

from ..config import RunIds
from ..crypto import Life, life_of
from ..deltas import Stored
from ..serde import decode
from .columns import write_order
from .core import WALK
from .reads import Reads
from .sql import (
    HISTORY_CHANNELS,
    HISTORY_COLUMNS,
    HISTORY_DEPTH,
    by_key,
    history_statement,
    value_chain,
    verbatim_in_json,
)

__all__ = ["Histories"]

Step = tuple[str, list[Any], dict[str, tuple[str, bytes]], Any]
"""One ancestor of a history: its id, its writes, the values it holds, its inline row."""


def _walked(
    chain: Sequence[Any],
    named: dict[str, dict[str, str]],
    held: set[tuple[str, str]],
    remaining: set[str],
) -> tuple[list[Any], dict[tuple[str, str], str]]:
    """The ancestors of ``chain`` walked: up to the one where the last channel found a
    value; and the versions found, ``{(checkpoint id, channel): version}``."""
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
    return walked, seeds


def _history_kinds(
    rows: Sequence[Any],
) -> tuple[list[Any], dict[str, list[Any]], list[Any], Life | None]:
    """A history statement's rows by kind: the ancestors walked, the writes by
    checkpoint, the values' rows, and the thread's life."""
    walked: list[Any] = []
    writes: dict[str, list[Any]] = {}
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
    return walked, writes, found, life


class Histories(Reads):
    """``DeltaChannel`` histories, their values rebuilt as :class:`Reads` rebuilds a
    checkpoint's."""

    async def history(
        self, config: dict[str, Any], ns: str, checkpoint_id: str | None, channels: set[str]
    ) -> tuple[Life | None, list[Step]]:
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
        ids = store.ids(config)
        asked = sorted(channels)
        if 0 < len(asked) <= HISTORY_CHANNELS and all(
            self.limits.storable(ch) and verbatim_in_json(ch) for ch in asked
        ):
            at_once = await self._history_at_once(ids, ns, checkpoint_id, asked)
            if at_once is not None:
                return at_once
        thread = store.visible_thread(ids)
        steps: list[Step] = []
        async with store.snapshot() as conn:
            found_life = (
                await conn.execute(select(*store.life_columns).where(store.owned(ids)))
            ).first()
            if found_life is None:  # absent, or not the caller's: nothing to walk
                return None, steps
            life = life_of(found_life)
            await self._walk_history(
                conn, ids, thread, ns, checkpoint_id, set(channels), life, steps
            )
        return life, steps

    async def _walk_history(
        self,
        conn: Any,
        ids: RunIds,
        thread: Any,
        ns: str,
        checkpoint_id: str | None,
        remaining: set[str],
        life: Life,
        steps: list[Step],
    ) -> None:
        """:meth:`history`'s walk, a batch of :data:`WALK` ancestors at a time, each
        ancestor's step appended to ``steps``; ``remaining``: the channels still
        looked for."""
        c = self._store.tables.lg_checkpoints
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
                r.checkpoint_id: {ch: v for ch, v in decode(r.versions).items() if ch in remaining}
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
                held = await self._held(conn, ids.thread_id, ns, remaining)
            walked, seeds = _walked(chain, named, held, remaining)
            await self._history_steps(
                conn, ids.thread_id, ns, walked, seeds, inline, remaining, life, steps
            )
            if len(walked) < len(chain) or not remaining:
                break
            start = chain[-1].checkpoint_id
            first = True

    async def _held(
        self, conn: Any, thread_id: Any, ns: str, channels: set[str]
    ) -> set[tuple[str, str]]:
        """The ``(channel, version)`` stored in ``lg_blobs`` of these channels."""
        b = self._store.tables.lg_blobs
        rows = await conn.execute(
            select(b.c.channel, b.c.version).where(
                b.c.thread_id == thread_id,
                b.c.checkpoint_ns == ns,
                b.c.channel.in_(sorted(channels)),
            )
        )
        return {(r.channel, r.version) for r in rows}

    async def _history_steps(
        self,
        conn: Any,
        thread_id: Any,
        ns: str,
        walked: list[Any],
        seeds: dict[tuple[str, str], str],
        inline: list[str],
        remaining: set[str],
        life: Life,
        steps: list[Step],
    ) -> None:
        """The steps of a batch's ancestors walked, appended to ``steps`` (their
        writes, values and inline rows read); the channels found leave ``remaining``."""
        c, w = self._store.tables.lg_checkpoints, self._store.tables.lg_writes
        walked_ids = [r.checkpoint_id for r in walked]
        writes: dict[str, list[Any]] = {cid: [] for cid in walked_ids}
        # the ids of one path sort by time: a range (a branch's ids in it are
        # read and left out), one statement text whatever the count
        rows = await conn.execute(
            select(w.c.checkpoint_id, w.c.task_id, w.c.channel, w.c.type, w.c.value)
            .where(
                w.c.thread_id == thread_id,
                w.c.checkpoint_ns == ns,
                w.c.checkpoint_id.between(min(walked_ids), max(walked_ids)),
                w.c.channel.in_(sorted(remaining)),
            )
            .order_by(w.c.checkpoint_id, *write_order(w))
        )
        for row in rows:
            if row.checkpoint_id in writes:
                writes[row.checkpoint_id].append(row)
        values = await self._seed_values(conn, thread_id, ns, seeds, life)
        inline_rows = {}
        if inline:
            found = await conn.execute(
                select(c.c.checkpoint_id, c.c.type, c.c.checkpoint).where(
                    c.c.thread_id == thread_id,
                    c.c.checkpoint_ns == ns,
                    c.c.checkpoint_id.in_([i for i in inline if i in walked_ids]),
                )
            )
            inline_rows = {r.checkpoint_id: r for r in found}
        for r in walked:
            held_here = {
                ch: version for (cid, ch), version in seeds.items() if cid == r.checkpoint_id
            }
            steps.append(
                (
                    r.checkpoint_id,
                    writes[r.checkpoint_id],
                    self._rebuilt(thread_id, ns, held_here, values, learn=False),
                    inline_rows.get(r.checkpoint_id),
                )
            )
            remaining.difference_update(held_here)

    async def _seed_values(
        self, conn: Any, thread_id: Any, ns: str, seeds: dict[tuple[str, str], str], life: Life
    ) -> dict[str, dict[str, Stored]]:
        """The rows of the chains of the values found (``seeds``), opened for ``life``."""
        b = self._store.tables.lg_blobs
        wanted = sorted({(ch, v) for (_, ch), v in seeds.items()})
        values: dict[str, dict[str, Stored]] = {}
        if wanted:
            keys = select(b.c.channel, b.c.version, b.c.base).where(
                b.c.thread_id == thread_id,
                b.c.checkpoint_ns == ns,
                tuple_(b.c.channel, b.c.version).in_(wanted),
            )
            for r in await conn.execute(value_chain(self._store, thread_id, ns, keys)):
                values.setdefault(r.channel, {})[r.version] = self._stored(
                    thread_id, r, r.blob, life
                )
        return values

    async def _history_at_once(
        self, ids: RunIds, ns: str, checkpoint_id: str | None, channels: list[str]
    ) -> tuple[Life | None, list[Step]] | None:
        """:meth:`history` in one statement (one round trip; on a SQLite file one thread
        hop): None when a channel's walk ends at a value kept in the checkpoint itself
        (written before 0005, or a None) or goes deeper than one statement walks."""
        rows = await self._history_rows(ids, ns, checkpoint_id, channels)
        walked, writes, found, life = _history_kinds(rows)
        stored: dict[str, dict[str, Stored]] = {}
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

    async def _history_rows(
        self, ids: RunIds, ns: str, checkpoint_id: str | None, channels: list[str]
    ) -> Sequence[Any]:
        """The rows of the history statement of ``channels`` (built once per isolation
        and count), through the backend's one-statement path where it has one."""
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
        return rows

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
