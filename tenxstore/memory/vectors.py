"""Vectors of memories: embedded before a write, stored in its transaction, searched
exactly in numpy over a cached matrix (or by pgvector's HNSW where it is enabled).

A memory's vector is ``dims`` float32 numbers (little-endian bytes in
``memory_vectors.vector``) with the embedding's ``model_id`` and ``dims``; a store
searches only the vectors of its own model, and one opened with another model than
the vectors already stored raises :class:`~tenxstore.errors.ConfigError` until
:meth:`~tenxstore.MemoryStore.areembed` has redone them.

Exact search reads the vectors of one (user, namespace prefix) once per process into
a matrix (rows normalised: cosine similarity is one matrix-vector product), kept in a
bounded LRU cache (:data:`CACHE`, :mod:`tenxstore.memory.matrix`). Every write to a
(user, namespace) writes a new revision (a random stamp) into its row of
``memory_revisions``, in the write's own transaction; a search reads those revisions
in the same snapshot as it would read the matrix, and uses the cached one only when
they are the ones it was built at — so no process ever searches a stale matrix, and
a cached one costs one indexed read of a few rows. When they moved, the matrix is
brought up to date in that snapshot by reading the vectors of only the memories
written since. The expiry of every row is kept in the matrix and applied at each
search.
"""

from __future__ import annotations

