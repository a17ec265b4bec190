"""pgvector on PostgreSQL: a ``vector`` column beside the portable float32 bytes, an HNSW
index (cosine) per embedding model and dimensions, and a search pre-filtered by user
and namespace with iterative index scans.

pgvector is not a trusted extension: ``CREATE EXTENSION vector`` needs a superuser
(or the database owner with pgvector 0.8 on PostgreSQL 13+ only if it is marked
trusted, which it is not). So no migration creates it: :func:`aenable` (``tenxstore
memories enable-pgvector``) does, idempotently, then adds the column
``memory_vectors.embedding`` (type ``vector`` without dimensions) filled from the
bytes already stored, and one partial expression index per (model, dims) present::

    CREATE INDEX ix_memory_vectors_hnsw_<hash> ON memory_vectors
      USING hnsw ((embedding::vector(<dims>)) vector_cosine_ops)
      WHERE model_id = '<model>' AND dims = <dims>

HNSW needs fixed dimensions, hence the cast and the predicate (written as literals in
every search, so the planner can match the partial index). A store whose schema has
the column writes it with every vector and searches with::

    SET LOCAL hnsw.iterative_scan = relaxed_order   -- pgvector 0.8+
    SET LOCAL hnsw.ef_search = max(40, k)

so that an index scan keeps going until ``k`` rows pass the user/namespace/expiry
filter: another tenant's nearer vectors never fill a top-k. On pgvector older than 0.8
(no iterative scans) the store keeps to exact search. A search is answered exactly,
too, when the scan stopped (``hnsw.max_scan_tuples``) with fewer than ``k`` rows while
the scope holds more, or when the scope has rows without the column (written by a
process started before enabling; found through the partial index ``UNFILLED``). The
index is looked up in the catalog before it is made (``CREATE INDEX IF NOT EXISTS``
needs the table's owner even when it exists); a role that may not make a missing one
logs a warning and searches exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..store import Store

__all__ = [
    "PgVector",
    "Status",
    "aenable",
    "astatus",
    "ensure_index",
    "index_exists",
    "index_name",
]

MIN_ITERATIVE = (0, 8)
UNFILLED = "ix_memory_vectors_unfilled"
"""The partial index of the rows whose ``vector`` column is not written."""
MAX_HNSW_DIMS = 2000
"""pgvector's HNSW index takes vectors of at most this many dimensions."""


@dataclass(frozen=True)
class Status:
    """What a database and a schema have of pgvector."""

    available: str | None  # the version the server could create, or None
    installed: str | None  # the version created in this database, or None
    extension_schema: str | None
    column: bool  # memory_vectors.embedding exists in the store's schema
    superuser: bool

    @property
    def enabled(self) -> bool:
        return self.installed is not None and self.column

    @property
    def iterative(self) -> bool:
        return self.installed is not None and _version(self.installed) >= MIN_ITERATIVE


def _version(text_: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text_.split(".")[:2] if p.isdigit())


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def index_name(model_id: str, dims: int) -> str:
    digest = hashlib.sha256(f"{model_id}\x00{dims}".encode()).hexdigest()[:16]
    return f"ix_memory_vectors_hnsw_{digest}"


async def astatus(conn: AsyncConnection, schema: str | None) -> Status:
    """pgvector here: available, created (in which schema), and the store's column."""
    available = (
        await conn.execute(
            text("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'")
        )
    ).scalar()
    row = (
        await conn.execute(
            text(
                "SELECT e.extversion, n.nspname FROM pg_extension e "
                "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
            )
        )
    ).first()
    column = (
        await conn.execute(
            text(
                "SELECT 1 FROM information_schema.columns WHERE table_name = 'memory_vectors' "
                "AND column_name = 'embedding' AND table_schema = COALESCE(:s, current_schema())"
            ),
            {"s": schema},
        )
    ).scalar()
    superuser = (await conn.execute(text("SELECT current_setting('is_superuser')"))).scalar()
    return Status(
        available=available,
        installed=None if row is None else row[0],
        extension_schema=None if row is None else row[1],
        column=bool(column),
        superuser=superuser == "on",
    )


