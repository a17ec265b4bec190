"""SQLite's one-hop LangGraph paths: a put, a task's writes and a read of one checkpoint,
each in ONE thread hop on the file's pysqlite connection (:class:`~.sqlite.HotPath`).

The portable paths are in :mod:`tenxstore.langgraph.tables`; it asks the backend for
these (:meth:`~tenxstore.backends.base.Backend.langgraph_fast_path`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import (
    Integer,
    String,
    and_,
    bindparam,
    cast,
    exists,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.engine import Dialect

from ..langgraph.columns import BLOB_COLUMNS, LONGEST, write_order
from ..serde import decode
from .driver import DriverStatement

if TYPE_CHECKING:
    from ..models import Tables
    from ..store import Store

__all__ = ["OneHop"]


class OneHop:
    """The same three paths as :class:`OneStatement` for a SQLite file, each in ONE
    thread hop: the statements run on a pysqlite connection in a worker thread, a
    put and a task's writes under the write lock (``BEGIN IMMEDIATE``, which
    serializes every writer of the file: the checks and the writes see one state),
    a read in one read transaction. The same common case only; otherwise nothing is
    written and the locked path runs."""

    def __init__(self, store: Store) -> None:
        from .sqlite import SqliteBackend

        backend = store.backend
        assert isinstance(backend, SqliteBackend)
        self._backend = backend
        hot = backend.hot_path
        assert hot is not None
        self._hot = hot
        sql = _Statements(store.tables, backend.engine.dialect)
        self.thread = sql.thread()
        self.parent = sql.parent()
        self.blob_uid = sql.blob_uid()
        self.touch = sql.touch()
        self.move_mark = sql.move_mark()
        self.new_checkpoint = sql.new_checkpoint()
        self.new_blob = sql.new_blob()
        self.beyond = sql.beyond()
        self.new_write = sql.new_write()
        self.read_stmts = sql.read_stmts()
        self.head = sql.head()
        self.writes = sql.writes()
        self.chain = sql.chain()

    async def put(self, scoped: bool, values: dict[str, Any]) -> tuple[int, Any] | None:
        """As :meth:`OneStatement.put`."""
        return await self._backend.write_in_thread(lambda cursor: self._put(cursor, scoped, values))

    def _put(self, cursor: Any, scoped: bool, v: dict[str, Any]) -> tuple[int, Any] | None:
        run = self._hot.execute
        found = run(cursor, self.thread, v).fetchone()
        if found is None or (scoped and found[1] != v["u"]):
            return None
        if v["life"] is not None and found[0] != v["life"]:
            return None
        parent = run(cursor, self.parent, {**v, "id": v["parent"]}).fetchone()
        if parent is None or not parent[0] or not v["parent"] < v["id"] or parent[1] is None:
            return None
        named = decode(parent[1])
        if any(named.get(ch) != version for ch, version in decode(v["old"]).items()):
            return None
        for channel, version, uid in zip(v["bc"], v["bv"], v["bu"], strict=True):
            there = run(cursor, self.blob_uid, {**v, "ch": channel, "ver": version}).fetchone()
            if there is None or there[0] != uid:
                return None
        for channel, version in zip(v["ch"], v["ver"], strict=True):
            if run(cursor, self.blob_uid, {**v, "ch": channel, "ver": version}).fetchone():
                return None  # a version stored already is replaced: the locked path's
        beyond = run(cursor, self.beyond, v).fetchone() if v["look"] else None
        run(cursor, self.move_mark, v)
        run(cursor, self.touch, v)
        checkpoint = {
            "c_thread_id": v["t"], "c_checkpoint_ns": v["ns"], "c_checkpoint_id": v["id"],
            "c_parent_checkpoint_id": v["parent"], "c_type": v["type"],
            "c_checkpoint": v["checkpoint"], "c_metadata": v["metadata"],
            "c_created_at": v["now"], "c_run_id": v["run"], "c_versions": v["versions"],
        }  # fmt: skip
        run(cursor, self.new_checkpoint, checkpoint)
        if v["ch"]:
            columns = zip(
                v["ch"], v["ver"], v["ty"], v["bl"], v["ba"], v["sp"], v["sk"], v["ui"], strict=True
            )
            rows = [
                {
                    "b_thread_id": v["t"],
                    "b_checkpoint_ns": v["ns"],
                    **{f"b_{name}": value for name, value in zip(BLOB_COLUMNS, row, strict=True)},
                }
                for row in columns
            ]
            self._hot.execute_many(cursor, self.new_blob, rows)
        return int(found[0]), None if beyond is None else beyond[0]

    async def put_writes(self, scoped: bool, values: dict[str, Any]) -> bool:
        """As :meth:`OneStatement.put_writes`."""
        done = await self._backend.write_in_thread(
            lambda cursor: self._put_writes(cursor, scoped, values)
        )
        return bool(done)

    def _put_writes(self, cursor: Any, scoped: bool, v: dict[str, Any]) -> bool | None:
        found = self._hot.execute(cursor, self.thread, v).fetchone()
        if found is None or (scoped and found[1] != v["u"]):
            return None
        if v["life"] is not None and found[0] != v["life"]:
            return None
        names = ("task_id", "idx", "channel", "type", "value", "task_path")
        columns = zip(v["ta"], v["ix"], v["ch"], v["ty"], v["va"], v["pa"], strict=True)
        rows = [
            {**v, **{f"w_{name}": value for name, value in zip(names, row, strict=True)}}
            for row in columns
        ]
        self._hot.execute_many(cursor, self.new_write, rows)
        return True

    async def fetch(self, stmt: DriverStatement, values: Mapping[str, Any]) -> list[Any]:
        """The rows of one statement, in one read transaction, in one thread hop."""
        return await self._backend.read_in_thread(
            lambda cursor: self._hot.execute(cursor, stmt, values).fetchall()
        )

    async def read(self, scoped: bool, values: dict[str, Any]) -> Mapping[str, Any] | None:
        """As :meth:`OneStatement.read`."""
        return await self._backend.read_in_thread(lambda cursor: self._read(cursor, scoped, values))

    def _read(self, cursor: Any, scoped: bool, v: dict[str, Any]) -> Mapping[str, Any] | None:
        run = self._hot.execute
        stmt = self.read_stmts[(scoped, v["id"] is not None)]
        found = run(cursor, stmt, v)
        row = found.fetchone()
        if row is None:
            return None
        names = [d[0] for d in found.description]
        record: dict[str, Any] = dict(zip(names, row, strict=True))
        key = {**v, "id": record["checkpoint_id"]}
        record["head"] = (
            run(cursor, self.head, v).fetchone()[0] if v["id"] is not None else key["id"]
        )
        writes = run(cursor, self.writes, key).fetchall()
        for i, name in enumerate(("task_id", "channel", "type", "value")):
            record[f"w_{name}"] = [w[i] for w in writes]
        blobs = []
        if record["versions"] is not None:
            known = orjson.dumps(
                {c: f"{ver}:{uid}" for c, ver, uid in zip(v["kc"], v["kv"], v["ku"], strict=True)}
            ).decode()
            blobs = run(
                cursor, self.chain, {**v, "versions": record["versions"], "known": known}
            ).fetchall()
        for i, name in enumerate(BLOB_COLUMNS):
            record[f"b_{name}"] = [r[i] for r in blobs]
        return record

    @property
    def available(self) -> bool:
        """Always: the file's driver-level path does not come and go."""
        return True


