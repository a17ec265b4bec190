"""The statements of :mod:`tenxstore.langgraph.tables` built once per store: the common
lookups, a value chain's rows, and a ``DeltaChannel`` history as one statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    and_,
    bindparam,
    case,
    func,
    literal,
    select,
    true,
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
    from sqlalchemy import LargeBinary, Text, cast, exists, literal_column, null, or_, union_all

    tables = store.tables
    t, c, w, b = tables.threads, tables.lg_checkpoints, tables.lg_writes, tables.lg_blobs
    backend = store.backend
    thread = bindparam("t", type_=t.c.thread_id.type)
    ns = bindparam("ns", type_=String())
    names = [bindparam(f"ch{i}", type_=String()) for i in range(count)]

    def number(value: int) -> Any:
        return literal_column(str(value), Integer())

    def version(versions: Any, i: int) -> Any:
        return backend.json_text(versions, names[i], bindparam(f"p{i}", type_=String()))

    def holds(versions: Any) -> Any:
        """Bit i: the row ends the walk of channel i (a stored value, or one kept in
        the checkpoint itself, which the caller reads the long way)."""
        total: Any = number(0)
        for i in range(count):
            v = version(versions, i)
            stored = exists().where(
                b.c.thread_id == thread,
                b.c.checkpoint_ns == ns,
                b.c.channel == names[i],
                b.c.version == v,
            )
            held = or_(versions.is_(None), v == "", stored)
            total = total + case((held, number(1 << i)), else_=number(0))
        return total

    every = number((1 << count) - 1)
    here = (c.c.thread_id == thread, c.c.checkpoint_ns == ns)
    newest = select(func.max(c.c.checkpoint_id)).where(*here).scalar_subquery()
    start = func.coalesce(bindparam("id", type_=String()), newest)
    parent_of_start = (
        select(c.c.parent_checkpoint_id).where(*here, c.c.checkpoint_id == start).scalar_subquery()
    )
    visible = t.c.thread_id == thread
    if scoped:
        visible = and_(visible, t.c.user_id == bindparam("u", type_=t.c.user_id.type))
    walk = (
        select(
            c.c.checkpoint_id,
            c.c.parent_checkpoint_id,
            c.c.versions,
            number(0).label("depth"),
            every.label("came"),
            (every - every.op("&")(holds(c.c.versions))).label("rest"),
        )
        .where(*here, c.c.checkpoint_id == parent_of_start, exists().where(visible))
        .cte("walk", recursive=True)
    )
    parent = by_key(
        store,
        c,
        here,
        c.c.checkpoint_id == walk.c.parent_checkpoint_id,
        ["checkpoint_id", "parent_checkpoint_id", "versions"],
        "parent",
    )
    rest = walk.c.rest
    walk = walk.union_all(
        select(
            *parent.columns,
            walk.c.depth + 1,
            rest,
            rest - rest.op("&")(holds(parent.columns[2])),
        )
        .select_from(walk)
        .join(parent.source, parent.on)
        .where(rest != 0, walk.c.depth < HISTORY_DEPTH)
    )
    found = union_all(
        *(
            select(names[i].label("channel"), version(walk.c.versions, i).label("version")).where(
                walk.c.came.op("&")(number(1 << i)) != 0,
                walk.c.rest.op("&")(number(1 << i)) == 0,
            )
            for i in range(count)
        )
    ).cte("found")
    keys = select(b.c.channel, b.c.version, b.c.base).join(
        found,
        and_(
            b.c.thread_id == thread,
            b.c.checkpoint_ns == ns,
            b.c.channel == found.c.channel,
            b.c.version == found.c.version,
        ),
    )
    chain = value_chain(store, thread, ns, keys).subquery("chain")
    written = (
        select(w.c.checkpoint_id, w.c.task_id, w.c.channel, w.c.type, w.c.value)
        .add_columns(w.c.task_path, w.c.idx)
        .where(
            w.c.thread_id == thread,
            w.c.checkpoint_ns == ns,
            w.c.checkpoint_id == walk.c.checkpoint_id,
            w.c.channel.in_(names),
        )
    )
    if backend.lateral_lookups:  # per ancestor, by its key (not a scan of the writes)
        lateral = written.lateral("written")
        writes = select(*lateral.c).select_from(walk).join(lateral, true())
    else:
        writes = written
    text_, blob = String(), LargeBinary()

    def nothing(kind: Any) -> Any:
        return cast(null(), kind)

    ancestors = select(
        *(
            column.label(name)
            for column, name in zip(
                (
                    number(0),
                    walk.c.checkpoint_id,
                    walk.c.depth,
                    walk.c.came,
                    walk.c.rest,
                    case((walk.c.came != walk.c.rest, walk.c.versions), else_=nothing(Text())),
                    *(nothing(k) for k in (text_, text_, text_, blob, text_, text_)),
                    *(nothing(k) for k in (Integer(), Integer(), Integer(), text_, Integer())),
                ),
                HISTORY_COLUMNS,
                strict=True,
            )
        )
    )
    w_ = writes.subquery("w")
    write_rows = select(
        number(1),
        w_.c.checkpoint_id,
        *(nothing(Integer()) for _ in range(3)),
        nothing(Text()),
        # explicit collations make the union's columns (and its ORDER BY) code-point order
        CodePointOrder(w_.c.task_id),
        w_.c.channel,
        w_.c.type,
        w_.c.value,
        *(nothing(k) for k in (text_, text_, Integer(), Integer(), Integer())),
        CodePointOrder(w_.c.task_path),
        w_.c.idx,
    )
    value_rows = select(
        number(2),
        nothing(text_),
        *(nothing(Integer()) for _ in range(3)),
        nothing(Text()),
        nothing(text_),
        chain.c.channel,
        chain.c.type,
        chain.c.blob,
        chain.c.version,
        chain.c.base,
        chain.c.splice,
        chain.c.skip,
        chain.c.uid,
        nothing(text_),
        nothing(Integer()),
    )
    # kind 3: the thread's life (what its values are sealed for), read in the same
    # statement: its incarnation as ``uid``, its owner as ``channel`` (as text on
    # PostgreSQL, whose UNION will not mix an int id with text)
    owner: Any = t.c.user_id
    if backend.strict_union_types and store.settings.user_id_type != "string":
        owner = cast(owner, text_)
    life_row = select(
        number(3),
        nothing(text_),
        *(nothing(Integer()) for _ in range(3)),
        nothing(Text()),
        nothing(text_),
        owner,
        nothing(text_),
        nothing(blob),
        *(nothing(k) for k in (text_, text_, Integer(), Integer())),
        t.c.incarnation,
        nothing(text_),
        nothing(Integer()),
    ).where(visible)
    order: list[Any] = [literal_column(n) for n in ("kind", "depth", "checkpoint_id", "task_path")]
    order += [literal_column("task_id"), literal_column("idx")]
    return union_all(ancestors, write_rows, value_rows, life_row).order_by(*order)