import logging
import secrets
from collections import namedtuple
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import (
    delete,
    insert,
    literal_column,
    null,
    select,
    union_all,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Select
from sqlalchemy.sql.selectable import TextualSelect

from ..backends.driver import DriverStatement
from ..backends.pgvector import PgVector, astatus, ensure_index
from ..embeddings import Embedding
from ..errors import EmbeddingError
from ..store import Store
from .matrix import CACHE, Matrix, MatrixCache, another_model, numpy, read_matrix
from .matrix import epoch as _epoch
from .rows import MemoryRows

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["CACHE", "Candidates", "Matrix", "MatrixCache", "Vectors", "numpy"]

log = logging.getLogger(__name__)

RRF_K = 60
"""The constant of reciprocal rank fusion (Cormack et al.): 1 / (K + rank)."""


class Vectors:
    """The vectors of one :class:`~tenxstore.MemoryStore` with an embedding."""

    def __init__(self, store: Store, rows: MemoryRows, embedding: Embedding) -> None:
        self.store, self.rows, self.embedding = store, rows, embedding
        self.model_id, self.dims = embedding.model_id, embedding.dims
        self.t = store.tables.memory_vectors
        self.checked = False
        self.pg: PgVector | None = None  # pgvector's column, when enabled: written
        self.hnsw = False  # and this model's HNSW index, searched (else exact search)
        self._tagged: dict[int, Select[Any]] = {}  # pgvector's statement, in a UNION
        self._driver: dict[int, tuple[DriverStatement, Any]] = {}  # ... and at driver level

    # -- embedding, before any transaction -------------------------------------------

    def as_array(self, found: Any, count: int) -> npt.NDArray[np.float32]:
        """What the embedding returned for ``count`` texts, checked: (count, dims)
        finite float32 numbers."""
        np = numpy()
        what = f"embedding {self.model_id!r}"
        try:
            array = np.asarray(found, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EmbeddingError(
                f"{what} returned something that is not a list of vectors of numbers: {exc}",
                self.model_id,
            ) from None
        if array.shape != (count, self.dims):
            raise EmbeddingError(
                f"{what} returned vectors of shape {array.shape} for {count} text(s), not "
                f"({count}, {self.dims}): its dims is {self.dims}",
                self.model_id,
            )
        if not np.isfinite(array).all():
            raise EmbeddingError(f"{what} returned a NaN or infinite number", self.model_id)
        return array  # type: ignore[no-any-return]

    async def embed(self, texts: list[str]) -> list[bytes]:
        """The stored form of the texts' vectors (float32 little-endian)."""
        if not texts:
            return []
        try:
            found = await self.embedding.aembed_documents(texts)
        except Exception as exc:
            raise EmbeddingError(
                f"embedding {self.model_id!r} raised {type(exc).__name__}: {exc}", self.model_id
            ) from exc
        array = self.as_array(found, len(texts)).astype("<f4", copy=False)
        return [row.tobytes() for row in array]

    async def query(self, text: str) -> npt.NDArray[np.float32]:
        """The unit vector of a query."""
        try:
            found = await self.embedding.aembed_query(text)
        except Exception as exc:
            raise EmbeddingError(
                f"embedding {self.model_id!r} raised {type(exc).__name__}: {exc}", self.model_id
            ) from exc
        vector = self.as_array([found], 1)[0]
        norm = float(numpy().linalg.norm(vector))
        unit: npt.NDArray[np.float32] = vector / norm if norm > 0 else vector
        return unit

    # -- the model of the vectors stored ------------------------------------------------

    async def check_model(self, conn: AsyncConnection | None = None) -> None:
        """The vectors stored are of this model and dims: checked once per store, and
        again (in ``conn``'s snapshot) whenever a search reads a matrix anew, so a
        store whose vectors another process redid with another model says so.

        Raises:
            ConfigError: Some are another model's, or of other dims.
        """
        if self.checked and conn is None:
            return
        t, m = self.t, self.rows.m
        stmt = (
            select(t.c.model_id, t.c.dims)
            .select_from(t.join(m, m.c.id == t.c.memory_id))
            .where((t.c.model_id != self.model_id) | (t.c.dims != self.dims))
            .where(self.rows.live(self.store.now()))  # an expired memory's never counts
            .limit(1)
        )
        other = (await conn.execute(stmt)).all() if conn else await self.store.read(stmt)
        if other:
            found = other[0]
            raise another_model(found.model_id, found.dims, self.model_id, self.dims)
        if not self.checked:
            await self.detect()
        self.checked = True

    async def detect(self) -> None:
        """On PostgreSQL: whether the schema has pgvector's column (``tenxstore
        memories enable-pgvector``) and the server iterative scans; if so, this
        model's HNSW index is made if missing, and searches use it."""
        backend = self.store.backend
        if not backend.vector_extension:
            return
        async with backend.connect() as conn, conn.begin():
            status = await astatus(conn, self.store.schema)
            if not (status.enabled and status.iterative):
                return
            assert status.extension_schema is not None
            pg = PgVector(self.store.schema, status.extension_schema)
            self.pg = pg  # the column is written with every vector, index or not
            try:
                async with conn.begin_nested():
                    self.hnsw = await ensure_index(conn, pg, self.model_id, self.dims)
            except DBAPIError as exc:  # a role that does not own the table
                log.warning(
                    "pgvector: the HNSW index of embedding %r (%d dims) is missing and "
                    "could not be made (%s): searching exactly; run `tenxstore memories "
                    "enable-pgvector` as the tables' owner to make it",
                    self.model_id,
                    self.dims,
                    str(exc.orig).strip().splitlines()[0] if exc.orig else exc,
                )
                self.hnsw = False

    # -- the steps of a write (in its transaction) ---------------------------------------

    async def write(self, conn: AsyncConnection, memory_id: int, vector: bytes) -> None:
        """The memory's vector is ``vector`` (its old one replaced)."""
        t = self.t
        await conn.execute(delete(t).where(t.c.memory_id == memory_id))
        await self.write_new(conn, [(memory_id, vector)])

    async def write_new(self, conn: AsyncConnection, pairs: Sequence[tuple[int, bytes]]) -> None:
        """The vectors of memories just made (none to replace): ``(memory_id, vector)``
        pairs in one ``executemany``, each stamped ``written`` anew (see
        :mod:`tenxstore.memory.matrix`)."""
        if self.pg is not None:  # with the column, in the same insert (see PgVector.insert)
            np = numpy()
            rows = [(i, v, np.frombuffer(v, dtype="<f4").tolist()) for i, v in pairs]
            await self.pg.insert_many(conn, self.model_id, rows)
            return
        await conn.execute(
            insert(self.t),
            [
                {
                    "memory_id": i,
                    "model_id": self.model_id,
                    "dims": self.dims,
                    "vector": v,
                    "written": secrets.randbits(62),
                }
                for i, v in pairs
            ],
        )

    # -- exact search ------------------------------------------------------------------

    def _scope(self, users: Any, namespace: str | None) -> list[Any]:
        m = self.rows.m
        clauses: list[Any] = []
        if users is not None:
            clauses.append(m.c.user_id == users)
        if namespace:
            clauses.append(self.rows.within(namespace))
        return clauses

    async def revisions(self, conn: AsyncConnection, users: Any, namespace: str | None) -> Any:
        """The revisions of the scope's (user, namespace) rows, as one comparable value."""
        r = self.rows.r
        clauses = self.rows.revision_scope(users, namespace)
        found = await conn.execute(select(r.c.user_id, r.c.namespace, r.c.revision).where(*clauses))
        return frozenset((str(u), ns, int(rev)) for u, ns, rev in found)

    async def matrix(self, conn: AsyncConnection, users: Any, namespace: str | None) -> Matrix:
        """The scope's matrix, from the cache when it is current, else brought up to
        date in ``conn``'s snapshot (see :mod:`tenxstore.memory.matrix`)."""
        key = (self.store.store_id, repr(users), namespace or "", self.model_id, self.dims)
        revisions = await self.revisions(conn, users, namespace)
        cached = CACHE.get(key, revisions)
        if cached is not None:
            return cached
        if not self.checked:
            await self.check_model()
        scope = self._scope(users, namespace)
        built = await read_matrix(self, conn, scope, self.store.now(), CACHE.stale(key))
        CACHE.put(key, revisions, built)
        return built

    @property
    def indexed(self) -> bool:
        """Whether searches go through pgvector's HNSW index (:meth:`search_indexed`)."""
        return self.pg is not None and self.hnsw

    async def nearest(
        self,
        conn: AsyncConnection,
        users: Any,
        namespace: str | None,
        query: npt.NDArray[np.float32],
        count: int,
        now: datetime,
    ) -> list[tuple[int, float]]:
        """Exact search: the ``count`` memories closest to ``query`` (unit), not expired
        at ``now``, by the scope's matrix: (memory id, cosine similarity), closest
        first."""
        np = numpy()
        found = await self.matrix(conn, users, namespace)
        if not len(found.ids) or count <= 0:
            return []
        # einsum, not ``@``: numpy's BLAS splits a matrix-vector product over threads
        # that then spin; einsum's one-thread loop is 4-5x faster at 10,000 rows and
        # costs a fifth of the CPU (measured beside ``@`` on 2 cores, see CHANGELOG)
        sims = np.einsum("ij,j->i", found.rows, query)
        alive = found.expires > now.timestamp()
        sims = np.where(alive, sims, -np.inf)
        live = int(alive.sum())
        count = min(count, live)
        if count <= 0:
            return []
        if count < len(sims):
            top = np.argpartition(-sims, count - 1)[:count]
        else:
            top = np.arange(len(sims))
        # closest first; among equals the most recently made (a larger id)
        order = top[np.lexsort((-found.ids[top], -sims[top]))]
        return [(int(found.ids[i]), float(sims[i])) for i in order]

    async def search_indexed(
        self,
        users: Any,
        namespace: str | None,
        query: npt.NDArray[np.float32],
        count: int,
        now: datetime,
        by_words: Select[Any] | None = None,
    ) -> Candidates:
        """The ``count`` memories closest to ``query`` by pgvector's HNSW index,
        pre-filtered by user, namespace and expiry (see
        :mod:`tenxstore.backends.pgvector`), with their rows, and the keyword
        candidates ``by_words`` (a ranked ``SELECT memories.*, score``) beside them:
        ONE statement, in autocommit (one snapshot). Not ``right`` when exact search
        must answer instead: the scope has rows without the ``vector`` column
        (written by a process started before ``enable-pgvector``), or the index scan
        stopped (``hnsw.max_scan_tuples``) before finding ``count`` of the scope's."""
        assert self.pg is not None
        where = ["(m.expires_at IS NULL OR m.expires_at > :v_now)"]
        params: dict[str, Any] = {"v_now": now}
        if users is not None:
            where.append("m.user_id = :v_user")
            params["v_user"] = users
        if namespace:
            where.append("(m.namespace = :v_ns OR substr(m.namespace, 1, :v_n) = :v_under)")
            params.update(v_ns=namespace, v_n=len(namespace) + 1, v_under=namespace + ".")
        m = self.rows.m
        near: Any = self.pg.search(self.model_id, self.dims, " AND ".join(where), list(m.c))
        params.update(self.pg.arguments(query.tolist(), count))
        if by_words is None:
            found, right = self.pg.answer(await self._read(near, params), count)
            return Candidates(found, [], right)
        tagged = self._tagged.get(id(near))
        if tagged is None:  # made once per statement: its columns are many
            vec = near.subquery("near")
            tagged = select(literal_column("0").label("kind"), *vec.c, null().label("score"))
            self._tagged[id(near)] = tagged
        words = by_words.subquery("words")
        stmt = union_all(
            tagged,
            select(
                literal_column("1"),
                null(),
                null(),
                *(words.c[c.name] for c in m.c),
                null(),
                words.c.score,
            ),
        )
        rows = await self.store.read(stmt, params)
        found, right = self.pg.answer([r for r in rows if r.kind == 0], count)
        # the keyword ranking's order (its ORDER BY does not hold across the union)
        ranked = sorted(
            (r for r in rows if r.kind == 1),
            key=lambda r: (-float(r.score or 0.0), -_epoch(r.updated_at), -r.id),
        )
        return Candidates(found, ranked, right)

    async def _read(self, stmt: TextualSelect, params: dict[str, Any]) -> list[Any]:
        """The rows of a statement of :mod:`tenxstore.backends.pgvector`: at driver level
        where the backend runs statements so (one prepared statement on a borrowed
        asyncpg connection, no SQLAlchemy execution), rows with their columns as
        attributes; else one read."""
        backend = self.store.backend
        if not backend.one_statement_writes:
            return await self.store.read(stmt, params)
        compiled = self._driver.get(id(stmt))
        if compiled is None:
            names = [c.name for c in stmt.selected_columns]
            compiled = (DriverStatement(stmt, backend.engine.dialect), namedtuple("Found", names))
            self._driver[id(stmt)] = compiled
        statement, row = compiled
        records = await backend.run_statement(statement, params, write=False, many=True)
        return [row(*r) for r in records]


class Candidates(NamedTuple):
    """What :meth:`Vectors.search_indexed` found: the nearest memories' rows with
    their cosine similarity, closest first; the keyword ranking's rows (``distance``
    is their score), best first; and whether they are the answer (else exact search
    must answer)."""

    near: list[tuple[Any, float]]
    by_words: list[Any]
    right: bool


def fuse(lists: Sequence[Sequence[int]]) -> list[tuple[int, float]]:
    """Reciprocal rank fusion of ranked lists of ids over their union: each id's
    sum of 1 / (K + rank) over the lists it is in, over the most any id can have
    (first in every list), so scores are in (0, 1]; best first (ties: the order of
    the first list it is in, then of the next)."""
    ran = list(lists)
    if not ran:
        return []
    best = len(ran) / (RRF_K + 1)
    scores: dict[int, float] = {}
    first: dict[int, tuple[int, int]] = {}
    for which, ids in enumerate(ran):
        for rank, memory_id in enumerate(ids, start=1):
            scores[memory_id] = scores.get(memory_id, 0.0) + 1.0 / (RRF_K + rank)
            first.setdefault(memory_id, (which, rank))
    ordered = sorted(scores, key=lambda i: (-scores[i], first[i]))
    return [(i, min(1.0, scores[i] / best)) for i in ordered]
