"""The statements of :mod:`tenxstore.langgraph.tables` built once per store: the common
lookups, a value chain's rows, and a ``DeltaChannel`` history as one statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Integer,
    LargeBinary,
    String,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.sql.util import ClauseAdapter

from ..store import Store
from .columns import BLOB_COLUMNS, CodePointOrder

__all__ = ["Statements", "history_statement", "value_chain"]


class Statements:
    """The statements of every put, built once (with bind parameters)."""

    def __init__(self, store: Store) -> None:
        c = store.tables.lg_checkpoints
        here = and_(
            c.c.thread_id == bindparam("t", type_=c.c.thread_id.type),
            c.c.checkpoint_ns == bindparam("ns", type_=String()),
        )
        newest = select(c.c.checkpoint_id).where(here).order_by(c.c.checkpoint_id.desc())
        parent = select(literal(1)).where(
            here, c.c.checkpoint_id == bindparam("parent", type_=String())
        )
        #: The namespace's newest checkpoint, whether the parent exists, and the one at
        #: offset ``off`` from the newest (None: fewer): one round trip.
        self.look = select(
            newest.limit(1).scalar_subquery(),
            parent.scalar_subquery(),
            newest.offset(bindparam("off", type_=Integer())).limit(1).scalar_subquery(),
        )
        t = store.tables.threads
        #: A put moves its thread's ``updated_at`` (the thread is locked: rolled back
        #: with the put if it fails).
        self.touch: Any = (
            update(t)
            .where(t.c.thread_id == bindparam("t", type_=t.c.thread_id.type))
            .values(updated_at=bindparam("now", type_=t.c.updated_at.type))
        )
        if store.backend.dml_in_ctes:  # folded into the look: no statement of its own
            self.look = self.look.add_cte(self.touch.cte("touched"))
            self.touch = None
        #: A checkpoint, replacing one of the same id.
        self.put_checkpoint = store.backend.upsert(c, "thread_id", "checkpoint_ns", "checkpoint_id")
        #: A namespace's head mark, moved to a checkpoint (see ``lg_heads``).
        self.put_head = store.backend.upsert(store.tables.lg_heads, "thread_id", "checkpoint_ns")
        #: A channel's value at a version, replacing one stored at that version.
        self.put_blob = store.backend.upsert(
            store.tables.lg_blobs, "thread_id", "checkpoint_ns", "channel", "version"
        )


@dataclass(frozen=True)
class Lookup:
    """A row looked up by key from inside a query: its columns and the join condition."""

    columns: list[Any]
    on: Any
    source: Any


def by_key(
    store: Store, table: Any, fixed: tuple[Any, ...], last: Any, names: list[str], name: str
) -> Lookup:
    """Join ``table``'s row whose key is ``fixed`` and ``last`` (which names an outer
    column): where the backend asks for lateral lookups (PostgreSQL) a LATERAL
    subquery with LIMIT 1, which the planner runs per outer row by the whole key (a
    plain join may be planned as a scan of the thread's rows per step when the
    table's statistics are stale, as on a new database); a plain join elsewhere
    (SQLite plans it by the primary key)."""
    if store.backend.lateral_lookups:
        found = select(*(table.c[n] for n in names)).where(*fixed, last).limit(1).lateral(name)
        return Lookup([found.c[n] for n in names], true(), found)
    alias = table.alias(name)
    adapt = ClauseAdapter(alias)
    conditions = [adapt.traverse(expr) for expr in (*fixed, last)]
    return Lookup([alias.c[n] for n in names], and_(*conditions), alias)


def value_chain(store: Store, thread: Any, ns: Any, named: Any) -> Any:
    """The ``lg_blobs`` rows of the values ``named`` selects (``channel``, ``version``,
    ``base``) and of every base their deltas are built on: keys walked recursively
    (UNION drops the walks that meet), each step and each row at the end looked up by
    its whole key."""
    b = store.tables.lg_blobs
    here = (b.c.thread_id == thread, b.c.checkpoint_ns == ns)
    start = named.cte("chain", recursive=True)
    step = by_key(
        store,
        b,
        (*here, b.c.channel == start.c.channel),
        b.c.version == start.c.base,
        ["channel", "version", "base"],
        "step",
    )
    keys = start.union(select(*step.columns).select_from(start).join(step.source, step.on))
    row = by_key(
        store,
        b,
        (*here, b.c.channel == keys.c.channel),
        b.c.version == keys.c.version,
        list(BLOB_COLUMNS),
        "value",
    )
    return select(*row.columns).select_from(keys).join(row.source, row.on)


HISTORY_CHANNELS = 8  # a DeltaChannel history of at most this many channels: one statement
HISTORY_DEPTH = 10_000  # ancestors one statement walks (beyond: batches of WALK)
# the columns of a history statement's rows: kind 0 an ancestor, 1 a write, 2 a value
HISTORY_COLUMNS = (
    "kind", "checkpoint_id", "depth", "came", "rest", "versions", "task_id", "channel",
    "type", "value", "version", "base", "splice", "skip", "uid", "task_path", "idx",
)  # fmt: skip


def verbatim_in_json(name: str) -> bool:
    """Whether JSON text holds ``name`` as it is (no escape), as a SQLite JSON path
    must name a key: no control character, quote, backslash or lone surrogate."""
    return all(
        char >= " " and char not in '"\\' and not "\ud800" <= char <= "\udfff" for char in name
    )


def _number(value: int) -> Any:
    """An integer written into the statement (not bound)."""
    return literal_column(str(value), Integer())


def _nothing(kind: Any) -> Any:
    """A NULL of ``kind``: a union's column that this kind of row leaves empty."""
    return cast(null(), kind)


class _History:
    """The parts of one :func:`history_statement`: its binds, and each of its steps."""

    def __init__(self, store: Store, count: int) -> None:
        self.store, self.count, self.backend = store, count, store.backend
        tables = store.tables
        self.t, self.c, self.w, self.b = (
            tables.threads, tables.lg_checkpoints, tables.lg_writes, tables.lg_blobs,
        )  # fmt: skip
        self.thread = bindparam("t", type_=self.t.c.thread_id.type)
        self.ns = bindparam("ns", type_=String())
        self.names = [bindparam(f"ch{i}", type_=String()) for i in range(count)]
        self.here = (self.c.c.thread_id == self.thread, self.c.c.checkpoint_ns == self.ns)

    def version(self, versions: Any, i: int) -> Any:
        """Channel ``i``'s version in a row's ``versions`` (JSON text)."""
        return self.backend.json_text(versions, self.names[i], bindparam(f"p{i}", type_=String()))

    def holds(self, versions: Any) -> Any:
        """Bit i: the row ends the walk of channel i (a stored value, or one kept in
        the checkpoint itself, which the caller reads the long way)."""
        b = self.b
        total: Any = _number(0)
        for i in range(self.count):
            v = self.version(versions, i)
            stored = exists().where(
                b.c.thread_id == self.thread,
                b.c.checkpoint_ns == self.ns,
                b.c.channel == self.names[i],
                b.c.version == v,
            )
            held = or_(versions.is_(None), v == "", stored)
            total = total + case((held, _number(1 << i)), else_=_number(0))
        return total

    def visible(self, scoped: bool) -> Any:
        """The thread's row, when the caller may see it."""
        t = self.t
        visible = t.c.thread_id == self.thread
        if scoped:
            visible = and_(visible, t.c.user_id == bindparam("u", type_=t.c.user_id.type))
        return visible

    def walk(self, visible: Any) -> Any:
        """The ancestors from the parent of checkpoint ``id`` (NULL: the newest), each
        with the channels still looked for on arriving (``came``) and leaving
        (``rest``)."""
        c, here = self.c, self.here
        every = _number((1 << self.count) - 1)
        newest = select(func.max(c.c.checkpoint_id)).where(*here).scalar_subquery()
        start = func.coalesce(bindparam("id", type_=String()), newest)
        parent_of_start = (
            select(c.c.parent_checkpoint_id)
            .where(*here, c.c.checkpoint_id == start)
            .scalar_subquery()
        )
        walk = (
            select(
                c.c.checkpoint_id,
                c.c.parent_checkpoint_id,
                c.c.versions,
                _number(0).label("depth"),
                every.label("came"),
                (every - every.op("&")(self.holds(c.c.versions))).label("rest"),
            )
            .where(*here, c.c.checkpoint_id == parent_of_start, exists().where(visible))
            .cte("walk", recursive=True)
        )
        parent = by_key(
            self.store,
            c,
            here,
            c.c.checkpoint_id == walk.c.parent_checkpoint_id,
            ["checkpoint_id", "parent_checkpoint_id", "versions"],
            "parent",
        )
        rest = walk.c.rest
        return walk.union_all(
            select(
                *parent.columns,
                walk.c.depth + 1,
                rest,
                rest - rest.op("&")(self.holds(parent.columns[2])),
            )
            .select_from(walk)
            .join(parent.source, parent.on)
            .where(rest != 0, walk.c.depth < HISTORY_DEPTH)
        )

    def chain(self, walk: Any) -> Any:
        """The rows of the values' chains where the walk of a channel stopped."""
        b, names = self.b, self.names
        found = union_all(
            *(
                select(
                    names[i].label("channel"), self.version(walk.c.versions, i).label("version")
                ).where(
                    walk.c.came.op("&")(_number(1 << i)) != 0,
                    walk.c.rest.op("&")(_number(1 << i)) == 0,
                )
                for i in range(self.count)
            )
        ).cte("found")
        keys = select(b.c.channel, b.c.version, b.c.base).join(
            found,
            and_(
                b.c.thread_id == self.thread,
                b.c.checkpoint_ns == self.ns,
                b.c.channel == found.c.channel,
                b.c.version == found.c.version,
            ),
        )
        return value_chain(self.store, self.thread, self.ns, keys).subquery("chain")

    def writes(self, walk: Any) -> Any:
        """The writes of the walked ancestors to the channels."""
        w = self.w
        written = (
            select(w.c.checkpoint_id, w.c.task_id, w.c.channel, w.c.type, w.c.value)
            .add_columns(w.c.task_path, w.c.idx)
            .where(
                w.c.thread_id == self.thread,
                w.c.checkpoint_ns == self.ns,
                w.c.checkpoint_id == walk.c.checkpoint_id,
                w.c.channel.in_(self.names),
            )
        )
        if self.backend.lateral_lookups:  # per ancestor, by its key (not a scan of the writes)
            lateral = written.lateral("written")
            return select(*lateral.c).select_from(walk).join(lateral, true())
        return written


def _ancestor_rows(walk: Any) -> Any:
    """Kind 0 of a history's rows: the ancestors walked."""
    text_, blob = String(), LargeBinary()
    return select(
        *(
            column.label(name)
            for column, name in zip(
                (
                    _number(0),
                    walk.c.checkpoint_id,
                    walk.c.depth,
                    walk.c.came,
                    walk.c.rest,
                    case((walk.c.came != walk.c.rest, walk.c.versions), else_=_nothing(Text())),
                    *(_nothing(k) for k in (text_, text_, text_, blob, text_, text_)),
                    *(_nothing(k) for k in (Integer(), Integer(), Integer(), text_, Integer())),
                ),
                HISTORY_COLUMNS,
                strict=True,
            )
        )
    )


def _write_rows(writes: Any) -> Any:
    """Kind 1 of a history's rows: the writes."""
    text_ = String()
    w_ = writes.subquery("w")
    return select(
        _number(1),
        w_.c.checkpoint_id,
        *(_nothing(Integer()) for _ in range(3)),
        _nothing(Text()),
        # explicit collations make the union's columns (and its ORDER BY) code-point order
        CodePointOrder(w_.c.task_id),
        w_.c.channel,
        w_.c.type,
        w_.c.value,
        *(_nothing(k) for k in (text_, text_, Integer(), Integer(), Integer())),
        CodePointOrder(w_.c.task_path),
        w_.c.idx,
    )


def _value_rows(chain: Any) -> Any:
    """Kind 2 of a history's rows: the rows of the values' chains."""
    text_ = String()
    return select(
        _number(2),
        _nothing(text_),
        *(_nothing(Integer()) for _ in range(3)),
        _nothing(Text()),
        _nothing(text_),
        chain.c.channel,
        chain.c.type,
        chain.c.blob,
        chain.c.version,
        chain.c.base,
        chain.c.splice,
        chain.c.skip,
        chain.c.uid,
        _nothing(text_),
        _nothing(Integer()),
    )


def _life_row(store: Store, visible: Any) -> Any:
    """Kind 3 of a history's rows: the thread's life (what its values are sealed for),
    read in the same statement: its incarnation as ``uid``, its owner as ``channel``
    (as text on PostgreSQL, whose UNION will not mix an int id with text)."""
    t, text_ = store.tables.threads, String()
    owner: Any = t.c.user_id
    if store.backend.strict_union_types and store.settings.user_id_type != "string":
        owner = cast(owner, text_)
    return select(
        _number(3),
        _nothing(text_),
        *(_nothing(Integer()) for _ in range(3)),
        _nothing(Text()),
        _nothing(text_),
        owner,
        _nothing(text_),
        _nothing(LargeBinary()),
        *(_nothing(k) for k in (text_, text_, Integer(), Integer())),
        t.c.incarnation,
        _nothing(text_),
        _nothing(Integer()),
    ).where(visible)


def history_statement(store: Store, scoped: bool, count: int) -> Any:
    """A ``DeltaChannel`` history of ``count`` channels (bound ``ch0``...; ``p0``...
    their JSON paths on SQLite) from the parent of checkpoint ``id`` (NULL: the
    namespace's newest) as ONE statement:
    the ancestors, parent first, walked only as far as the nearest one that holds a
    stored value of each channel (``came``/``rest``: bit ``i`` set while channel ``i``
    is still looked for, on arriving at and on leaving the row; ``versions`` on a row
    where a channel stops), the writes of the walked ancestors to those channels, the
    rows of the found values' chains, and the thread's life. Each step, write and
    value is looked up by its whole key."""
    parts = _History(store, count)
    visible = parts.visible(scoped)
    walk = parts.walk(visible)
    chain = parts.chain(walk)
    writes = parts.writes(walk)
    order: list[Any] = [literal_column(n) for n in ("kind", "depth", "checkpoint_id", "task_path")]
    order += [literal_column("task_id"), literal_column("idx")]
    return union_all(
        _ancestor_rows(walk), _write_rows(writes), _value_rows(chain), _life_row(store, visible)
    ).order_by(*order)