class _Statements:
    """The one-hop paths' statements, each compiled for the file's dialect by one
    method, for one set of tables."""

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.t, self.c, self.w = tables.threads, tables.lg_checkpoints, tables.lg_writes
        self.b, self.h = tables.lg_blobs, tables.lg_heads
        self.dialect = dialect
        self.thread_id = bindparam("t", type_=self.t.c.thread_id.type)
        self.ns = bindparam("ns", type_=String())
        c = self.c
        self.here = (c.c.thread_id == self.thread_id, c.c.checkpoint_ns == self.ns)
        """The namespace's checkpoints."""
        self.one = c.c.checkpoint_id == bindparam("id", type_=String())
        """The checkpoint ``id``."""

    def compiled(self, stmt: Any) -> DriverStatement:
        """``stmt`` compiled for the file's dialect."""
        return DriverStatement(stmt, self.dialect)

    # -- a put ---------------------------------------------------------------------

    def thread(self) -> DriverStatement:
        """The thread's incarnation and owner."""
        t = self.t
        return self.compiled(
            select(t.c.incarnation, t.c.user_id).where(t.c.thread_id == self.thread_id)
        )

    def parent(self) -> DriverStatement:
        """Whether the checkpoint ``id`` is the namespace's head as marked, and its
        versions."""
        h, c = self.h, self.c
        marked = exists(
            select(h.c.checkpoint_id).where(
                h.c.thread_id == self.thread_id,
                h.c.checkpoint_ns == self.ns,
                h.c.checkpoint_id == c.c.checkpoint_id,
            )
        )
        return self.compiled(select(marked, c.c.versions).where(*self.here, self.one))

    def blob_uid(self) -> DriverStatement:
        """The uid of the value stored at (``ch``, ``ver``)."""
        b = self.b
        blob_key = (
            b.c.thread_id == self.thread_id,
            b.c.checkpoint_ns == self.ns,
            b.c.channel == bindparam("ch", type_=String()),
            b.c.version == bindparam("ver", type_=String()),
        )
        return self.compiled(select(b.c.uid).where(*blob_key))

    def touch(self) -> DriverStatement:
        """The thread's ``updated_at`` moved to ``now``."""
        t = self.t
        return self.compiled(
            update(t)
            .where(t.c.thread_id == self.thread_id)
            .values(updated_at=bindparam("now", type_=t.c.updated_at.type))
        )

    def move_mark(self) -> DriverStatement:
        """The namespace's head mark moved to ``id``."""
        h = self.h
        return self.compiled(
            update(h)
            .where(h.c.thread_id == self.thread_id, h.c.checkpoint_ns == self.ns)
            .values(checkpoint_id=bindparam("id", type_=String()))
        )

    def new_checkpoint(self) -> DriverStatement:
        """A checkpoint's row (``c_*`` values)."""
        c = self.c
        names = [
            "thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "type",
            "checkpoint", "metadata", "created_at", "run_id", "versions",
        ]  # fmt: skip
        return self.compiled(
            insert(c).values({name: bindparam(f"c_{name}", type_=c.c[name].type) for name in names})
        )

    def new_blob(self) -> DriverStatement:
        """A value's row (``b_*`` values)."""
        b = self.b
        return self.compiled(
            insert(b).values(
                {
                    name: bindparam(f"b_{name}", type_=b.c[name].type)
                    for name in ("thread_id", "checkpoint_ns", *BLOB_COLUMNS)
                }
            )
        )

    def beyond(self) -> DriverStatement:
        """The namespace's checkpoint at offset ``off``, newest first."""
        c = self.c
        return self.compiled(
            select(c.c.checkpoint_id)
            .where(*self.here)
            .order_by(c.c.checkpoint_id.desc())
            .offset(bindparam("off", type_=Integer()))
            .limit(1)
        )

    # -- a task's writes -----------------------------------------------------------

    def new_write(self) -> DriverStatement:
        """A task's write (``w_*`` values): the first of a task stays, a special one
        (idx < 0) is replaced."""
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        w = self.w
        write_names = ("task_id", "idx", "channel", "type", "value", "task_path")
        ins = sqlite_insert(w).values(
            {
                "thread_id": self.thread_id,
                "checkpoint_ns": self.ns,
                "checkpoint_id": bindparam("id", type_=String()),
                **{name: bindparam(f"w_{name}", type_=w.c[name].type) for name in write_names},
            }
        )
        return self.compiled(
            ins.on_conflict_do_update(
                index_elements=["thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                set_={
                    name: ins.excluded[name] for name in ("channel", "type", "value", "task_path")
                },
                where=w.c.idx < 0,
            )
        )

    # -- a read --------------------------------------------------------------------

    def read_stmts(self) -> dict[tuple[bool, bool], DriverStatement]:
        """The checkpoint read with its thread's incarnation and owner, by (scoped,
        given an id): the run's (``u``) only when scoped, ``id`` or the newest."""
        t, c = self.t, self.c
        chosen = (
            select(*c.c, t.c.incarnation, t.c.user_id)
            .join(t, t.c.thread_id == c.c.thread_id)
            .where(*self.here)
            .order_by(c.c.checkpoint_id.desc())
            .limit(1)
        )
        own = t.c.user_id == bindparam("u", type_=t.c.user_id.type)
        return {
            (False, False): self.compiled(chosen),
            (True, False): self.compiled(chosen.where(own)),
            (False, True): self.compiled(chosen.where(self.one)),
            (True, True): self.compiled(chosen.where(self.one, own)),
        }

    def head(self) -> DriverStatement:
        """The namespace's newest checkpoint id."""
        return self.compiled(select(func.max(self.c.c.checkpoint_id)).where(*self.here))

    def writes(self) -> DriverStatement:
        """The checkpoint ``id``'s writes, in LangGraph's order."""
        w = self.w
        return self.compiled(
            select(w.c.task_id, w.c.channel, w.c.type, w.c.value)
            .where(
                w.c.thread_id == self.thread_id,
                w.c.checkpoint_ns == self.ns,
                w.c.checkpoint_id == bindparam("id", type_=String()),
            )
            .order_by(*write_order(w))
        )

    def chain(self) -> DriverStatement:
        """The rows of the values ``versions`` names, each followed down its bases
        (recursive, cut at :data:`LONGEST`) unless the reader holds it (``known``)."""
        b, thread, ns = self.b, self.thread_id, self.ns
        pairs = func.json_each(bindparam("versions", type_=String())).table_valued("key", "value")
        first = select(*(b.c[name] for name in BLOB_COLUMNS)).join(
            pairs,
            and_(b.c.channel == pairs.c.key, b.c.version == pairs.c.value),
        )
        first = first.where(b.c.thread_id == thread, b.c.checkpoint_ns == ns)
        chain = first.add_columns(literal(0).label("depth")).cte("chain", recursive=True)
        step = b.alias("step")
        # a value the reader holds (``known``: {channel: "version:uid"}) is not followed
        # down its bases: the reader rebuilds it from what it holds
        known = func.json_each(bindparam("known", type_=String())).table_valued("key", "value")
        held = exists(
            select(known.c.key).where(
                known.c.key == chain.c.channel,
                known.c.value == chain.c.version + ":" + cast(chain.c.uid, String()),
            )
        )
        chain = chain.union_all(
            select(*(step.c[name] for name in BLOB_COLUMNS), chain.c.depth + 1)
            .join(
                chain,
                and_(
                    step.c.thread_id == thread,
                    step.c.checkpoint_ns == ns,
                    step.c.channel == chain.c.channel,
                    step.c.version == chain.c.base,
                ),
            )
            .where(chain.c.depth < LONGEST, ~held)  # a damaged table's cycle ends at LONGEST
        )
        return self.compiled(select(*(chain.c[name] for name in BLOB_COLUMNS)))
