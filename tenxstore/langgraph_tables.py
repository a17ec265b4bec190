"""The tables of :mod:`tenxstore.langgraph` (``lg_checkpoints``, ``lg_writes``).

LangGraph checkpoints and pending writes live beside tenxstore's own tables, under
the same thread row lock and ownership rules. Values arrive serialized by LangGraph's
serde; this module stores and finds them.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    select,
    tuple_,
)

from .config import RunIds, recorded_incarnation
from .errors import StaleStateError
from .serde import decode, encode
from .store import Store

__all__ = ["LangGraphTables", "Values", "needed", "run_id_of"]

_BATCH = 500  # checkpoints whose writes are read (or deleted) in one statement
_REMEMBERED = 4096  # namespaces whose last prune this process remembers
INTERRUPT = "__interrupt__"  # LangGraph's channel of a pending interrupt
NS_SEP, NS_END = "|", ":"  # LangGraph's namespace separators (subgraph | node:task)


_PLAIN = re.compile(r"[A-Za-z0-9 ._:/@+-]*")


def _json_pair(key: str, value: Any) -> str | None:
    """``"key":value`` as the stored JSON writes it, escaped for LIKE; None when that
    text is not certain (numbers: ``1``, ``1.0`` and ``true`` are equal in Python; the
    pair is then checked in Python alone)."""
    if not isinstance(key, str) or not _PLAIN.fullmatch(key):
        return None
    if value is None:
        text = "null"
    elif type(value) is str and _PLAIN.fullmatch(value):
        text = f'"{value}"'
    else:
        return None
    return f'"{key}":{text}'.replace("_", "\\_")


def _has_metadata(text: str, wanted: dict[str, Any]) -> bool:
    """LangGraph's own filter: each wanted value equals the metadata's."""
    found = decode(text)
    return all(found.get(key) == value for key, value in wanted.items())


def run_id_of(metadata: dict[str, Any]) -> str | None:
    """The ``run_id`` column of a checkpoint: its metadata's (a string or a UUID), or
    for one longer than the column, ``sha256:`` and its digest."""
    run_id = metadata.get("run_id")
    if isinstance(run_id, uuid.UUID):
        return str(run_id)
    if not isinstance(run_id, str):
        return None
    if len(run_id) <= 255:
        return run_id
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256:{digest}"


def uses_delta_channels(metadata: str) -> bool:
    """Whether a checkpoint's metadata (JSON text) shows ``DeltaChannel`` bookkeeping,
    as LangGraph's own savers tell (``counters_since_delta_snapshot``)."""
    return '"counters_since_delta_snapshot"' in metadata


def needed(rows: Iterable[Any], newest: int, waiting: Iterable[str] = ()) -> set[str]:
    """The checkpoints of one namespace that pruning keeps: the ``newest`` newest and
    the ``waiting`` ones (heads of branches left at an interrupt, which a
    ``Command(resume=...)`` may still take up). A namespace of a ``DeltaChannel``
    graph is kept whole: its values are rebuilt from the ancestors' writes, and
    LangGraph's own savers do not prune it either. ``rows`` have ``checkpoint_id``
    and ``metadata``."""
    rows = list(rows)
    if any(uses_delta_channels(r.metadata) for r in rows):
        return {r.checkpoint_id for r in rows}
    ordered = sorted((r.checkpoint_id for r in rows), reverse=True)
    return set(ordered[:newest]) | set(waiting)


def _root_of(metadata: str) -> Any:
    """The root namespace's checkpoint a subgraph's checkpoint ran under (LangGraph's
    ``parents`` metadata), or None."""
    parents = decode(metadata).get("parents")
    return parents.get("") if isinstance(parents, dict) else None


