"""PostgreSQL's one-statement LangGraph paths: a put, a task's writes and a read of one
checkpoint, each ONE statement run at driver level (:meth:`PostgresBackend.run_statement`).

The portable paths are in :mod:`tenxstore.langgraph.tables`; it asks the backend for
these (:meth:`~tenxstore.backends.base.Backend.langgraph_fast_path`) and takes them
when they are there. What a put commits here, and when it writes nothing and leaves
the work to the locked path, is said on :class:`OneStatement`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    LargeBinary,
    String,
    Text,
    bindparam,
    cast,
    exists,
    func,
    insert,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..langgraph.columns import BLOB_COLUMNS, LONGEST, write_order
from .driver import DriverStatement, OnFirstUse

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["OneStatement"]


class OneStatement:
    """A put, a task's writes and a read of one checkpoint, each ONE statement, for a
    backend that runs statements at driver level (PostgreSQL in session mode).

    A put commits only the common case: the thread exists (as the run's user's, in
    the life the run read), the parent is the namespace's head as the last put marked
    it (its ``lg_heads`` row), the channels it does not change are stored as the parent
    names them, and every base its deltas extend is still there. The head row is the
    compare-and-swap: the UPDATE that moves the mark to the new checkpoint waits for a
    concurrent put and then finds the mark moved (PostgreSQL checks the row's new
    version again); a thread row lock ``FOR NO KEY UPDATE`` waits for every locked-path
    writer and deleter (they hold ``FOR UPDATE``) and for every other one-statement
    writer of the thread, and each of those that deletes or
    replaces checkpoints or values takes the mark away too (deletes the head row), so
    what this statement's snapshot read of them cannot be stale. Otherwise nothing is
    written and the put takes the locked path, which raises the precise error.

    Every writer of a thread holds a lock on its row that conflicts with every other
    writer's: the row is the thread's one mutex, taken first. A shared lock (``FOR KEY
    SHARE``) let a task's writes and a put hold the row together while the put moved
    its ``updated_at``, and PostgreSQL, walking that update chain for a ``FOR UPDATE``
    waiter and the shared holders' foreign-key checks, deadlocked them (seen in 8-way
    races: ``40P01`` between a task's writes and a locked-path writer).
    """

    def __init__(self, store: Store) -> None:
        sql = _Statements(store)
        # Each variant (by its two flags) built when first sent
        self._put = OnFirstUse[tuple[bool, bool], DriverStatement](lambda k: sql.put(*k))
        self._put_writes = OnFirstUse[tuple[bool, bool], DriverStatement](
            lambda k: sql.put_writes(*k)
        )
        self._read = OnFirstUse[tuple[bool, bool], DriverStatement](lambda k: sql.read(*k))
        self._backend = store.backend

    async def put(self, scoped: bool, values: dict[str, Any]) -> tuple[int, Any] | None:
        """``(incarnation, the checkpoint at offset off or None)``, or None when it
        wrote nothing."""
        stmt = self._put[(scoped, values["life"] is not None)]
        row = await self._backend.run_statement(stmt, values, write=True)
        if row is None or row[0] is None or not row[1]:
            return None
        return int(row[0]), row[2]

    async def put_writes(self, scoped: bool, values: dict[str, Any]) -> bool:
        """Whether the writes were stored (the thread is there, the run's)."""
        stmt = self._put_writes[(scoped, values["life"] is not None)]
        row = await self._backend.run_statement(stmt, values, write=True)
        return row is not None and row[0] is not None

    async def read(self, scoped: bool, values: dict[str, Any]) -> Mapping[str, Any] | None:
        """The checkpoint (``id``, or the newest) with ``head``, its writes (``w_*``
        arrays) and the rows of its values' chains (``b_*`` arrays), or None."""
        stmt = self._read[(scoped, values["id"] is not None)]
        row = await self._backend.run_statement(stmt, values, write=False)
        return None if row is None else dict(row.items())

    @property
    def available(self) -> bool:
        """Whether statements run at driver level now (not behind PgBouncer in
        transaction mode, as found when the store was set up)."""
        return self._backend.one_statement_writes

    async def fetch(self, stmt: DriverStatement, values: Mapping[str, Any]) -> list[Any]:
        """The rows of one read-only statement, in one round trip."""
        rows: list[Any] = await self._backend.run_statement(stmt, values, write=False, many=True)
        return rows


class _Statements:
    """The one-statement paths' SQL, built step by step for one set of tables: each
    method returns one named part (a CTE, a subquery, a condition) or, for
    :meth:`put`, :meth:`put_writes` and :meth:`read`, a whole statement."""

    def __init__(self, store: Store) -> None:
        tables = store.tables
        self.t, self.c, self.w = tables.threads, tables.lg_checkpoints, tables.lg_writes
        self.b, self.h = tables.lg_blobs, tables.lg_heads
        self.dialect = store.backend.engine.dialect
        self.thread = bindparam("t", type_=self.t.c.thread_id.type)
        self.ns = bindparam("ns", type_=String())

    def owner(self, scoped: bool, life: bool) -> Any:
        """The thread's row, locked FOR NO KEY UPDATE, if it is the run's (``scoped``:
        owned by ``u`` exactly, compared null-safe: a sealed put's values name
        their owner, None for a thread of no user)."""
        t = self.t
        found = select(t.c.incarnation).where(t.c.thread_id == self.thread)
        if scoped:
            user = bindparam("u", type_=t.c.user_id.type)
            found = found.where(t.c.user_id.is_not_distinct_from(user))
        if life:
            life_is = bindparam("life", type_=t.c.incarnation.type)
            found = found.where(t.c.incarnation == life_is)
        return found.with_for_update(key_share=True).cte("th")

    # -- a put ---------------------------------------------------------------------

    def put(self, scoped: bool, life: bool) -> DriverStatement:
        """A put: the mark moved (``cas``), and only then the checkpoint, its values
        and the thread's ``updated_at`` written; the thread's incarnation, whether
        the mark moved, and the checkpoint at offset ``off`` (when ``look``)."""
        th = self.owner(scoped, life)
        parent_id = bindparam("parent", type_=String())
        cas = self.mark_moved(th, parent_id, bindparam("id", type_=String()))
        stmt = (
            select(
                select(th.c.incarnation).scalar_subquery(),
                exists(select(cas.c.checkpoint_id)),
                self.beyond(),
            )
            .add_cte(self.new_checkpoint(cas, parent_id).cte("new_checkpoint"))
            .add_cte(self.new_blobs(cas).cte("new_blobs"))
            .add_cte(self.touched(cas).cte("touched"))
        )
        return DriverStatement(stmt, self.dialect)

    def mark_moved(self, th: Any, parent_id: Any, new_id: Any) -> Any:
        """``cas``: the namespace's head mark moved from the parent to the new
        checkpoint, when the thread is the run's, the parent is stored as read, every
        base is still there and no version given is stored already."""
        h = self.h
        return (
            update(h)
            .where(
                h.c.thread_id == self.thread,
                h.c.checkpoint_ns == self.ns,
                h.c.checkpoint_id == parent_id,
                parent_id < new_id,
                exists(select(th.c.incarnation)),
                self.parent_as_read(parent_id),
                self.bases_found() == bindparam("nb", type_=Integer()),
                self.none_taken(),
            )
            .values(checkpoint_id=new_id)
            .returning(h.c.checkpoint_id)
            .cte("cas")
        )

    def parent_as_read(self, parent_id: Any) -> Any:
        """Whether the parent is stored, naming the channels the put does not change
        (``old``) as the run read them."""
        c = self.c
        return exists(
            select(c.c.checkpoint_id).where(
                c.c.thread_id == self.thread,
                c.c.checkpoint_ns == self.ns,
                c.c.checkpoint_id == parent_id,
                cast(c.c.versions, JSONB).contains(cast(bindparam("old", type_=Text()), JSONB)),
            )
        )

    def bases_found(self) -> Any:
        """How many of the bases the put's deltas extend (``bc``, ``bv``, ``bu``) are
        stored, each by its uid.

        Each base is looked up by its key (a correlated subquery per base, which the
        planner runs as an index probe and never turns into a scan of the namespace's
        values: a join here was planned, on a table without statistics, as a scan of
        every value of the thread for every put)."""
        bases = (
            func.unnest(_array("bc", Text()), _array("bv", Text()), _array("bu", BigInteger()))
            .table_valued("channel", "version", "uid")
            .render_derived(name="bases")
        )
        stored = self._stored(bases, self.b.c.uid)
        return (
            select(func.count()).select_from(bases).where(stored == bases.c.uid).scalar_subquery()
        )

    def none_taken(self) -> Any:
        """Whether none of the versions given (``ch``, ``ver``) is stored already (each
        looked up by its key, as in :meth:`bases_found`)."""
        taken = (
            func.unnest(_array("ch", Text()), _array("ver", Text()))
            .table_valued("channel", "version")
            .render_derived(name="taken")
        )
        # a version stored already is replaced: the locked path's work
        stored = self._stored(taken, self.b.c.version)  # a key column: never NULL
        return ~exists(select(taken.c.version).where(stored.is_not(None)))

    def _stored(self, given: Any, column: Any) -> Any:
        """``column`` of the value stored at ``given``'s channel and version (NULL:
        none), one index probe a row of ``given``."""
        b = self.b
        return (
            select(column)
            .where(
                b.c.thread_id == self.thread,
                b.c.checkpoint_ns == self.ns,
                b.c.channel == given.c.channel,
                b.c.version == given.c.version,
            )
            .correlate(given)
            .scalar_subquery()
        )

    def new_checkpoint(self, cas: Any, parent_id: Any) -> Any:
        """The checkpoint's row, inserted when the mark moved."""
        c = self.c
        columns = [
            "thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "type",
            "checkpoint", "metadata", "created_at", "run_id", "versions",
        ]  # fmt: skip
        return insert(c).from_select(
            columns,
            select(
                self.thread,
                self.ns,
                cas.c.checkpoint_id,
                parent_id,
                bindparam("type", type_=String()),
                bindparam("checkpoint", type_=LargeBinary()),
                bindparam("metadata", type_=Text()),
                bindparam("now", type_=c.c.created_at.type),
                bindparam("run", type_=String()),
                bindparam("versions", type_=Text()),
            ),
        )

    def new_blobs(self, cas: Any) -> Any:
        """The values' rows (``ch`` … ``ui``, one array a column), inserted when the
        mark moved."""
        b = self.b
        given = (
            func.unnest(
                _array("ch", Text()),
                _array("ver", Text()),
                _array("ty", Text()),
                _array("bl", LargeBinary()),
                _array("ba", Text()),
                _array("sp", Integer()),
                _array("sk", Integer()),
                _array("ui", BigInteger()),
            )
            .table_valued(*BLOB_COLUMNS)
            .render_derived(name="given")
        )
        return (
            pg_insert(b)
            .from_select(
                ["thread_id", "checkpoint_ns", *BLOB_COLUMNS],
                select(self.thread, self.ns, *(given.c[name] for name in BLOB_COLUMNS)).select_from(
                    cas.join(given, true())
                ),
            )
            .on_conflict_do_nothing(
                index_elements=["thread_id", "checkpoint_ns", "channel", "version"]
            )
        )

    def beyond(self) -> Any:
        """The namespace's checkpoint at offset ``off``, newest first, when ``look``."""
        c = self.c
        return (
            select(c.c.checkpoint_id)
            .where(
                c.c.thread_id == self.thread,
                c.c.checkpoint_ns == self.ns,
                bindparam("look", type_=Boolean()),  # a one-time filter: no scan
            )
            .order_by(c.c.checkpoint_id.desc())
            .offset(bindparam("off", type_=Integer()))
            .limit(1)
            .scalar_subquery()
        )

    def touched(self, cas: Any) -> Any:
        """The thread's ``updated_at`` moved with the put (a thread list orders by it)."""
        t = self.t
        return (
            update(t)
            .where(t.c.thread_id == self.thread, exists(select(cas.c.checkpoint_id)))
            .values(updated_at=bindparam("now", type_=t.c.updated_at.type))
        )

    # -- a task's writes -----------------------------------------------------------

    def put_writes(self, scoped: bool, life: bool) -> DriverStatement:
        """A task's writes (``ta`` … ``pa``, one array a column), stored when the
        thread is the run's; the thread's incarnation (None: not stored)."""
        w = self.w
        th = self.owner(scoped, life)
        names = ("task_id", "idx", "channel", "type", "value", "task_path")
        given = (
            func.unnest(
                _array("ta", Text()),
                _array("ix", Integer()),
                _array("ch", Text()),
                _array("ty", Text()),
                _array("va", LargeBinary()),
                _array("pa", Text()),
            )
            .table_valued(*names)
            .render_derived(name="given")
        )
        ins = pg_insert(w).from_select(
            ["thread_id", "checkpoint_ns", "checkpoint_id", *names],
            select(
                self.thread,
                self.ns,
                bindparam("id", type_=String()),
                *(given.c[name] for name in names),
            ).select_from(th.join(given, true())),
        )
        # The first write of a task stays; a special one (idx < 0) is replaced.
        ins = ins.on_conflict_do_update(
            index_elements=["thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
            set_={
                "channel": ins.excluded.channel,
                "type": ins.excluded.type,
                "value": ins.excluded.value,
                "task_path": ins.excluded.task_path,
            },
            where=w.c.idx < 0,
        )
        return DriverStatement(
            select(select(th.c.incarnation).scalar_subquery()).add_cte(ins.cte("ins")),
            self.dialect,
        )

    # -- a read --------------------------------------------------------------------

    def read(self, scoped: bool, given_id: bool) -> DriverStatement:
        """A checkpoint (``id``, or the newest) with ``head``, its writes and its
        values' chains, each aggregated into arrays beside the checkpoint's row."""
        cp = self.chosen(scoped, given_id)
        writes = self.writes_of(cp)
        values = self.values_of(self.chain(cp))
        stmt = (
            select(cp, self.head(cp, given_id).label("head"), writes, values)
            .select_from(cp)
            .join(writes, true())
            .join(values, true())
        )
        return DriverStatement(stmt, self.dialect)

    def chosen(self, scoped: bool, given_id: bool) -> Any:
        """``cp``: the checkpoint read, with its thread's incarnation and owner."""
        t, c = self.t, self.c
        chosen = select(*c.c, t.c.incarnation, t.c.user_id).join(t, t.c.thread_id == c.c.thread_id)
        chosen = chosen.where(c.c.thread_id == self.thread, c.c.checkpoint_ns == self.ns)
        if scoped:
            chosen = chosen.where(t.c.user_id == bindparam("u", type_=t.c.user_id.type))
        if given_id:
            chosen = chosen.where(c.c.checkpoint_id == bindparam("id", type_=String()))
        return chosen.order_by(c.c.checkpoint_id.desc()).limit(1).cte("cp")

    def head(self, cp: Any, given_id: bool) -> Any:
        """The namespace's newest checkpoint id (the one read, when no id was given)."""
        if not given_id:
            return cp.c.checkpoint_id
        newest = self.c.alias("newest")
        return (
            select(func.max(newest.c.checkpoint_id))
            .where(newest.c.thread_id == self.thread, newest.c.checkpoint_ns == self.ns)
            .scalar_subquery()
        )

    def writes_of(self, cp: Any) -> Any:
        """The checkpoint's writes in LangGraph's order, one array a column (``w_*``)."""
        w = self.w
        order = write_order(w)
        return (
            select(
                *(
                    func.array_agg(aggregate_order_by(w.c[name], *order)).label(f"w_{name}")
                    for name in ("task_id", "channel", "type", "value")
                )
            )
            .where(
                w.c.thread_id == self.thread,
                w.c.checkpoint_ns == self.ns,
                w.c.checkpoint_id == cp.c.checkpoint_id,
            )
            .lateral("writes")
        )

    def blob(self, channel: Any, version: Any, name: str) -> Any:
        """The row of one value, looked up by its whole key (a lateral: the planner
        takes it from the primary key, however few rows it thinks the table holds)."""
        step = self.b.alias(f"{name}_row")
        return (
            select(*(step.c[column] for column in BLOB_COLUMNS))
            .where(
                step.c.thread_id == self.thread,
                step.c.checkpoint_ns == self.ns,
                step.c.channel == channel,
                step.c.version == version,
            )
            .limit(1)  # not flattened: looked up per row by the whole key
            .lateral(name)
        )

    def chain(self, cp: Any) -> Any:
        """``chain``: the rows of the checkpoint's values, each followed down its
        bases (recursive, cut at :data:`LONGEST`) unless the reader holds it (``kc``,
        ``kv``, ``ku``: the channels, versions and uids of the values it holds)."""
        pairs = (
            func.jsonb_each_text(cast(cp.c.versions, JSONB))
            .table_valued("key", "value")
            .render_derived(name="pairs")
        )
        first = self.blob(pairs.c.key, pairs.c.value, "first")
        chain = (
            select(*(first.c[column] for column in BLOB_COLUMNS), literal(0).label("depth"))
            .select_from(cp)
            .join(pairs, true())
            .join(first, true())
            .cte("chain", recursive=True)
        )
        following = self.blob(chain.c.channel, chain.c.base, "following")
        known = (
            func.unnest(_array("kc", Text()), _array("kv", Text()), _array("ku", BigInteger()))
            .table_valued("channel", "version", "uid")
            .render_derived(name="known")
        )
        # a value the reader holds already (its channel, version and uid) is not
        # followed down its bases: the reader rebuilds it from what it holds
        held = exists(
            select(known.c.uid).where(
                known.c.channel == chain.c.channel,
                known.c.version == chain.c.version,
                known.c.uid == chain.c.uid,
            )
        )
        return chain.union_all(
            select(*(following.c[column] for column in BLOB_COLUMNS), chain.c.depth + 1)
            .select_from(chain)
            .join(following, true())
            .where(chain.c.depth < LONGEST, ~held)  # a damaged table's cycle ends at LONGEST
        )

    def values_of(self, chain: Any) -> Any:
        """The chain's rows, one array a column (``b_*``)."""
        return (
            select(*(func.array_agg(chain.c[name]).label(f"b_{name}") for name in BLOB_COLUMNS))
            .select_from(chain)
            .lateral("blobs")
        )


def _array(name: str, kind: Any) -> Any:
    """An array argument of ``kind`` items."""
    return bindparam(name, type_=ARRAY(kind))
