"""SQLite's one-hop memory put and get: each in ONE thread hop on the file's pysqlite
connection (:class:`~.sqlite_hotpath.HotPath`), a put under the write lock.

The portable, locked path is :mod:`tenxstore.memory.writes`; the memory store asks the
backend for these (:meth:`~tenxstore.backends.base.Backend.memory_fast_path`). What
a put commits is said on :class:`~.records.MemoryPut`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import String, Table, bindparam, delete, insert, or_, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from .driver import DriverStatement, RowDecoder
from .records import MemoryPut, MemoryRecord, PutOutcome

if TYPE_CHECKING:
    from ..models import Tables
    from ..store import Store
    from .sqlite import SqliteBackend

__all__ = ["OneHop"]


def _live(expires: datetime | None, now: datetime) -> bool:
    """Whether a memory expiring at ``expires`` (SQLite's naive UTC) is live at ``now``."""
    if expires is None:
        return True
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=timezone.utc)
    return expires > now


class OneHop:
    """A memory's put and get for a SQLite file, each in ONE thread hop: the put's
    statements run under the write lock (``BEGIN IMMEDIATE``, which serializes every
    writer of the file: what the put reads is what it writes over), committed
    together; the get is one SELECT. The common cases only: otherwise nothing is
    written (the transaction rolls back) and the locked path runs."""

    def __init__(self, backend: SqliteBackend, store: Store) -> None:
        hot = backend.hot_path
        assert hot is not None
        self._backend, self._hot = backend, hot
        dialect = backend.engine.dialect
        m = store.tables.memories
        self._decode = RowDecoder([m.c[name] for name in MemoryRecord._fields], dialect)
        statements = {**_memory_statements(m), **_their_statements(store.tables)}
        self._sql = {name: DriverStatement(stmt, dialect) for name, stmt in statements.items()}

    @property
    def available(self) -> bool:
        """Always, on a file's driver-level path."""
        return True

    async def get(
        self, user_id: Any, namespace: str, key: str, now: datetime
    ) -> MemoryRecord | None:
        """One SELECT in a reader thread."""
        values = {"b_user": user_id, "b_ns": namespace, "b_key": key, "b_now": now}
        row = await self._backend.fetch_in_thread(self._sql["get"], values)
        return None if row is None else MemoryRecord(*self._decode.values(row))

    async def put(self, put: MemoryPut) -> PutOutcome:
        """The put under the write lock in one hop, or nothing written."""
        done = await self._backend.write_in_thread(lambda cursor: self._put(cursor, put))
        return PutOutcome(None, None) if done is None else done

    def _put(self, cursor: Any, p: MemoryPut) -> PutOutcome | None:
        """Under the write lock: the common cases only (None: roll back)."""
        sql, run = self._sql, self._hot.execute
        values: dict[str, Any] = {
            "b_user": p.user_id,
            "b_ns": p.namespace,
            "b_key": p.key,
            "b_uid": p.uid,
            "b_content": p.content,
            "b_metadata": p.metadata,
            "b_terms": p.terms,
            "b_now": p.now,
            "b_expires": p.expires_at,
            "b_version": 1,
        }
        found = run(cursor, sql["find"], values).fetchone()
        if found is None:
            if not p.make:
                return None
            row = run(cursor, sql["make"], values).fetchall()[0]
        else:
            there = MemoryRecord(*self._decode.values(found))
            if not _live(there.expires_at, p.now):
                return None  # an expired memory to replace: the locked path's
            if p.sealed and there.uid != p.uid:
                if p.reseal is None:
                    return PutOutcome(None, there.uid)
                values["b_content"], values["b_metadata"] = p.reseal(there.uid)
            values.update({_ID: there.id, "b_version": there.version + 1})
            if p.history_limit > 1:
                run(cursor, sql["keep"], values)
            row = run(cursor, sql["next"], values).fetchall()[0]
            if there.version + 1 - p.history_limit >= 1:
                run(cursor, sql["prune"], {**values, "b_upto": there.version + 1 - p.history_limit})
        written = MemoryRecord(*self._decode.values(row))
        values.update({_ID: written.id, "b_revision": p.revision})
        run(cursor, sql["revision"], values)
        if p.vector is not None:
            run(
                cursor,
                sql["vector"],
                {**values, "b_model": p.model_id, "b_dims": p.dims, "b_vector": p.vector},
            )
        elif found is not None:  # the old vector is of other content
            run(cursor, sql["drop"], values)
        return PutOutcome(written, None)