@dataclass(frozen=True)
class Values:
    """A checkpoint's channel values as ``put`` stores them.

    ``versions``: the channels' versions (as text), what a reader looks up;
    ``stored``: the channels that have a value at their version; ``new``: the
    channels LangGraph gave a new version (their values are written, replacing what
    a checkpoint put again stored); ``dump``: a channel's value serialized
    (``(type, bytes)``), called for the new ones and for versions not stored yet.
    """

    versions: dict[str, str]
    stored: frozenset[str]
    new: frozenset[str]
    dump: Callable[[str], tuple[str, bytes]]


class _Statements:
    """The statements of every put, built once (with bind parameters)."""

    def __init__(self, store: Store) -> None:
        c = store.tables.lg_checkpoints
        here = and_(
            c.c.thread_id == bindparam("t", type_=c.c.thread_id.type),
            c.c.checkpoint_ns == bindparam("ns", type_=String()),
        )
        newest = select(c.c.checkpoint_id).where(here).order_by(c.c.checkpoint_id.desc())
        parent = select(literal(1)).where(
            here, c.c.checkpoint_id == bindparam("parent", type_=String())
        )
        #: The namespace's newest checkpoint, whether the parent exists, and the one at
        #: offset ``off`` from the newest (None: fewer): one round trip.
        self.look = select(
            newest.limit(1).scalar_subquery(),
            parent.scalar_subquery(),
            newest.offset(bindparam("off", type_=Integer())).limit(1).scalar_subquery(),
        )
        #: A checkpoint, replacing one of the same id.
        self.put_checkpoint = store.backend.upsert(c, "thread_id", "checkpoint_ns", "checkpoint_id")
        #: A channel's value at a version, replacing one stored at that version.
        self.put_blob = store.backend.upsert(
            store.tables.lg_blobs, "thread_id", "checkpoint_ns", "channel", "version"
        )


