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
    Boolean,
    Integer,
    String,
    and_,
    bindparam,
    exists,
    func,
    insert,
    literal,
    select,
    update,
)

from ..langgraph.columns import BLOB_COLUMNS, LONGEST, write_order
from .driver import DriverStatement

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
        from sqlalchemy import BigInteger, LargeBinary, Text, cast, true
        from sqlalchemy.dialects.postgresql import ARRAY, JSONB, aggregate_order_by
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        tables = store.tables
        t, c, w, b = tables.threads, tables.lg_checkpoints, tables.lg_writes, tables.lg_blobs
        h = tables.lg_heads
        dialect = store.backend.engine.dialect
        thread = bindparam("t", type_=t.c.thread_id.type)
        ns = bindparam("ns", type_=String())

        def owner(scoped: bool, life: bool) -> Any:
            """The thread's row, locked FOR NO KEY UPDATE, if it is the run's (``scoped``:
            owned by ``u`` exactly, compared null-safe: a sealed put's values name
            their owner, None for a thread of no user)."""
            found = select(t.c.incarnation).where(t.c.thread_id == thread)
            if scoped:
                user = bindparam("u", type_=t.c.user_id.type)
                found = found.where(t.c.user_id.is_not_distinct_from(user))
            if life:
                life_is = bindparam("life", type_=t.c.incarnation.type)
                found = found.where(t.c.incarnation == life_is)
            return found.with_for_update(key_share=True).cte("th")

        def array(name: str, kind: Any) -> Any:
            return bindparam(name, type_=ARRAY(kind))

        def put(scoped: bool, life: bool) -> DriverStatement:
            th = owner(scoped, life)
            bases = (
                func.unnest(array("bc", Text()), array("bv", Text()), array("bu", BigInteger()))
                .table_valued("channel", "version", "uid")
                .render_derived(name="bases")
            )
            found_bases = (
                select(func.count())
                .select_from(b)
                .join(
                    bases,
                    and_(
                        b.c.channel == bases.c.channel,
                        b.c.version == bases.c.version,
                        b.c.uid == bases.c.uid,
                    ),
                )
                .where(b.c.thread_id == thread, b.c.checkpoint_ns == ns)
                .scalar_subquery()
            )
            new_id = bindparam("id", type_=String())
            taken = (
                func.unnest(array("ch", Text()), array("ver", Text()))
                .table_valued("channel", "version")
                .render_derived(name="taken")
            )
            # a version stored already is replaced: the locked path's work
            none_taken = ~exists(
                select(b.c.version)
                .join(taken, and_(b.c.channel == taken.c.channel, b.c.version == taken.c.version))
                .where(b.c.thread_id == thread, b.c.checkpoint_ns == ns)
            )
            parent_id = bindparam("parent", type_=String())
            parent_as_read = exists(
                select(c.c.checkpoint_id).where(
                    c.c.thread_id == thread,
                    c.c.checkpoint_ns == ns,
                    c.c.checkpoint_id == parent_id,
                    cast(c.c.versions, JSONB).contains(cast(bindparam("old", type_=Text()), JSONB)),
                )
            )
            cas = (
                update(h)
                .where(
                    h.c.thread_id == thread,
                    h.c.checkpoint_ns == ns,
                    h.c.checkpoint_id == parent_id,
                    parent_id < new_id,
                    exists(select(th.c.incarnation)),
                    parent_as_read,
                    found_bases == bindparam("nb", type_=Integer()),
                    none_taken,
                )
                .values(checkpoint_id=new_id)
                .returning(h.c.checkpoint_id)
                .cte("cas")
            )
            columns = [
                "thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "type",
                "checkpoint", "metadata", "created_at", "run_id", "versions",
            ]  # fmt: skip
            new_checkpoint = insert(c).from_select(
                columns,
                select(
                    thread,
                    ns,
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
            given = (
                func.unnest(
                    array("ch", Text()),
                    array("ver", Text()),
                    array("ty", Text()),
                    array("bl", LargeBinary()),
                    array("ba", Text()),
                    array("sp", Integer()),
                    array("sk", Integer()),
                    array("ui", BigInteger()),
                )
                .table_valued(*BLOB_COLUMNS)
                .render_derived(name="given")
            )
            new_blobs = (
                pg_insert(b)
                .from_select(
                    ["thread_id", "checkpoint_ns", *BLOB_COLUMNS],
                    select(thread, ns, *(given.c[name] for name in BLOB_COLUMNS)).select_from(
                        cas.join(given, true())
                    ),
                )
                .on_conflict_do_nothing(
                    index_elements=["thread_id", "checkpoint_ns", "channel", "version"]
                )
            )
            beyond = (
                select(c.c.checkpoint_id)
                .where(
                    c.c.thread_id == thread,
                    c.c.checkpoint_ns == ns,
                    bindparam("look", type_=Boolean()),  # a one-time filter: no scan
                )
                .order_by(c.c.checkpoint_id.desc())
                .offset(bindparam("off", type_=Integer()))
                .limit(1)
                .scalar_subquery()
            )
            # the thread's updated_at moves with the put (a thread list orders by it)
            touched = (
                update(t)
                .where(t.c.thread_id == thread, exists(select(cas.c.checkpoint_id)))
                .values(updated_at=bindparam("now", type_=t.c.updated_at.type))
            )
            stmt = (
                select(
                    select(th.c.incarnation).scalar_subquery(),
                    exists(select(cas.c.checkpoint_id)),
                    beyond,
                )
                .add_cte(new_checkpoint.cte("new_checkpoint"))
                .add_cte(new_blobs.cte("new_blobs"))
                .add_cte(touched.cte("touched"))
            )
            return DriverStatement(stmt, dialect)

        def put_writes(scoped: bool, life: bool) -> DriverStatement:
            th = owner(scoped, life)
            names = ("task_id", "idx", "channel", "type", "value", "task_path")
            given = (
                func.unnest(
                    array("ta", Text()),
                    array("ix", Integer()),
                    array("ch", Text()),
                    array("ty", Text()),
                    array("va", LargeBinary()),
                    array("pa", Text()),
                )
                .table_valued(*names)
                .render_derived(name="given")
            )
            ins = pg_insert(w).from_select(
                ["thread_id", "checkpoint_ns", "checkpoint_id", *names],
                select(
                    thread,
                    ns,
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
                dialect,
            )

        def read(scoped: bool, given_id: bool) -> DriverStatement:
            chosen = select(*c.c, t.c.incarnation, t.c.user_id).join(
                t, t.c.thread_id == c.c.thread_id
            )
            chosen = chosen.where(c.c.thread_id == thread, c.c.checkpoint_ns == ns)
            if scoped:
                chosen = chosen.where(t.c.user_id == bindparam("u", type_=t.c.user_id.type))
            if given_id:
                chosen = chosen.where(c.c.checkpoint_id == bindparam("id", type_=String()))
            cp = chosen.order_by(c.c.checkpoint_id.desc()).limit(1).cte("cp")
            newest = c.alias("newest")
            head = (
                select(func.max(newest.c.checkpoint_id))
                .where(newest.c.thread_id == thread, newest.c.checkpoint_ns == ns)
                .scalar_subquery()
                if given_id
                else cp.c.checkpoint_id
            )
            order = write_order(w)
            writes = (
                select(
                    *(
                        func.array_agg(aggregate_order_by(w.c[name], *order)).label(f"w_{name}")
                        for name in ("task_id", "channel", "type", "value")
                    )
                )
                .where(
                    w.c.thread_id == thread,
                    w.c.checkpoint_ns == ns,
                    w.c.checkpoint_id == cp.c.checkpoint_id,
                )
                .lateral("writes")
            )
            pairs = (
                func.jsonb_each_text(cast(cp.c.versions, JSONB))
                .table_valued("key", "value")
                .render_derived(name="pairs")
            )

            def blob(channel: Any, version: Any, name: str) -> Any:
                """The row of one value, looked up by its whole key (a lateral: the
                planner takes it from the primary key, however few rows it thinks
                the table holds)."""
                step = b.alias(f"{name}_row")
                return (
                    select(*(step.c[column] for column in BLOB_COLUMNS))
                    .where(
                        step.c.thread_id == thread,
                        step.c.checkpoint_ns == ns,
                        step.c.channel == channel,
                        step.c.version == version,
                    )
                    .limit(1)  # not flattened: looked up per row by the whole key
                    .lateral(name)
                )

            first = blob(pairs.c.key, pairs.c.value, "first")
            chain = (
                select(*(first.c[column] for column in BLOB_COLUMNS), literal(0).label("depth"))
                .select_from(cp)
                .join(pairs, true())
                .join(first, true())
                .cte("chain", recursive=True)
            )
            following = blob(chain.c.channel, chain.c.base, "following")
            chain = chain.union_all(
                select(*(following.c[column] for column in BLOB_COLUMNS), chain.c.depth + 1)
                .select_from(chain)
                .join(following, true())
                .where(chain.c.depth < LONGEST)  # a damaged table's cycle ends here
            )
            values = (
                select(*(func.array_agg(chain.c[name]).label(f"b_{name}") for name in BLOB_COLUMNS))
                .select_from(chain)
                .lateral("blobs")
            )
            stmt = (
                select(cp, head.label("head"), writes, values)
                .select_from(cp)
                .join(writes, true())
                .join(values, true())
            )
            return DriverStatement(stmt, dialect)

        flags = [(a, z) for a in (False, True) for z in (False, True)]
        self._put = {key: put(*key) for key in flags}
        self._put_writes = {key: put_writes(*key) for key in flags}
        self._read = {key: read(*key) for key in flags}
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