_ID = "b_id"  # the memory's id, in every statement of its companions


def _memory_statements(m: Table) -> dict[str, Any]:
    """The ``memories`` row's: the get (live only), the look under the write lock,
    version 1, and the next version."""
    record = [m.c[name] for name in MemoryRecord._fields]
    key = (
        m.c.user_id == bindparam("b_user", type_=m.c.user_id.type),
        m.c.namespace == bindparam("b_ns", type_=String()),
        m.c.memory_key == bindparam("b_key", type_=String()),
    )
    now = bindparam("b_now", type_=m.c.updated_at.type)
    values = {
        "content": bindparam("b_content", type_=m.c.content.type),
        "metadata": bindparam("b_metadata", type_=m.c.metadata.type),
        "terms": bindparam("b_terms", type_=m.c.terms.type),
        "version": bindparam("b_version", type_=m.c.version.type),
        "updated_at": now,
        "expires_at": bindparam("b_expires", type_=m.c.expires_at.type),
    }
    made = {
        **values,
        "uid": bindparam("b_uid", type_=m.c.uid.type),
        "user_id": bindparam("b_user", type_=m.c.user_id.type),
        "namespace": bindparam("b_ns", type_=String()),
        "memory_key": bindparam("b_key", type_=String()),
        "created_at": now,
    }
    this = m.c.id == bindparam(_ID, type_=m.c.id.type)
    return {
        "get": select(*record).where(*key, or_(m.c.expires_at.is_(None), m.c.expires_at > now)),
        "find": select(*record).where(*key),
        "make": insert(m).values(**made).returning(*record),
        "next": update(m).where(this).values(**values).returning(*record),
    }


def _their_statements(tables: Tables) -> dict[str, Any]:
    """The companions' of one memory: its history kept and pruned, its scope's
    revision, its vector written or dropped."""
    m, v = tables.memories, tables.memory_versions
    vt, r = tables.memory_vectors, tables.memory_revisions
    memory_id = bindparam(_ID, type_=m.c.id.type)
    past = ["memory_id", "version", "uid", "content", "metadata", "updated_at", "expires_at"]
    old = select(m.c.id, *(m.c[n] for n in past[1:])).where(m.c.id == memory_id)
    revision = sqlite_insert(r).values(
        user_id=bindparam("b_user", type_=r.c.user_id.type),
        namespace=bindparam("b_ns", type_=String()),
        revision=bindparam("b_revision", type_=r.c.revision.type),
    )
    vector = sqlite_insert(vt).values(
        memory_id=memory_id,
        model_id=bindparam("b_model", type_=vt.c.model_id.type),
        dims=bindparam("b_dims", type_=vt.c.dims.type),
        vector=bindparam("b_vector", type_=vt.c.vector.type),
        written=bindparam("b_revision", type_=vt.c.written.type),  # a random stamp
    )
    upto = bindparam("b_upto", type_=v.c.version.type)
    return {
        "keep": insert(v).from_select(past, old),
        "prune": delete(v).where(v.c.memory_id == memory_id, v.c.version <= upto),
        "revision": revision.on_conflict_do_update(
            index_elements=["user_id", "namespace"],
            set_={"revision": revision.excluded.revision},
        ),
        "vector": vector.on_conflict_do_update(
            index_elements=["memory_id"],
            set_={c: vector.excluded[c] for c in ("model_id", "dims", "vector", "written")},
        ),
        "drop": delete(vt).where(vt.c.memory_id == memory_id),
    }
