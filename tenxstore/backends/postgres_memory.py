"""PostgreSQL's one-statement memory put and get, each ONE statement run at driver level
(:meth:`PostgresBackend.run_statement`: prepared once per connection, autocommit).

The portable, locked path is :mod:`tenxstore.memory.writes`; the memory store asks the
backend for these (:meth:`~tenxstore.backends.base.Backend.memory_fast_path`) and
takes them when they are there. What a put commits is said on
:class:`~.records.MemoryPut`; how one statement does it safely, on :class:`OneStatement`.
"""

from __future__ import annotations

import collections
import struct
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    CTE,
    Boolean,
    Integer,
    String,
    and_,
    bindparam,
    cast,
    column,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    table,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, REAL
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Select
from sqlalchemy.types import UserDefinedType

from .driver import DriverStatement, RowDecoder
from .records import MemoryPut, MemoryRecord, PutOutcome

if TYPE_CHECKING:
    from ..models import Tables
    from ..store import Store

__all__ = ["OneStatement"]


class OneStatement:
    """A memory's put and get, each ONE statement (PostgreSQL in session mode).

    The put locks the memory's row (``FOR UPDATE``) and writes only when what its
    snapshot read is still what is there: the row it locked is the version its
    snapshot saw, and its scope's revision (which every write to the scope sets anew,
    in its transaction) is the one the snapshot saw, compared as the revision's row is
    locked by its upsert. Else a writer committed meanwhile — and what this one
    statement reads of the memory's history and vector could be stale — so it writes
    nothing and the locked path does the work. Locks are taken as the locked path takes
    them: the memory's row (or, for a new memory, its key), then the revision's.
    """

    def __init__(self, store: Store) -> None:
        backend = store.backend
        self._backend = backend
        self._tables = store.tables
        self._dialect = backend.engine.dialect
        self._get, self._decode = statements(self._tables, self._dialect, None)[1:]

    @property
    def available(self) -> bool:
        """Whether statements run at driver level now."""
        return self._backend.one_statement_writes

    async def put(self, put: MemoryPut) -> PutOutcome:
        """The put in one statement, or nothing written (see :class:`MemoryPut`)."""
        stmt = statements(self._tables, self._dialect, put.vector_type)[0]
        floats = None
        if put.vector is not None and put.vector_type is not None:
            floats = struct.unpack(f"<{len(put.vector) // 4}f", put.vector)  # float32 LE
        values = {
            "b_user": put.user_id,
            "b_ns": put.namespace,
            "b_key": put.key,
            "b_uid": put.uid,
            "b_sealed": put.sealed,
            "b_make": put.make,
            "b_content": put.content,
            "b_metadata": put.metadata,
            "b_terms": put.terms,
            "b_now": put.now,
            "b_expires": put.expires_at,
            "b_limit": put.history_limit,
            "b_revision": put.revision,
            "b_vector": put.vector,
            "b_model": put.model_id,
            "b_dims": put.dims,
            "b_floats": floats,
        }
        row = await self._backend.run_statement(stmt, values, write=True)
        assert row is not None  # the statement always returns its one row
        if row[0] is not None:
            return PutOutcome(MemoryRecord(*self._decode.values(row)), None)
        found_uid, found_live = row[len(MemoryRecord._fields)], row[-1]
        if put.sealed and found_live and found_uid is not None and found_uid != put.uid:
            return PutOutcome(None, found_uid)
        return PutOutcome(None, None)

    async def get(
        self, user_id: Any, namespace: str, key: str, now: datetime
    ) -> MemoryRecord | None:
        """One prepared SELECT (sent again once on a connection found dead)."""
        values = {"b_user": user_id, "b_ns": namespace, "b_key": key, "b_now": now}
        row = await self._backend.run_statement(self._get, values, write=False)
        return None if row is None else MemoryRecord(*self._decode.values(row))


_Compiled = tuple[DriverStatement, DriverStatement, RowDecoder]
_COMPILED: collections.OrderedDict[tuple[Tables, str, str | None], _Compiled] = (
    collections.OrderedDict()
)
_REMEMBERED = 256  # sets of tables: id types and schemas, as models.tables_for keeps
_LOCK = threading.Lock()


def statements(tables: Tables, dialect: Dialect, vector_type: str | None) -> _Compiled:
    """The put (writing pgvector's column of ``vector_type`` too, when given), the get
    and their rows' decoder, compiled once per process, set of tables and column type
    (keyed by the tables themselves, the least recent forgotten)."""
    key = (tables, dialect.name, vector_type)
    with _LOCK:
        found = _COMPILED.get(key)
        if found is not None:
            _COMPILED.move_to_end(key)
            return found
    sql = _Statements(tables)
    found = (
        DriverStatement(sql.put(vector_type), dialect),
        DriverStatement(sql.get(), dialect),
        RowDecoder(sql.record, dialect),
    )
    with _LOCK:
        _COMPILED[key] = found
        if len(_COMPILED) > _REMEMBERED:
            _COMPILED.popitem(last=False)
    return found


