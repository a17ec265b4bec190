"""What every part of :class:`~tenxstore.langgraph.tables.LangGraphTables` shares: the
limits of the key columns, a put's values, sealing, and the table set's state.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    delete,
)

from ..backends.records import LangGraphFastPath
from ..config import RunIds, recorded_incarnation
from ..crypto import BLOB, KeyRing, Life, check_type, open_typed
from ..deltas import Bases, BlobWrite, Stored, blob_write
from ..serde import decode
from ..store import Store
from .sql import Statements

__all__ = ["KEY", "KeyLimits", "TablesCore", "Values", "needed", "run_id_of"]


BATCH = 500  # checkpoints whose writes are read (or deleted) in one statement
WALK = 256  # ancestors walked per query for a DeltaChannel history
KEY = 255  # the longest channel name and version lg_blobs keys hold
REMEMBERED = 4096  # namespaces whose last prune this process remembers
INTERRUPT = "__interrupt__"  # LangGraph's channel of a pending interrupt
NS_SEP, NS_END = "|", ":"  # LangGraph's namespace separators (subgraph | node:task)


PLAIN = re.compile(r"[A-Za-z0-9 ._:/@+-]*")


def json_pair(key: str, value: Any) -> str | None:
    """``"key":value`` as the stored JSON writes it, escaped for LIKE; None when that
    text is not certain (numbers: ``1``, ``1.0`` and ``true`` are equal in Python; the
    pair is then checked in Python alone)."""
    if not isinstance(key, str) or not PLAIN.fullmatch(key):
        return None
    if value is None:
        text = "null"
    elif type(value) is str and PLAIN.fullmatch(value):
        text = f'"{value}"'
    else:
        return None
    return f'"{key}":{text}'.replace("_", "\\_")


def has_metadata(text: str, wanted: dict[str, Any]) -> bool:
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


def root_of(metadata: str) -> Any:
    """The root namespace's checkpoint a subgraph's checkpoint ran under (LangGraph's
    ``parents`` metadata), or None."""
    parents = decode(metadata).get("parents")
    return parents.get("") if isinstance(parents, dict) else None


@dataclass(frozen=True)
class Values:
    """A checkpoint's channel values as ``put`` stores them.

    ``versions``: the channels' versions (as text), what a reader looks up ("" for
    a None value, kept inline in the checkpoint); ``stored``: the channels whose
    value is kept in ``lg_blobs`` at their version; ``new``: the
    channels LangGraph gave a new version (their values are written, replacing what
    a checkpoint put again stored); ``dump``: a channel's value serialized
    (``(type, bytes)``), called for the new ones and for versions not stored yet.
    """

    versions: dict[str, str]
    stored: frozenset[str]
    new: frozenset[str]
    dump: Callable[[str], tuple[str, bytes]]


@dataclass(frozen=True)
class KeyLimits:
    """The longest strings the LangGraph key columns hold on this database (255
    characters; on MySQL, whose InnoDB keys are at most 3072 bytes, fewer)."""

    namespace: int
    channel: int
    version: int
    task_id: int
    checkpoint_id: int

    @classmethod
    def of(cls, store: Store) -> KeyLimits:
        dialect = store.backend.engine.dialect
        tables = store.tables

        def length(column: Any) -> int:
            found = getattr(column.type.dialect_impl(dialect), "length", None)
            return int(found) if found else KEY

        return cls(
            namespace=min(
                length(t.c.checkpoint_ns) for t in (tables.lg_checkpoints, tables.lg_blobs)
            ),
            channel=length(tables.lg_blobs.c.channel),
            version=length(tables.lg_blobs.c.version),
            task_id=length(tables.lg_writes.c.task_id),
            checkpoint_id=length(tables.lg_checkpoints.c.checkpoint_id),
        )

    def storable(self, channel: str, version: str = "") -> bool:
        """Whether a channel's value at a version can be kept in ``lg_blobs`` (else it
        stays inline in its checkpoint): a name and version the key columns hold, as
        written (no U+0000, which some databases do not keep in text)."""
        return (
            len(channel) <= self.channel
            and len(version) <= self.version
            and "\x00" not in channel
            and "\x00" not in version
        )


class TablesCore:
    """The state and sealing every part of the LangGraph tables shares."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._sql = Statements(store)
        self._histories: dict[tuple[bool, int], tuple[Any, Any]] = {}
        # (thread, namespace) -> checkpoints its last prune kept (in this process)
        self._kept: OrderedDict[tuple[Any, str], int] = OrderedDict()
        # (thread, namespace) -> puts in this process (a count, for the looks)
        self._puts: dict[tuple[Any, str], int] = {}
        # namespaces a one-statement put found due for pruning (the next put prunes)
        self._due: set[tuple[Any, str]] = set()
        # (thread, namespace, channel) -> the value a next version may be a delta of
        self._bases = Bases()
        self._one: LangGraphFastPath | None = None
        self.limits = KeyLimits.of(store)

    def _one_statement(self) -> LangGraphFastPath | None:
        """The backend's one-round-trip paths (one statement on PostgreSQL, one thread
        hop on a SQLite file) while they are available; None otherwise."""
        if self._one is None:
            self._one = self._store.backend.langgraph_fast_path(self._store)
        return self._one if self._one is not None and self._one.available else None

    @property
    def keys(self) -> KeyRing | None:
        """The key ring values are sealed with, or None."""
        return self._store.keys

    def thread_id_of(self, config: dict[str, Any]) -> Any:
        """The thread id of a call, as validated (an int for int id types)."""
        return self._store.ids(config).thread_id

    def _seal(
        self, kind: str, data: bytes, thread_id: Any, column: str, life: Life
    ) -> tuple[str, bytes]:
        """A ``(type, bytes)`` as it is stored: sealed for the thread's ``life`` when a
        key ring is configured (then the type may be 63 characters: the mark of a
        sealed value takes one)."""
        keys = self._store.keys
        check_type(kind, sealed=keys is not None)
        if keys is None:
            return kind, data
        return keys.seal_typed(kind, data, thread_id, column, life)

    def _sealed(
        self, kind: str, data: bytes, thread_id: Any, column: str, name: str, life: Life
    ) -> dict[str, Any]:
        """``{"type": ..., name: ...}`` as stored (see :meth:`_seal`)."""
        kind, data = self._seal(kind, data, thread_id, column, life)
        return {"type": kind, name: data}

    def _stored(self, thread_id: Any, r: Any, data: Any, life: Life) -> Stored:
        """An ``lg_blobs`` row (its bytes ``data``) as a :class:`Stored`, opened for the
        thread's ``life`` (read with it)."""
        kind, blob = open_typed(self._store.keys, r.type, bytes(data), thread_id, BLOB, life)
        return Stored(kind, blob, r.base, r.splice, r.skip, r.uid)

    def _presumed(self, config: dict[str, Any], ids: RunIds) -> Life | None:
        """The life a one-step write seals for before any I/O: the one the run recorded,
        owned by the caller (the step checks both, and writes nothing in another life);
        None when the run recorded none: then a sealed write takes the locked path,
        and seals for the row it locks."""
        life = recorded_incarnation(config)
        return None if life is None else Life(life, ids.user_id)

    def _blob_writes(self, thread_id: Any, ns: str, values: Values | None) -> list[BlobWrite]:
        """The new values of a put, serialized (outside any lock), each as a delta of
        the channel's last value this process knows where it can be."""
        if values is None:
            return []
        return [
            blob_write(ch, v, values.dump(ch), self._bases.get((thread_id, ns, ch)))
            for ch, v in values.versions.items()
            if ch in values.stored and ch in values.new
        ]

    def _learn(self, thread_id: Any, ns: str, written: Iterable[BlobWrite]) -> None:
        """Remember what a committed put wrote: its next versions' bases."""
        for bw in written:
            self._bases.put((thread_id, ns, bw.channel), bw.remembered())

    def _remember(self, key: tuple[Any, str], kept: int) -> None:
        """How many checkpoints a namespace's last prune kept (the next looks past it
        and half the limit): in this process, for the most recent namespaces."""
        self._kept.pop(key, None)
        self._kept[key] = kept
        while len(self._kept) > REMEMBERED:
            self._kept.popitem(last=False)

    async def _unmark(self, conn: Any, thread_id: Any, ns: str) -> None:
        """Take the head mark away in a namespace: the next put takes the locked path."""
        h = self._store.tables.lg_heads
        await conn.execute(delete(h).where(h.c.thread_id == thread_id, h.c.checkpoint_ns == ns))
