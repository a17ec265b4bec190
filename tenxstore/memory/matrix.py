"""The matrices of exact search: one scope's vectors, read once per process, kept in
a bounded LRU cache and brought up to date after a write by reading only what the
write changed.

A matrix holds the vectors of one (user, namespace prefix) and one model: their
memory ids, unit rows (cosine similarity is one matrix-vector product), expiries,
and a stamp of each memory's life and version and of its vector's write (its ``uid``
and ``version``: a memory stored again after a delete has another ``uid``, even
where SQLite reuses its id; the vector's ``written``, a random number each write of
it writes anew: a vector written again at the same version, as ``areembed`` does, is
read again). It is used only at the revisions of ``memory_revisions`` it was read at
(see :mod:`tenxstore.memory.vectors`). When they moved, the search reads, in the
same snapshot, every live memory of the scope's id and stamp — no vector — and then
the vectors of only those memories that are new or of another version: a write to
one memory of 10,000 reads one vector, not 10,000. The rows of memories that are
gone are dropped; every row's expiry is the one just read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import String, cast, func, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import ConfigError
from ..extras import require_extra

if TYPE_CHECKING:
    from .vectors import Vectors

__all__ = ["CACHE", "Matrix", "MatrixCache", "another_model", "epoch", "numpy", "read_matrix"]

CHUNK = 500
"""The ids of one ``IN (...)`` when the vectors of changed memories are read."""
REREAD = 0.25
"""When more than this share of a scope's memories changed, all its vectors are read
in one statement instead of by id."""


def numpy() -> Any:
    """numpy, imported when first needed (``pip install 'tenxstore[vectors]'``)."""
    require_extra("vectors", "numpy", needed_by="search by meaning")
    import numpy

    return numpy


def epoch(when: datetime | None) -> float:
    """``when`` in seconds since the epoch (a naive one is UTC); never is infinity."""
    if when is None:
        return float("inf")
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


class Matrix:
    """The vectors of one scope at one set of revisions: ids, unit rows, expiries,
    and each memory's stamp (its ``uid``, version and vector's ``written``), in id order."""

    __slots__ = ("expires", "ids", "rows", "size", "stamps")

    def __init__(self, ids: Any, rows: Any, expires: Any, stamps: Any) -> None:
        self.ids, self.rows, self.expires, self.stamps = ids, rows, expires, stamps
        self.size = int(ids.nbytes + rows.nbytes + expires.nbytes + stamps.nbytes)


class MatrixCache:
    """A bounded LRU of matrices, shared by the stores of a process (thread-safe).

    Args:
        max_entries: Matrices kept at most.
        max_bytes: Their bytes at most (a matrix larger than this is never kept).
    """

    def __init__(self, max_entries: int = 64, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[Any, tuple[Any, Matrix]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self.vectors_read = 0
        """Vectors read from the database into matrices (a refresh reads the changed)."""

    def get(self, key: Any, revisions: Any) -> Matrix | None:
        """The matrix of ``key`` if it was built at exactly ``revisions``."""
        with self._lock:
            found = self._entries.get(key)
            if found is None or found[0] != revisions:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found[1]

    def stale(self, key: Any) -> Matrix | None:
        """The matrix of ``key`` at whatever revisions it was built (to refresh)."""
        with self._lock:
            found = self._entries.get(key)
            return None if found is None else found[1]

    def put(self, key: Any, revisions: Any, matrix: Matrix) -> None:
        """Keep ``matrix`` as ``key``'s at ``revisions`` (the least used dropped)."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1].size
            if matrix.size > self.max_bytes:
                return
            self._entries[key] = (revisions, matrix)
            self._bytes += matrix.size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped.size

    def clear(self) -> None:
        """Forget every matrix."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


CACHE = MatrixCache()
"""The process's matrices (see the module)."""