class PgVector:
    """The statements of one schema's pgvector column (see the module)."""

    def __init__(self, schema: str | None, extension_schema: str) -> None:
        self.table = (f"{_quote(schema)}." if schema else "") + "memory_vectors"
        self.memories = (f"{_quote(schema)}." if schema else "") + "memories"
        self.schema = schema
        self.ext = _quote(extension_schema)

    def vector_type(self, dims: int | None = None) -> str:
        return f"{self.ext}.vector" + ("" if dims is None else f"({dims})")

    def distance(self) -> str:
        return f"OPERATOR({self.ext}.<=>)"

    async def write(self, conn: AsyncConnection, memory_id: int, vector: list[float]) -> None:
        """Set the ``vector`` column of a row just written."""
        await self.write_many(conn, [(memory_id, vector)])

    async def write_many(
        self, conn: AsyncConnection, rows: Sequence[tuple[int, Sequence[float]]]
    ) -> None:
        """Set the ``vector`` column of rows just written (one ``executemany``)."""
        await conn.execute(
            text(
                f"UPDATE {self.table} SET embedding = CAST(:e AS {self.vector_type()}) "
                "WHERE memory_id = :i"
            ),
            [{"e": _text(vector), "i": memory_id} for memory_id, vector in rows],
        )

    async def nearest(
        self,
        conn: AsyncConnection,
        model_id: str,
        dims: int,
        query: list[float],
        where: str,
        params: dict[str, Any],
        count: int,
    ) -> list[tuple[int, float]]:
        """The ``count`` nearest rows of the model passing ``where`` (SQL on ``m``, the
        memories row, and ``v``), by cosine: (memory id, similarity), closest first."""
        await conn.execute(text("SET LOCAL hnsw.iterative_scan = relaxed_order"))
        await conn.execute(text(f"SET LOCAL hnsw.ef_search = {max(40, min(count, 1000))}"))
        fixed = self.vector_type(dims)
        # model and dims as literals: the planner matches the partial index by them
        stmt = text(
            "WITH near AS MATERIALIZED ("
            f"SELECT v.memory_id, (v.embedding::{fixed}) {self.distance()} "
            f"CAST(:q AS {fixed}) AS distance "
            f"FROM {self.table} v JOIN {self.memories} m ON m.id = v.memory_id "
            f"WHERE v.model_id = {_literal(model_id)} AND v.dims = {int(dims)} "
            f"AND v.embedding IS NOT NULL AND {where} "
            "ORDER BY distance LIMIT :k"
            ") SELECT memory_id, distance FROM near ORDER BY distance, memory_id DESC"
        )
        found = await conn.execute(stmt, {**params, "q": _text(query), "k": count})
        return [(int(r.memory_id), 1.0 - float(r.distance)) for r in found]

    async def unfilled(
        self, conn: AsyncConnection, model_id: str, dims: int, where: str, params: dict[str, Any]
    ) -> bool:
        """Whether a row of the model passing ``where`` has no ``vector`` column (written
        by a process started before ``enable-pgvector``): the index cannot find it."""
        stmt = text(
            f"SELECT EXISTS (SELECT 1 FROM {self.table} v JOIN {self.memories} m "
            f"ON m.id = v.memory_id WHERE v.model_id = {_literal(model_id)} "
            f"AND v.dims = {int(dims)} AND v.embedding IS NULL AND {where})"
        )
        return bool((await conn.execute(stmt, params)).scalar())

    async def live(
        self,
        conn: AsyncConnection,
        model_id: str,
        dims: int,
        where: str,
        params: dict[str, Any],
        most: int,
    ) -> int:
        """How many rows of the model pass ``where`` (counted up to ``most``)."""
        stmt = text(
            f"SELECT count(*) FROM (SELECT 1 FROM {self.table} v JOIN {self.memories} m "
            f"ON m.id = v.memory_id WHERE v.model_id = {_literal(model_id)} "
            f"AND v.dims = {int(dims)} AND {where} LIMIT :most) AS live"
        )
        return int((await conn.execute(stmt, {**params, "most": most})).scalar() or 0)


def _text(vector: Any) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


async def index_exists(conn: AsyncConnection, pg: PgVector, name: str) -> bool:
    """Whether the schema has the index ``name`` (read from the catalog, which any
    role may read)."""
    found = await conn.execute(
        text(
            "SELECT 1 FROM pg_indexes WHERE indexname = :n "
            "AND schemaname = COALESCE(:s, current_schema())"
        ),
        {"n": name, "s": pg.schema},
    )
    return found.first() is not None


