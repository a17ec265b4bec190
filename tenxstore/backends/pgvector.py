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
the column writes it in every vector's insert, and searches in ONE statement
(:meth:`PgVector.search`, in autocommit: one round trip, no transaction of its own)
that sets, local to itself::

    set_config('hnsw.iterative_scan', 'relaxed_order', true)   -- pgvector 0.8+
    set_config('hnsw.ef_search', max(40, k), true)

so that an index scan keeps going until ``k`` rows pass the user/namespace/expiry
filter: another tenant's nearer vectors never fill a top-k. A scope of fewer than
:data:`EXACT_BELOW` memories is compared exactly in the same statement instead. On
pgvector older than 0.8 (no iterative scans) the store keeps to exact search. A
search is answered exactly, too, when the scan stopped (``hnsw.max_scan_tuples``)
with fewer than ``k`` rows while the scope holds more, or when the scope has rows
without the column (written by a process started before enabling; found through
the partial index ``UNFILLED``). The index is looked up in the catalog before it is
made (``CREATE INDEX IF NOT EXISTS`` needs the table's owner even when it exists); a
role that may not make a missing one logs a warning and searches exactly.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Boolean, ColumnClause, Float, column, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.selectable import TextualSelect

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..store import Store

__all__ = [
    "EXACT_BELOW",
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
EXACT_BELOW = 300
"""A scope of fewer live memories than this is searched exactly, in the same statement
(every vector of its memories compared), not through the HNSW index, whose iterative
scan would walk other tenants' vectors to find a few of the scope's."""


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
        self._statements: dict[Any, TextualSelect] = {}

    def vector_type(self, dims: int | None = None) -> str:
        return f"{self.ext}.vector" + ("" if dims is None else f"({dims})")

    def distance(self) -> str:
        return f"OPERATOR({self.ext}.<=>)"

    async def insert(
        self,
        conn: AsyncConnection,
        memory_id: int,
        model_id: str,
        vector: bytes,
        floats: Sequence[float],
    ) -> None:
        """Insert a memory's vector row (``vector``: its float32 bytes, ``floats``: the
        same numbers) with its ``vector`` column, in one statement: a row inserted
        without it and then updated would leave a dead version in the index
        :data:`UNFILLED`, which every search reads until a vacuum."""
        await self.insert_many(conn, model_id, [(memory_id, vector, floats)])

    async def insert_many(
        self,
        conn: AsyncConnection,
        model_id: str,
        rows: Sequence[tuple[int, bytes, Sequence[float]]],
    ) -> None:
        """:meth:`insert` of many rows ``(memory_id, vector, floats)``, one
        ``executemany``."""
        await conn.execute(
            text(
                f"INSERT INTO {self.table} (memory_id, model_id, dims, vector, written, "
                f"embedding) VALUES (:i, :m, :d, :v, :w, CAST(:e AS {self.vector_type()}))"
            ),
            [
                {
                    "i": i,
                    "m": model_id,
                    "d": len(floats),
                    "v": vector,
                    "w": secrets.randbits(62),
                    "e": _text(floats),
                }
                for i, vector, floats in rows
            ],
        )

    def search(
        self, model_id: str, dims: int, where: str, columns: Sequence[ColumnClause[Any]]
    ) -> TextualSelect:
        """ONE statement: the ``:v_k`` nearest memories of the model passing ``where``
        (SQL on ``m``, the memories row, with named parameters), each row's ``columns``
        (of ``memories``) and cosine ``distance``, with the scope's ``live`` count (up
        to ``:v_most``) and whether it has ``unfilled`` rows; one row of NULLs but those
        two when nothing is found. Parameters: :meth:`arguments`.

        Long because it is one statement of four parts, each fenced so that the
        planner runs it one way whatever the tables' statistics say (tables never
        analyzed, as right after a load with autovacuum off, had it walk every
        memory of the user once per candidate of the index: 59 ms at 1,000 in
        EXPLAIN ANALYZE, 0.8 ms once analyzed):

        * ``scope``: the scope's memories counted up to ``:v_most``;
        * ``settings``: ``set_config`` of the iterative scan and ``ef_search``, local
          to the statement's transaction; pgvector reads them when the index scan
          fetches its first row, which is after: the scan is the inner side of a
          lateral join on this one row (no ``SET LOCAL`` and no transaction of its
          own); no row, and no scan, when the scope is small;
        * ``near``: a scope of at least ``:v_small`` memories through the HNSW index,
          each candidate's memories row looked up by its primary key alone (a
          lateral subquery behind ``OFFSET 0``, so neither turned into another join
          nor given the scope's clauses, with which an unanalyzed planner preferred
          the user's index: every candidate walked all of the user's memories), the
          scope applied to the row found; a smaller one exactly, every vector of
          its memories compared (cheaper than an index scan walking other tenants'
          vectors to find a few of its own), each looked up by its primary key too;
        * ``unfilled``: through the partial index :data:`UNFILLED`, empty but for
          rows written by a process started before ``enable-pgvector``.
        """
        key = (model_id, dims, where, tuple(c.name for c in columns))
        found = self._statements.get(key)
        if found is not None:
            return found
        fixed = self.vector_type(dims)
        # model and dims as literals: the planner matches the partial index by them
        model = f"v.model_id = {_literal(model_id)} AND v.dims = {int(dims)}"
        # the query as float4[] (asyncpg's binary array, not a text to parse)
        distance = (
            f"(v.embedding::{fixed}) {self.distance()} CAST(CAST(:v_q AS real[]) AS {fixed}) "
            "AS distance"
        )
        cols = ", ".join(f"m.{_quote(c.name)}" for c in columns)
        sql = (
            "WITH scope AS MATERIALIZED ("
            f"SELECT count(*) AS live FROM (SELECT 1 FROM {self.memories} m WHERE {where} "
            "LIMIT :v_most) AS c"
            "), settings AS MATERIALIZED ("
            "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true) AS scan, "
            "set_config('hnsw.ef_search', :v_ef, true) AS ef "
            "FROM scope WHERE scope.live >= :v_small"
            "), near AS MATERIALIZED ("
            f"SELECT n.* FROM settings, LATERAL (SELECT {cols}, {distance} "
            f"FROM {self.table} v CROSS JOIN LATERAL (SELECT m.* FROM {self.memories} m "
            f"WHERE m.id = v.memory_id OFFSET 0) AS m "
            f"WHERE {model} AND v.embedding IS NOT NULL AND {where} "
            "AND settings.scan IS NOT NULL AND settings.ef IS NOT NULL "
            "ORDER BY distance LIMIT :v_k) AS n "
            "UNION ALL "
            f"SELECT n.* FROM scope, LATERAL (SELECT {cols}, {distance} "
            f"FROM (SELECT m.* FROM {self.memories} m WHERE {where} OFFSET 0) AS m "
            "CROSS JOIN LATERAL (SELECT v.embedding, v.model_id, v.dims "
            f"FROM {self.table} v WHERE v.memory_id = m.id OFFSET 0) AS v "
            f"WHERE {model} AND v.embedding IS NOT NULL AND scope.live < :v_small "
            "ORDER BY distance, m.id DESC LIMIT :v_k) AS n"
            f") SELECT scope.live, EXISTS (SELECT 1 FROM {self.table} v "
            f"WHERE v.embedding IS NULL AND (SELECT ({where}) FROM {self.memories} m "
            "WHERE m.id = v.memory_id)) AS unfilled, near.* "
            "FROM scope LEFT JOIN near ON true"
        )
        found = text(sql).columns(
            column("live", BigInteger()),
            column("unfilled", Boolean()),
            *(column(c.name, c.type) for c in columns),
            column("distance", Float()),
        )
        self._statements[key] = found
        return found

    @staticmethod
    def arguments(query: Sequence[float], count: int) -> dict[str, Any]:
        """The parameters of :meth:`search` but ``where``'s own: ``count`` nearest."""
        return {
            "v_q": list(query),
            "v_k": count,
            "v_ef": str(max(40, min(count, 1000))),
            "v_small": EXACT_BELOW,
            "v_most": max(EXACT_BELOW, count),
        }

    @staticmethod
    def answer(rows: Sequence[Any], count: int) -> tuple[list[tuple[Any, float]], bool]:
        """The rows of :meth:`search` as (row, similarity), closest first (among
        equals the most recently made: a larger id), and whether they are the
        answer: False when exact search must answer instead (the scope has unfilled
        rows, or the index scan stopped, at ``hnsw.max_scan_tuples``, with fewer
        than ``count`` of the scope's while it holds more)."""
        if not rows or rows[0].unfilled:
            return [], False
        found = sorted(
            ((r, 1.0 - float(r.distance)) for r in rows if r.distance is not None),
            key=lambda f: (-f[1], -f[0].id),
        )
        live = int(rows[0].live)
        stopped = live >= EXACT_BELOW and len(found) < count and live > len(found)
        return found, not stopped


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