async def read_matrix(
    vectors: Vectors,
    conn: AsyncConnection,
    scope: Sequence[Any],
    now: datetime,
    old: Matrix | None,
) -> Matrix:
    """The scope's matrix in ``conn``'s snapshot: ``old`` brought up to date (see the
    module), or read whole when there is none.

    Raises:
        ConfigError: A live memory of the scope has a vector of another model or dims.
    """
    np = numpy()
    m, t = vectors.rows.m, vectors.t
    joined = t.join(m, m.c.id == t.c.memory_id)
    stamp = _stamp(vectors)
    if old is None:
        stmt = select(*_detail(vectors), stamp).select_from(joined).where(*scope)
        every = (await conn.execute(stmt.order_by(t.c.memory_id))).all()
        found = [r for r in every if _one_model(r, vectors, now)]
        CACHE.vectors_read += len(found)
        return Matrix(
            np.fromiter((r.memory_id for r in found), np.int64, len(found)),
            _unit(np, [r.vector for r in found], vectors.dims),
            np.fromiter((epoch(r.expires_at) for r in found), np.float64, len(found)),
            np.fromiter((hash(r.stamp) for r in found), np.int64, len(found)),
        )
    listed = select(t.c.memory_id, stamp).select_from(joined).where(*scope)
    listing = (await conn.execute(listed)).all()
    count = len(listing)
    ids = np.fromiter((r[0] for r in listing), np.int64, count)
    stamps = np.fromiter((hash(r[1]) for r in listing), np.int64, count)
    order = np.argsort(ids, kind="stable")  # sorted here: cheaper than in SQL
    ids, stamps = ids[order], stamps[order]
    # the rows of old that hold the same memory, version, model and expiry
    at = np.minimum(np.searchsorted(old.ids, ids), max(len(old.ids) - 1, 0))
    kept = (old.ids[at] == ids) & (old.stamps[at] == stamps) if len(old.ids) else ids < ids
    fresh = ids[~kept].tolist()
    read = await _details_of(vectors, conn, fresh, len(fresh) > REREAD * count, scope)
    CACHE.vectors_read += len(read)
    rows_of = [read[i] for i in fresh]
    mine = [_one_model(r, vectors, now) for r in rows_of]  # another model's: raises
    use = kept.copy()
    use[~kept] = mine
    rows_of = [r for r, ok in zip(rows_of, mine, strict=True) if ok]
    old_at = at[kept]
    ids, stamps, kept = ids[use], stamps[use], kept[use]
    rows = np.empty((len(ids), vectors.dims), dtype=np.float32)
    expires = np.empty(len(ids), dtype=np.float64)
    rows[kept], expires[kept] = old.rows[old_at], old.expires[old_at]
    if rows_of:
        rows[~kept] = _unit(np, [r.vector for r in rows_of], vectors.dims)
        expires[~kept] = [epoch(r.expires_at) for r in rows_of]
    return Matrix(ids, rows, expires, stamps)


def _stamp(vectors: Vectors) -> Any:
    """A row's stamp, in SQL: its memory's ``uid``, version and expiry and its
    vector's model, dims and ``written`` in one string (a cheap column to read for
    every row)."""
    m, t = vectors.rows.m, vectors.t
    expires = func.coalesce(cast(m.c.expires_at, String), literal(""))
    parts = [
        m.c.uid,
        cast(m.c.version, String),
        t.c.model_id,
        cast(t.c.dims, String),
        cast(t.c.written, String),
        expires,
    ]
    joined = parts[0]
    for part in parts[1:]:
        joined = joined + literal("|") + part
    return joined.label("stamp")


def _detail(vectors: Vectors) -> list[Any]:
    """The columns a matrix is made of (beside the stamp)."""
    m, t = vectors.rows.m, vectors.t
    return [t.c.memory_id, t.c.vector, m.c.expires_at, t.c.model_id, t.c.dims]


def _one_model(row: Any, vectors: Vectors, now: datetime) -> bool:
    """Whether the row read is a vector of the store's model (an expired memory's of
    another is skipped).

    Raises:
        ConfigError: It is a live memory's vector of another model or dims.
    """
    if row.model_id == vectors.model_id and row.dims == vectors.dims:
        return True
    if epoch(row.expires_at) <= now.timestamp():
        return False
    raise another_model(row.model_id, row.dims, vectors.model_id, vectors.dims)


def another_model(found: str, found_dims: int, model_id: str, dims: int) -> ConfigError:
    """The error of a store whose vectors are another model's."""
    return ConfigError(
        f"the database holds vectors of embedding {found!r} ({found_dims} "
        f"dims), and this store's embedding is {model_id!r} ({dims} dims): "
        "vectors of two models are never compared; open the store with that "
        "embedding, or redo the vectors with this one (await store.areembed("
        "embedding), or `tenxstore memories reembed`)"
    )


async def _details_of(
    vectors: Vectors,
    conn: AsyncConnection,
    ids: list[int],
    all_of_scope: bool,
    scope: Sequence[Any],
) -> dict[int, Any]:
    """The matrix's columns of memories ``ids`` by id (read for the whole scope when
    they are many)."""
    m, t = vectors.rows.m, vectors.t
    if not ids:
        return {}
    columns = select(*_detail(vectors)).select_from(t.join(m, m.c.id == t.c.memory_id))
    if all_of_scope:
        return {int(r.memory_id): r for r in await conn.execute(columns.where(*scope))}
    read: dict[int, Any] = {}
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        found = await conn.execute(columns.where(t.c.memory_id.in_(chunk)))
        read.update((int(r.memory_id), r) for r in found)
    return read


def _unit(np: Any, blobs: Sequence[bytes], dims: int) -> Any:
    """The vectors' rows (float32 little-endian bytes), each scaled to length 1."""
    rows = np.frombuffer(b"".join(blobs), dtype="<f4").astype(np.float32)
    rows = rows.reshape(len(blobs), dims)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1.0)