class LangGraphTables:
    """LangGraph checkpoints and writes of a repository's threads."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._sql = _Statements(store)
        # (thread, namespace) -> checkpoints its last prune kept (in this process)
        self._kept: OrderedDict[tuple[Any, str], int] = OrderedDict()

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
        now = self._store.now()
        key = (ids.thread_id, ns)
        limit = history_limit
        # pruned once the namespace holds a tenth of the limit more than it kept last
        probe = (
            None
            if limit is None
            else max(self._kept.get(key, limit), limit) + max(limit // 10, 1) - 2
        )
        async with self._store.write(ids.thread_id) as (conn, locked):
            self._same_life(config, ids, locked, parent_id)
            row = await self._store.claim_thread(conn, ids, locked, now)
            newest, has_parent, beyond = (
                await conn.execute(
                    self._sql.look,
                    {"t": ids.thread_id, "ns": ns, "parent": parent_id, "off": probe or 0},
                )
            ).one()
            if parent_id is None and found_empty and newest is not None:
                raise StaleStateError(
                    ids.thread_id,
                    "(none)",
                    newest,
                    message=f"thread {ids.thread_id!r}: another run wrote checkpoint {newest} "
                    "after this run found the thread empty; two runs from one head cannot "
                    "both commit: read the state again (get_state) and run again",
                )
            if parent_id is not None and newest != parent_id:
                gone = has_parent is None
                if gone and recorded_incarnation(config) is not None:  # the same life
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
            await conn.execute(
                self._sql.put_checkpoint,
                {
                    "thread_id": ids.thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                    "parent_checkpoint_id": parent_id,
                    "type": typed[0],
                    "checkpoint": typed[1],
                    "metadata": metadata,
                    "created_at": now,
                    "run_id": run_id,
                    "versions": None if values is None else encode(values.versions, "versions"),
                },
            )
            if values is not None:
                await self._put_values(conn, ids.thread_id, ns, values)
            if limit is not None and beyond is not None:  # grown by a tenth since it was
                kept, pruned = await self._prune_namespace(conn, ids.thread_id, ns, limit)
                # Nothing to prune (a DeltaChannel graph's namespace, kept whole): look
                # again when it has doubled, so the looks cost O(1) per put.
                self._remember(key, kept if pruned else 2 * kept)
        incarnation: int = row.incarnation
        return incarnation

    async def _put_values(self, conn: Any, thread_id: Any, ns: str, values: Values) -> None:
        """Store a checkpoint's new values, and those of its other versions that are not
        stored yet (a run that goes on from a checkpoint written before 0005)."""
        b = self._store.tables.lg_blobs
        here = (b.c.thread_id == thread_id, b.c.checkpoint_ns == ns)
        fresh = [(ch, v) for ch, v in values.versions.items() if ch in values.stored & values.new]
        older = [(ch, v) for ch, v in values.versions.items() if ch in values.stored - values.new]
        stored: set[tuple[str, str]] = set()
        for start in range(0, len(older), _BATCH):
            found = await conn.execute(
                select(b.c.channel, b.c.version).where(
                    *here, tuple_(b.c.channel, b.c.version).in_(older[start : start + _BATCH])
                )
            )
            stored.update((r.channel, r.version) for r in found)

        def row(channel: str, version: str) -> dict[str, Any]:
            kind, blob = values.dump(channel)
            return {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "channel": channel,
                "version": version,
                "type": kind,
                "blob": blob,
            }

        unstored = [(ch, v) for ch, v in older if (ch, v) not in stored]
        if fresh or unstored:  # one statement for both
            await conn.execute(self._sql.put_blob, [row(ch, v) for ch, v in fresh + unstored])

    def _remember(self, key: tuple[Any, str], kept: int) -> None:
        """How many checkpoints a namespace's last prune kept (the next looks past it
        and a tenth of the limit): in this process, for the most recent namespaces."""
        self._kept.pop(key, None)
        self._kept[key] = kept
        while len(self._kept) > _REMEMBERED:
            self._kept.popitem(last=False)

    async def _prune_namespace(
        self, conn: Any, thread_id: Any, ns: str, newest: int, *, branches: bool = True
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
            for start in range(0, len(heads), _BATCH):
                found = await conn.execute(
                    select(w.c.checkpoint_id)
                    .where(
                        w.c.thread_id == thread_id,
                        w.c.checkpoint_ns == ns,
                        w.c.checkpoint_id.in_(heads[start : start + _BATCH]),
                        w.c.channel == INTERRUPT,
                    )
                    .distinct()
                )
                waiting.extend(found.scalars())
        keep = needed(rows, newest, waiting)
        doomed = [r.checkpoint_id for r in rows if r.checkpoint_id not in keep]
        await self._delete(conn, thread_id, ns, doomed)
        if ns == "" and doomed and branches:  # aprune keeps each namespace's newest
            await self._prune_subgraph_runs(conn, thread_id, keep)
        return len(keep), len(doomed)

    async def _delete(self, conn: Any, thread_id: Any, ns: str, doomed: list[str]) -> None:
        """Delete these checkpoints of a namespace, with their writes and the values no
        checkpoint left names."""
        c, w = self._store.tables.lg_checkpoints, self._store.tables.lg_writes
        for start in range(0, len(doomed), _BATCH):
            batch = doomed[start : start + _BATCH]
            for table in (w, c):
                await conn.execute(
                    delete(table).where(
                        table.c.thread_id == thread_id,
                        table.c.checkpoint_ns == ns,
                        table.c.checkpoint_id.in_(batch),
                    )
                )
        if doomed:
            await self._collect(conn, thread_id, ns)

    async def _collect(self, conn: Any, thread_id: Any, ns: str) -> None:
        """Delete the values of a namespace that no checkpoint of it names any more."""
        c, b = self._store.tables.lg_checkpoints, self._store.tables.lg_blobs
        named: set[tuple[str, str]] = set()
        versions = select(c.c.versions).where(
            c.c.thread_id == thread_id, c.c.checkpoint_ns == ns, c.c.versions.is_not(None)
        )
        for text in (await conn.execute(versions)).scalars():
            named.update(decode(text).items())
        here = (b.c.thread_id == thread_id, b.c.checkpoint_ns == ns)
        stored = await conn.execute(select(b.c.channel, b.c.version).where(*here))
        doomed = sorted({(r.channel, r.version) for r in stored} - named)
        for start in range(0, len(doomed), _BATCH):
            batch = doomed[start : start + _BATCH]
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
            under = {_root_of(r.metadata) for r in members}
            # Older than every root checkpoint kept: a run under a root checkpoint
            # whose own put has not landed yet (puts run concurrently) stays.
            if None not in under and max(under) < min(roots):
                await self._delete(conn, thread_id, ns, [r.checkpoint_id for r in members])
                self._kept.pop((thread_id, ns), None)

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
        w = self._store.tables.lg_writes
        now = self._store.now()
        unique: dict[tuple[Any, int], dict[str, Any]] = {}
        for row in rows:  # within the call too: the first write, or the latest special one
            if row["idx"] < 0:
                unique[(row["task_id"], row["idx"])] = row
            else:
                unique.setdefault((row["task_id"], row["idx"]), row)
        rows = list(unique.values())
        here = (w.c.thread_id == ids.thread_id, w.c.checkpoint_ns == ns)
        keep_first = self._store.backend.insert_ignore(
            w, "thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"
        )
        async with self._store.write(ids.thread_id) as (conn, locked):
            self._same_life(config, ids, locked, checkpoint_id)
            await self._store.claim_thread(conn, ids, locked, now)
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

    async def rows(
        self,
        config: dict[str, Any],
        ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None,
        metadata: dict[str, Any] | None = None,
        among: list[str] | None = None,
        channels: Iterable[str] | None = None,
    ) -> list[tuple[Any, list[Any], dict[str, tuple[str, bytes]]]]:
        """Checkpoints newest first (with their writes, and the values they name in
        ``lg_blobs``: ``{channel: (type, blob)}``), narrowed as asked.

        A config without a thread lists every thread the caller may see: the user's
        while isolation applies, every thread otherwise. ``metadata`` keeps the
        checkpoints whose metadata has those top-level values: narrowed in SQL by
        each pair's JSON text (for keys and values whose text is plain), then checked
        exactly; writes are read only for the checkpoints returned (values only of
        ``channels``, when given). ``among`` keeps
        those checkpoint ids only.
        """
        store = self._store
        c, w = store.tables.lg_checkpoints, store.tables.lg_writes
        ids = store.ids(config, need_thread=False)
        one_thread = ids.thread_id is not None
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
        if among is not None:
            stmt = stmt.where(c.c.checkpoint_id.in_(among))
        if before is not None:
            stmt = stmt.where(c.c.checkpoint_id < before)
        for name, value in (metadata or {}).items():
            fragment = _json_pair(name, value)
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
                rows = [r for r in rows if _has_metadata(r.metadata, metadata)][:limit]
            writes: dict[tuple[Any, str, str], list[Any]] = {
                (r.thread_id, r.checkpoint_ns, r.checkpoint_id): [] for r in rows
            }
            # One query per batch of checkpoints, not one per checkpoint.
            for start in range(0, len(rows), _BATCH):
                batch = rows[start : start + _BATCH]
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
                    .order_by(w.c.task_path, w.c.task_id, w.c.idx)
                )
                for write in found:
                    key = (write.thread_id, write.checkpoint_ns, write.checkpoint_id)
                    if key in writes:
                        writes[key].append(write)
            values = await self._values(conn, rows, None if channels is None else set(channels))
        return [
            (
                row,
                writes[(row.thread_id, row.checkpoint_ns, row.checkpoint_id)],
                values.get((row.thread_id, row.checkpoint_ns, row.checkpoint_id), {}),
            )
            for row in rows
        ]

    async def _values(
        self, conn: Any, rows: Sequence[Any], channels: set[str] | None = None
    ) -> dict[tuple[Any, str, str], dict[str, tuple[str, bytes]]]:
        """The ``lg_blobs`` values of these checkpoints: ``{channel: (type, blob)}``
        each, read in one query per namespace and batch of versions (a version shared
        by many checkpoints is read once)."""
        b = self._store.tables.lg_blobs
        wanted: dict[tuple[Any, str], set[tuple[str, str]]] = {}
        named: list[tuple[Any, dict[str, str]]] = []
        for row in rows:
            if row.versions is None:  # its values are inline (written before 0005)
                continue
            versions = decode(row.versions)
            if channels is not None:
                versions = {ch: v for ch, v in versions.items() if ch in channels}
            named.append((row, versions))
            wanted.setdefault((row.thread_id, row.checkpoint_ns), set()).update(versions.items())
        found: dict[tuple[Any, str, str, str], tuple[str, bytes]] = {}
        for (thread_id, ns), pairs in wanted.items():
            ordered = sorted(pairs)
            for start in range(0, len(ordered), _BATCH):
                stmt = select(b.c.channel, b.c.version, b.c.type, b.c.blob).where(
                    b.c.thread_id == thread_id,
                    b.c.checkpoint_ns == ns,
                    tuple_(b.c.channel, b.c.version).in_(ordered[start : start + _BATCH]),
                )
                for blob in await conn.execute(stmt):
                    key = (thread_id, ns, blob.channel, blob.version)
                    found[key] = (blob.type, bytes(blob.blob))
        values: dict[tuple[Any, str, str], dict[str, tuple[str, bytes]]] = {}
        for row, versions in named:
            t, ns = row.thread_id, row.checkpoint_ns
            values[(t, ns, row.checkpoint_id)] = {
                channel: found[(t, ns, channel, version)]
                for channel, version in versions.items()
                if (t, ns, channel, version) in found
            }
        return values

    async def ancestors(
        self, config: dict[str, Any], ns: str, checkpoint_id: str | None
    ) -> list[str]:
        """The ids of a checkpoint's ancestors, parent first, in ONE query (a recursive
        walk of the parent links); [] when it is absent or not the caller's."""
        store = self._store
        c = store.tables.lg_checkpoints
        ids = store.ids(config)
        here = and_(c.c.thread_id == store.visible_thread(ids), c.c.checkpoint_ns == ns)
        start = select(c.c.checkpoint_id, c.c.parent_checkpoint_id, literal(0).label("depth"))
        if checkpoint_id is None:
            newest = select(func.max(c.c.checkpoint_id)).where(here).scalar_subquery()
            start = start.where(here, c.c.checkpoint_id == newest)
        else:
            start = start.where(here, c.c.checkpoint_id == checkpoint_id)
        chain = start.cte("chain", recursive=True)
        step = c.alias("step")
        chain = chain.union_all(
            select(step.c.checkpoint_id, step.c.parent_checkpoint_id, chain.c.depth + 1).where(
                step.c.thread_id == ids.thread_id,
                step.c.checkpoint_ns == ns,
                step.c.checkpoint_id == chain.c.parent_checkpoint_id,
            )
        )
        rows = await store.read(
            select(chain.c.checkpoint_id).where(chain.c.depth > 0).order_by(chain.c.depth)
        )
        return [row.checkpoint_id for row in rows]

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
        for start in range(0, len(wanted), _BATCH):
            stmt = select(c.c.thread_id, c.c.checkpoint_ns, c.c.checkpoint_id).where(
                c.c.run_id.in_(wanted[start : start + _BATCH])
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
                    for table in (w, store.tables.lg_blobs, c):
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
        t = store.tables.threads
        async with store.snapshot() as conn:
            owner = (await conn.execute(select(t.c.user_id).where(store.owned(src)))).first()
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
        async with store.write(dst.thread_id) as (conn, locked):
            await store.claim_thread(conn, ids, locked, store.now())
            for table in (w, b, c):
                await conn.execute(delete(table).where(table.c.thread_id == dst.thread_id))
            for table in (c, w, b):
                if rows[table]:
                    await conn.execute(
                        insert(table), [{**r, "thread_id": dst.thread_id} for r in rows[table]]
                    )