def _one(value: Any) -> Any:
    """The value of a CTE of one row at most, as a scalar subquery: a table's rows are
    then looked up by index whatever a plan cached with stale statistics estimates
    (a join may become a scan of every vector)."""
    return select(value).scalar_subquery()


class _Vector(UserDefinedType[Any]):
    """pgvector's column type, as the schema names it (``"public".vector``)."""

    cache_ok = True

    def __init__(self, name: str) -> None:
        self.name = name

    def get_col_spec(self, **kw: Any) -> str:
        return self.name


class _Statements:
    """The put's parts, each one named CTE, and the get, for one set of tables."""

    def __init__(self, tables: Tables) -> None:
        m = self.m = tables.memories
        self.v, self.vt, self.r = (
            tables.memory_versions,
            tables.memory_vectors,
            tables.memory_revisions,
        )
        self.record = [m.c[name] for name in MemoryRecord._fields]
        self.user = bindparam("b_user", type_=m.c.user_id.type)
        self.ns = bindparam("b_ns", type_=String())
        self.now = bindparam("b_now", type_=m.c.updated_at.type)
        self.limit = bindparam("b_limit", type_=Integer())
        self.key = (
            m.c.user_id == self.user,
            m.c.namespace == self.ns,
            m.c.memory_key == bindparam("b_key", type_=String()),
        )

    def get(self) -> Select[Any]:
        """The memory under the key, unless expired."""
        m = self.m
        live = or_(m.c.expires_at.is_(None), m.c.expires_at > self.now)
        return select(*self.record).where(*self.key, live)

    def put(self, vector_type: str | None) -> Select[Any]:
        """The whole put: one row, the memory as written (its id NULL when nothing
        was), the uid of the memory found, and whether it was live."""
        m = self.m
        locked = select(*m.c).where(*self.key).with_for_update().cte("locked")
        seen = select(m.c.id, m.c.version).where(*self.key).cte("seen")  # no lock: the snapshot's
        cur = self.current(locked, seen)
        ins = self.made(locked, seen)
        rev = self.revision(cur, ins)
        written = union_all(select(*self.next_version(cur, rev).c), select(*ins.c)).cte("written")
        found_live = or_(locked.c.expires_at.is_(None), locked.c.expires_at > self.now)
        one = select(literal(1).label("one")).subquery("one")
        return (
            select(
                *(written.c[c.name] for c in self.record),
                locked.c.uid.label("found_uid"),
                found_live.label("found_live"),
            )
            .select_from(one.outerjoin(written, true()).outerjoin(locked, true()))
            .add_cte(self.history(cur, rev))
            .add_cte(self.pruned(cur, rev))
            .add_cte(self.vector(written, vector_type))
        )

    def current(self, locked: CTE, seen: CTE) -> CTE:
        """``cur``: the locked row when it is live, the version the snapshot saw (no
        writer committed it meanwhile) and, sealed, of the uid the values are for."""
        sealed = bindparam("b_sealed", type_=Boolean())
        return (
            select(*locked.c)
            .select_from(
                locked.join(
                    seen, and_(seen.c.id == locked.c.id, seen.c.version == locked.c.version)
                )
            )
            .where(
                or_(locked.c.expires_at.is_(None), locked.c.expires_at > self.now),
                or_(sealed.is_(False), locked.c.uid == bindparam("b_uid", type_=String())),
            )
            .cte("cur")
        )

    def made(self, locked: CTE, seen: CTE) -> CTE:
        """``ins``: version 1, when no memory is under the key and one may be made (one
        another writer made meanwhile is a conflict: nothing is inserted)."""
        m = self.m
        values = select(
            bindparam("b_uid", type_=String()),
            self.user,
            self.ns,
            bindparam("b_key", type_=String()),
            bindparam("b_content", type_=m.c.content.type),
            bindparam("b_metadata", type_=m.c.metadata.type),
            bindparam("b_terms", type_=m.c.terms.type),
            literal(1, m.c.version.type),
            self.now,
            self.now,
            bindparam("b_expires", type_=m.c.expires_at.type),
        ).where(
            bindparam("b_make", type_=Boolean()),
            ~exists(select(locked.c.id)),
            ~exists(select(seen.c.id)),
        )
        names = ["uid", "user_id", "namespace", "memory_key", "content", "metadata", "terms"]
        names += ["version", "created_at", "updated_at", "expires_at"]
        return (
            pg_insert(m)
            .from_select(names, values)
            .on_conflict_do_nothing(index_elements=["user_id", "namespace", "memory_key"])
            .returning(*self.record)
            .cte("ins")
        )

    def revision(self, cur: CTE, ins: CTE) -> CTE:
        """``rev``: the scope's new revision, written once the memory's row (or key) is
        locked; for a next version, only when the revision there is still the one the
        snapshot saw (no write to the scope committed since). The row proposed holds
        that one, for the comparison (``excluded``: the clause names no table)."""
        r = self.r
        snapshot = select(r.c.revision).where(r.c.user_id == self.user, r.c.namespace == self.ns)
        stamp = bindparam("b_revision", type_=r.c.revision.type)
        proposed = func.coalesce(snapshot.scalar_subquery(), stamp)
        wrote = union_all(select(cur.c.id), select(ins.c.id)).subquery("wrote")
        stmt = pg_insert(r).from_select(
            ["user_id", "namespace", "revision"],
            select(self.user, self.ns, proposed).select_from(wrote),
        )
        return (
            stmt.on_conflict_do_update(
                index_elements=["user_id", "namespace"],
                set_={"revision": stamp},
                where=or_(exists(select(ins.c.id)), r.c.revision == stmt.excluded.revision),
            )
            .returning(r.c.revision)
            .cte("rev")
        )

    def next_version(self, cur: CTE, rev: CTE) -> CTE:
        """``upd``: the memory's next version (``created_at`` kept)."""
        m = self.m
        return (
            update(m)
            .where(m.c.id == _one(cur.c.id), exists(select(rev.c.revision)))
            .values(
                content=bindparam("b_content", type_=m.c.content.type),
                metadata=bindparam("b_metadata", type_=m.c.metadata.type),
                terms=bindparam("b_terms", type_=m.c.terms.type),
                version=_one(cur.c.version) + 1,
                updated_at=self.now,
                expires_at=bindparam("b_expires", type_=m.c.expires_at.type),
            )
            .returning(*self.record)
            .cte("upd")
        )

    def history(self, cur: CTE, rev: CTE) -> CTE:
        """``hist``: the version replaced, as it was, when past versions are kept."""
        v = self.v
        names = ["memory_id", "version", "uid", "content", "metadata", "updated_at", "expires_at"]
        old = select(*(cur.c[n if n != "memory_id" else "id"] for n in names))
        old = old.where(exists(select(rev.c.revision)), self.limit > 1)
        return insert(v).from_select(names, old).cte("hist")

    def pruned(self, cur: CTE, rev: CTE) -> CTE:
        """``pruned``: the past versions beyond the limit (the current one counts)."""
        v = self.v
        beyond = v.c.version <= _one(cur.c.version) + 1 - self.limit
        return (
            delete(v)
            .where(v.c.memory_id == _one(cur.c.id), beyond, exists(select(rev.c.revision)))
            .cte("pruned")
        )

    def vector(self, written: CTE, vector_type: str | None) -> CTE:
        """``vins``: the old vector deleted (``vdel``, run to its end first) and the
        new one inserted, as the locked path does: a store that does not know of
        pgvector's column (enabled after it looked) leaves it empty, never stale. With
        the column (``vector_type``), an upsert of every column instead (``vups``): an
        unchanged vector is then a HOT update, not a new entry in the HNSW index."""
        vt = self.vt
        blob = bindparam("b_vector", type_=vt.c.vector.type)
        names = ["memory_id", "model_id", "dims", "vector", "written"]
        values: list[Any] = [
            written.c.id,
            bindparam("b_model", type_=vt.c.model_id.type),
            bindparam("b_dims", type_=vt.c.dims.type),
            blob,
            bindparam("b_revision", type_=vt.c.written.type),  # a random stamp
        ]
        ours = vt.c.memory_id == _one(written.c.id)
        if vector_type is not None:
            names.append("embedding")
            values.append(cast(bindparam("b_floats", type_=ARRAY(REAL())), _Vector(vector_type)))
            target = table(vt.name, *(column(n) for n in names), schema=vt.schema)
            upsert = pg_insert(target).from_select(names, select(*values).where(blob.is_not(None)))
            upsert = upsert.on_conflict_do_update(
                index_elements=["memory_id"],
                set_={n: upsert.excluded[n] for n in names[1:]},
            )
            gone = delete(vt).where(ours, blob.is_(None))  # no vector: none kept
            return upsert.add_cte(gone.cte("vdel")).cte("vups")
        gone_cte = delete(vt).where(ours).returning(vt.c.memory_id).cte("vdel")
        deleted_first = select(func.count()).select_from(gone_cte).scalar_subquery() >= 0
        new = select(*values).where(blob.is_not(None), deleted_first)
        return insert(vt).from_select(names, new).cte("vins")