async def ensure_index(conn: AsyncConnection, pg: PgVector, model_id: str, dims: int) -> bool:
    """The HNSW index of one model and dims (made if missing; False when the dims are
    more than HNSW takes, and exact search serves that model)."""
    if dims > MAX_HNSW_DIMS:
        return False
    name = index_name(model_id, dims)
    if await index_exists(conn, pg, name):
        # looked up first: CREATE INDEX IF NOT EXISTS needs the table's owner even
        # when the index exists, and an application role seldom owns the tables
        return True
    on = pg.table
    await conn.execute(
        text(
            f"CREATE INDEX IF NOT EXISTS {name} ON {on} USING hnsw "
            f"((embedding::{pg.vector_type(dims)}) {pg.ext}.vector_cosine_ops) "
            f"WHERE model_id = {_literal(model_id)} AND dims = {int(dims)}"
        )
    )
    return True


async def aenable(conn: AsyncConnection, schema: str | None) -> tuple[Status, list[str]]:
    """Create the extension (if missing), the column (filled from the stored bytes) and
    one index per (model, dims) stored; idempotent. The status after, and the indexes.

    Raises:
        ConfigError: pgvector is not installed on the server, or the extension is
            missing and this role may not create it (not a superuser).
    """
    found = await _with_extension(conn, schema)
    assert found.extension_schema is not None
    pg = PgVector(schema, found.extension_schema)
    if not found.column:
        await conn.execute(
            text(f"ALTER TABLE {pg.table} ADD COLUMN IF NOT EXISTS embedding {pg.vector_type()}")
        )
    # the rows without the column (written by a process started before this), which
    # every HNSW search looks for: a partial index, empty but for those
    await conn.execute(
        text(
            f"CREATE INDEX IF NOT EXISTS {UNFILLED} ON {pg.table} (memory_id) "
            "WHERE embedding IS NULL"
        )
    )
    pairs = (await conn.execute(text(f"SELECT DISTINCT model_id, dims FROM {pg.table}"))).all()
    await _fill(conn, pg)
    indexes = []
    for model_id, dims in pairs:
        if await ensure_index(conn, pg, model_id, dims):
            indexes.append(index_name(model_id, dims))
    return await astatus(conn, schema), indexes


async def _with_extension(conn: AsyncConnection, schema: str | None) -> Status:
    """The status, after creating the extension when it is missing.

    Raises:
        ConfigError: pgvector is not installed on the server, or the extension is
            missing and this role may not create it (not a superuser).
    """
    found = await astatus(conn, schema)
    if found.installed is None:
        if found.available is None:
            raise ConfigError(
                "pgvector is not installed on this PostgreSQL server (no 'vector' in "
                "pg_available_extensions): install it (a package such as "
                "postgresql-15-pgvector, or from source), then run this again"
            )
        if not found.superuser:
            raise ConfigError(
                "the 'vector' extension is not created in this database, and creating it "
                "needs a superuser (pgvector is not a trusted extension): run `CREATE "
                "EXTENSION vector` as one, then this again"
            )
        await conn.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
        found = await astatus(conn, schema)
    return found


async def _fill(conn: AsyncConnection, pg: PgVector) -> None:
    """Fill the column of the rows without it from the float32 bytes (little-endian), a
    thousand rows a statement."""
    rows = (
        await conn.execute(
            text(f"SELECT memory_id, vector FROM {pg.table} WHERE embedding IS NULL")
        )
    ).all()
    import numpy

    fill = text(
        f"UPDATE {pg.table} SET embedding = CAST(:e AS {pg.vector_type()}) WHERE memory_id = :i"
    )
    for start in range(0, len(rows), 1000):  # one executemany a thousand rows
        params = [
            {"e": _text(numpy.frombuffer(blob, dtype="<f4")), "i": memory_id}
            for memory_id, blob in rows[start : start + 1000]
        ]
        await conn.execute(fill, params)


async def doctor_line(store: Store) -> str | None:
    """What ``doctor`` says of pgvector (None: not PostgreSQL)."""
    if not store.backend.vector_extension:
        return None
    async with store.backend.connect() as conn, conn.begin():
        status = await astatus(conn, store.schema)
    if status.enabled:
        how = (
            "HNSW search"
            if status.iterative
            else (
                f"exact search: pgvector before {'.'.join(map(str, MIN_ITERATIVE))} has no "
                "iterative scans"
            )
        )
        return f"pgvector  {status.installed}, enabled ({how})"
    if status.installed:
        return (
            f"pgvector  {status.installed} in the database, not enabled for the memories "
            "(exact search): run `tenxstore memories enable-pgvector`"
        )
    if status.available:
        who = "" if status.superuser else " as a superuser (pgvector is not trusted)"
        return (
            f"pgvector  {status.available} available on the server, not created (exact "
            f"search): run `tenxstore memories enable-pgvector`{who}"
        )
    return "pgvector  not installed on the server (exact search)"
