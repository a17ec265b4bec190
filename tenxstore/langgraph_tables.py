"""The tables of :mod:`tenxstore.langgraph` (``lg_checkpoints``, ``lg_writes``).

LangGraph checkpoints and pending writes live beside tenxstore's own tables, under
the same thread row lock and ownership rules. Values arrive serialized by LangGraph's
serde; this module stores and finds them.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import (
    Boolean,
    Integer,
    String,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.util import ClauseAdapter

from .config import RunIds, recorded_incarnation
from .crypto import BLOB, CHECKPOINT, WRITE, KeyRing, check_type, open_typed
from .deltas import MAX_DEPTH, Base, Bases, BlobWrite, BrokenChain, Stored, blob_write, rebuild
from .errors import SerializationError, StaleStateError, TenxStoreError
from .serde import decode, encode
from .store import Store


class _CodePointOrder(ColumnElement[Any]):
    """A text column ordered by code point, the order Python gives ``str``.

    LangGraph orders a checkpoint's pending writes by ``(task_path, task_id, idx)`` as
    Python compares them; a database orders text by its collation, which on PostgreSQL
    is the database's locale (``en_US.UTF-8`` puts ``"b"`` before ``"C"``, Python the
    other way round) — and the order writes are applied in decides a channel's value.
    SQLite's default ``BINARY`` collation already is code-point order, and so is the
    binary no-pad collation of tenxstore's MySQL tables (``utf8mb4_bin`` would not be:
    it pads, putting ``"a\t"`` before ``"a"``).
    """

    inherit_cache = True

    def __init__(self, column: ColumnElement[Any]) -> None:
        self.column = column
        self.type = column.type


@compiles(_CodePointOrder)
def _code_point_default(element: _CodePointOrder, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column, **kw)


@compiles(_CodePointOrder, "postgresql")
def _code_point_postgresql(element: _CodePointOrder, compiler: SQLCompiler, **kw: Any) -> str:
    return f'{compiler.process(element.column, **kw)} COLLATE "C"'


def _write_order(w: Any) -> tuple[Any, ...]:
    """ORDER BY for one checkpoint's writes: LangGraph's order, whatever the collation."""
    return (_CodePointOrder(w.c.task_path), _CodePointOrder(w.c.task_id), w.c.idx)


__all__ = ["KEY", "KeyLimits", "LangGraphTables", "Values", "needed", "run_id_of"]

_BATCH = 500  # checkpoints whose writes are read (or deleted) in one statement
_WALK = 256  # ancestors walked per query for a DeltaChannel history
KEY = 255  # the longest channel name and version lg_blobs keys hold
_LONGEST = 4 * MAX_DEPTH  # a value chain read is cut here (rebuild then says it is broken)
_REMEMBERED = 4096  # namespaces whose last prune this process remembers
INTERRUPT = "__interrupt__"  # LangGraph's channel of a pending interrupt
NS_SEP, NS_END = "|", ":"  # LangGraph's namespace separators (subgraph | node:task)


_PLAIN = re.compile(r"[A-Za-z0-9 ._:/@+-]*")


def _json_pair(key: str, value: Any) -> str | None:
    """``"key":value`` as the stored JSON writes it, escaped for LIKE; None when that
    text is not certain (numbers: ``1``, ``1.0`` and ``true`` are equal in Python; the
    pair is then checked in Python alone)."""
    if not isinstance(key, str) or not _PLAIN.fullmatch(key):
        return None
    if value is None:
        text = "null"
    elif type(value) is str and _PLAIN.fullmatch(value):
        text = f'"{value}"'
    else:
        return None
    return f'"{key}":{text}'.replace("_", "\\_")


def _has_metadata(text: str, wanted: dict[str, Any]) -> bool:
    """LangGraph's own filter: each wanted value equals the metadata's."""
    found = decode(text)
    return all(found.get(key) == value for key, value in wanted.items())


def run_id_of(metadata: dict[str, Any]) -> str | None:
    """The ``run_id`` column of a checkpoint: its metadata's (a string or a UUID), or
    for one longer than the column, ``sha256:`` and its digest."""
    run_id = metadata.get("run_id")
    if isinstance(run_id, uuid.UUID):
        return str(run_id)
    if not isinstance(run_id, str):
        return None
    if len(run_id) <= 255:
        return run_id
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256:{digest}"


def uses_delta_channels(metadata: str) -> bool:
    """Whether a checkpoint's metadata (JSON text) shows ``DeltaChannel`` bookkeeping,
    as LangGraph's own savers tell (``counters_since_delta_snapshot``)."""
    return '"counters_since_delta_snapshot"' in metadata


def needed(rows: Iterable[Any], newest: int, waiting: Iterable[str] = ()) -> set[str]:
    """The checkpoints of one namespace that pruning keeps: the ``newest`` newest and
    the ``waiting`` ones (heads of branches left at an interrupt, which a
    ``Command(resume=...)`` may still take up). A namespace of a ``DeltaChannel``
    graph is kept whole: its values are rebuilt from the ancestors' writes, and
    LangGraph's own savers do not prune it either. ``rows`` have ``checkpoint_id``
    and ``metadata``."""
    rows = list(rows)
    if any(uses_delta_channels(r.metadata) for r in rows):
        return {r.checkpoint_id for r in rows}
    ordered = sorted((r.checkpoint_id for r in rows), reverse=True)
    return set(ordered[:newest]) | set(waiting)


def _root_of(metadata: str) -> Any:
    """The root namespace's checkpoint a subgraph's checkpoint ran under (LangGraph's
    ``parents`` metadata), or None."""
    parents = decode(metadata).get("parents")
    return parents.get("") if isinstance(parents, dict) else None


@dataclass(frozen=True)
class Values:
    """A checkpoint's channel values as ``put`` stores them.

    ``versions``: the channels' versions (as text), what a reader looks up ("" for
    a None value, kept inline in the checkpoint); ``stored``: the channels whose
    value is kept in ``lg_blobs`` at their version; ``new``: the
    channels LangGraph gave a new version (their values are written, replacing what
    a checkpoint put again stored); ``dump``: a channel's value serialized
    (``(type, bytes)``), called for the new ones and for versions not stored yet.
    """

    versions: dict[str, str]
    stored: frozenset[str]
    new: frozenset[str]
    dump: Callable[[str], tuple[str, bytes]]


class _Statements:
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
        #: A checkpoint, replacing one of the same id.
        self.put_checkpoint = store.backend.upsert(c, "thread_id", "checkpoint_ns", "checkpoint_id")
        #: A namespace's head mark, moved to a checkpoint (see ``lg_heads``).
        self.put_head = store.backend.upsert(store.tables.lg_heads, "thread_id", "checkpoint_ns")
        #: A channel's value at a version, replacing one stored at that version.
        self.put_blob = store.backend.upsert(
            store.tables.lg_blobs, "thread_id", "checkpoint_ns", "channel", "version"
        )


_BLOB_COLUMNS = ("channel", "version", "type", "blob", "base", "splice", "skip", "uid")


@dataclass(frozen=True)
class _Lookup:
    """A row looked up by key from inside a query: its columns and the join condition."""

    columns: list[Any]
    on: Any
    source: Any


def _by_key(
    store: Store, table: Any, fixed: tuple[Any, ...], last: Any, names: list[str], name: str
) -> _Lookup:
    """Join ``table``'s row whose key is ``fixed`` and ``last`` (which names an outer
    column): on PostgreSQL a LATERAL subquery with LIMIT 1, which the planner runs per
    outer row by the whole key (a plain join may be planned as a scan of the thread's
    rows per step when the table's statistics are stale, as on a new database); a
    plain join elsewhere (SQLite plans it by the primary key)."""
    if store.backend.dialect == "postgresql":
        found = select(*(table.c[n] for n in names)).where(*fixed, last).limit(1).lateral(name)
        return _Lookup([found.c[n] for n in names], true(), found)
    alias = table.alias(name)
    adapt = ClauseAdapter(alias)
    conditions = [adapt.traverse(expr) for expr in (*fixed, last)]
    return _Lookup([alias.c[n] for n in names], and_(*conditions), alias)


def _chain(store: Store, thread: Any, ns: Any, named: Any) -> Any:
    """The ``lg_blobs`` rows of the values ``named`` selects (``channel``, ``version``,
    ``base``) and of every base their deltas are built on: keys walked recursively
    (UNION drops the walks that meet), each step and each row at the end looked up by
    its whole key."""
    b = store.tables.lg_blobs
    here = (b.c.thread_id == thread, b.c.checkpoint_ns == ns)
    start = named.cte("chain", recursive=True)
    step = _by_key(
        store,
        b,
        (*here, b.c.channel == start.c.channel),
        b.c.version == start.c.base,
        ["channel", "version", "base"],
        "step",
    )
    keys = start.union(select(*step.columns).select_from(start).join(step.source, step.on))
    row = _by_key(
        store,
        b,
        (*here, b.c.channel == keys.c.channel),
        b.c.version == keys.c.version,
        list(_BLOB_COLUMNS),
        "value",
    )
    return select(*row.columns).select_from(keys).join(row.source, row.on)


_HISTORY_CHANNELS = 8  # a DeltaChannel history of at most this many channels: one statement
_HISTORY_DEPTH = 10_000  # ancestors one statement walks (beyond: batches of _WALK)
# the columns of a history statement's rows: kind 0 an ancestor, 1 a write, 2 a value
_HISTORY_COLUMNS = (
    "kind", "checkpoint_id", "depth", "came", "rest", "versions", "task_id", "channel",
    "type", "value", "version", "base", "splice", "skip", "uid", "task_path", "idx",
)  # fmt: skip


def _verbatim_in_json(name: str) -> bool:
    """Whether JSON text holds ``name`` as it is (no escape), as a SQLite JSON path
    must name a key: no control character, quote, backslash or lone surrogate."""
    return all(
        char >= " " and char not in '"\\' and not "\ud800" <= char <= "\udfff" for char in name
    )


def _history_statement(store: Store, scoped: bool, count: int) -> Any:
    """A ``DeltaChannel`` history of ``count`` channels (bound ``ch0``...; ``p0``...
    their JSON paths on SQLite) from the parent of checkpoint ``id`` (NULL: the
    namespace's newest) as ONE statement:
    the ancestors, parent first, walked only as far as the nearest one that holds a
    stored value of each channel (``came``/``rest``: bit ``i`` set while channel ``i``
    is still looked for, on arriving at and on leaving the row; ``versions`` on a row
    where a channel stops), the writes of the walked ancestors to those channels, and
    the rows of the found values' chains. Each step, write and value is looked up by
    its whole key."""
    from sqlalchemy import LargeBinary, Text, cast, exists, literal_column, null, or_, union_all
    from sqlalchemy.dialects.postgresql import JSONB

    tables = store.tables
    t, c, w, b = tables.threads, tables.lg_checkpoints, tables.lg_writes, tables.lg_blobs
    pg = store.backend.dialect == "postgresql"
    thread = bindparam("t", type_=t.c.thread_id.type)
    ns = bindparam("ns", type_=String())
    names = [bindparam(f"ch{i}", type_=String()) for i in range(count)]

    def number(value: int) -> Any:
        return literal_column(str(value), Integer())

    def version(versions: Any, i: int) -> Any:
        if pg:
            return cast(versions, JSONB).op("->>", return_type=String())(names[i])
        found = func.json_extract(versions, bindparam(f"p{i}", type_=String()))
        if store.backend.dialect == "mysql":  # its JSON_EXTRACT gives JSON: "quoted"
            return func.json_unquote(found, type_=String())
        return found

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
    parent = _by_key(
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
        .where(rest != 0, walk.c.depth < _HISTORY_DEPTH)
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
    chain = _chain(store, thread, ns, keys).subquery("chain")
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
    if pg:  # per ancestor, by its key (a plan can't pick a scan of the thread's writes)
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
                _HISTORY_COLUMNS,
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
        _CodePointOrder(w_.c.task_id),
        w_.c.channel,
        w_.c.type,
        w_.c.value,
        *(nothing(k) for k in (text_, text_, Integer(), Integer(), Integer())),
        _CodePointOrder(w_.c.task_path),
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
    order: list[Any] = [literal_column(n) for n in ("kind", "depth", "checkpoint_id", "task_path")]
    order += [literal_column("task_id"), literal_column("idx")]
    return union_all(ancestors, write_rows, value_rows).order_by(*order)


class _OneStatement:
    """A put, a task's writes and a read of one checkpoint, each ONE statement, for a
    backend that runs statements at driver level (PostgreSQL in session mode).

    A put commits only the common case: the thread exists (as the run's user's, in
    the life the run read), the parent is the namespace's head as the last put marked
    it (its ``lg_heads`` row), the channels it does not change are stored as the parent
    names them, and every base its deltas extend is still there. The head row is the
    compare-and-swap: the UPDATE that moves the mark to the new checkpoint waits for a
    concurrent put and then finds the mark moved (PostgreSQL checks the row's new
    version again); a thread row lock ``FOR KEY SHARE`` waits for every locked-path
    writer and deleter (they hold ``FOR UPDATE``), and each of those that deletes or
    replaces checkpoints or values takes the mark away too (deletes the head row), so
    what this statement's snapshot read of them cannot be stale. Otherwise nothing is
    written and the put takes the locked path, which raises the precise error.
    """

    def __init__(self, store: Store) -> None:
        from sqlalchemy import BigInteger, LargeBinary, Text, cast, true
        from sqlalchemy.dialects.postgresql import ARRAY, JSONB, aggregate_order_by
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        from .backends.driver import DriverStatement

        tables = store.tables
        t, c, w, b = tables.threads, tables.lg_checkpoints, tables.lg_writes, tables.lg_blobs
        h = tables.lg_heads
        dialect = store.backend.engine.dialect
        thread = bindparam("t", type_=t.c.thread_id.type)
        ns = bindparam("ns", type_=String())

        def owner(scoped: bool, life: bool) -> Any:
            """The thread's row, locked FOR KEY SHARE, if it is the run's."""
            found = select(t.c.incarnation).where(t.c.thread_id == thread)
            if scoped:
                found = found.where(t.c.user_id == bindparam("u", type_=t.c.user_id.type))
            if life:
                life_is = bindparam("life", type_=t.c.incarnation.type)
                found = found.where(t.c.incarnation == life_is)
            return found.with_for_update(read=True, key_share=True).cte("th")

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
                .table_valued(*_BLOB_COLUMNS)
                .render_derived(name="given")
            )
            new_blobs = (
                pg_insert(b)
                .from_select(
                    ["thread_id", "checkpoint_ns", *_BLOB_COLUMNS],
                    select(thread, ns, *(given.c[name] for name in _BLOB_COLUMNS)).select_from(
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
            stmt = (
                select(
                    select(th.c.incarnation).scalar_subquery(),
                    exists(select(cas.c.checkpoint_id)),
                    beyond,
                )
                .add_cte(new_checkpoint.cte("new_checkpoint"))
                .add_cte(new_blobs.cte("new_blobs"))
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
            order = _write_order(w)
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
                    select(*(step.c[column] for column in _BLOB_COLUMNS))
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
                select(*(first.c[column] for column in _BLOB_COLUMNS), literal(0).label("depth"))
                .select_from(cp)
                .join(pairs, true())
                .join(first, true())
                .cte("chain", recursive=True)
            )
            following = blob(chain.c.channel, chain.c.base, "following")
            chain = chain.union_all(
                select(*(following.c[column] for column in _BLOB_COLUMNS), chain.c.depth + 1)
                .select_from(chain)
                .join(following, true())
                .where(chain.c.depth < _LONGEST)  # a damaged table's cycle ends here
            )
            values = (
                select(
                    *(func.array_agg(chain.c[name]).label(f"b_{name}") for name in _BLOB_COLUMNS)
                )
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


class _OneHop:
    """The same three paths as :class:`_OneStatement` for a SQLite file, each in ONE
    thread hop: the statements run on a pysqlite connection in a worker thread, a
    put and a task's writes under the write lock (``BEGIN IMMEDIATE``, which
    serializes every writer of the file: the checks and the writes see one state),
    a read in one read transaction. The same common case only; otherwise nothing is
    written and the locked path runs."""

    def __init__(self, store: Store) -> None:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        from .backends.driver import DriverStatement
        from .backends.sqlite import SqliteBackend

        backend = store.backend
        assert isinstance(backend, SqliteBackend)
        self._backend = backend
        hot = backend.hot_path
        assert hot is not None
        self._hot = hot
        tables = store.tables
        t, c, w, b = tables.threads, tables.lg_checkpoints, tables.lg_writes, tables.lg_blobs
        h = tables.lg_heads
        dialect = backend.engine.dialect
        thread = bindparam("t", type_=t.c.thread_id.type)
        ns = bindparam("ns", type_=String())

        def compiled(stmt: Any) -> DriverStatement:
            return DriverStatement(stmt, dialect)

        self.thread = compiled(select(t.c.incarnation, t.c.user_id).where(t.c.thread_id == thread))
        here = (c.c.thread_id == thread, c.c.checkpoint_ns == ns)
        one = c.c.checkpoint_id == bindparam("id", type_=String())
        marked = exists(
            select(h.c.checkpoint_id).where(
                h.c.thread_id == thread,
                h.c.checkpoint_ns == ns,
                h.c.checkpoint_id == c.c.checkpoint_id,
            )
        )
        self.parent = compiled(select(marked, c.c.versions).where(*here, one))
        blob_key = (
            b.c.thread_id == thread,
            b.c.checkpoint_ns == ns,
            b.c.channel == bindparam("ch", type_=String()),
            b.c.version == bindparam("ver", type_=String()),
        )
        self.blob_uid = compiled(select(b.c.uid).where(*blob_key))
        self.move_mark = compiled(
            update(h)
            .where(h.c.thread_id == thread, h.c.checkpoint_ns == ns)
            .values(checkpoint_id=bindparam("id", type_=String()))
        )
        names = [
            "thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "type",
            "checkpoint", "metadata", "created_at", "run_id", "versions",
        ]  # fmt: skip
        self.new_checkpoint = compiled(
            insert(c).values({name: bindparam(f"c_{name}", type_=c.c[name].type) for name in names})
        )
        self.new_blob = compiled(
            insert(b).values(
                {
                    name: bindparam(f"b_{name}", type_=b.c[name].type)
                    for name in ("thread_id", "checkpoint_ns", *_BLOB_COLUMNS)
                }
            )
        )
        self.beyond = compiled(
            select(c.c.checkpoint_id)
            .where(*here)
            .order_by(c.c.checkpoint_id.desc())
            .offset(bindparam("off", type_=Integer()))
            .limit(1)
        )
        write_names = ("task_id", "idx", "channel", "type", "value", "task_path")
        ins = sqlite_insert(w).values(
            {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": bindparam("id", type_=String()),
                **{name: bindparam(f"w_{name}", type_=w.c[name].type) for name in write_names},
            }
        )
        self.new_write = compiled(
            ins.on_conflict_do_update(
                index_elements=["thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                set_={
                    name: ins.excluded[name] for name in ("channel", "type", "value", "task_path")
                },
                where=w.c.idx < 0,
            )
        )
        chosen = (
            select(*c.c, t.c.incarnation, t.c.user_id)
            .join(t, t.c.thread_id == c.c.thread_id)
            .where(*here)
            .order_by(c.c.checkpoint_id.desc())
            .limit(1)
        )
        own = t.c.user_id == bindparam("u", type_=t.c.user_id.type)
        self.read_stmts = {
            (False, False): compiled(chosen),
            (True, False): compiled(chosen.where(own)),
            (False, True): compiled(chosen.where(one)),
            (True, True): compiled(chosen.where(one, own)),
        }
        self.head = compiled(select(func.max(c.c.checkpoint_id)).where(*here))
        self.writes = compiled(
            select(w.c.task_id, w.c.channel, w.c.type, w.c.value)
            .where(
                w.c.thread_id == thread,
                w.c.checkpoint_ns == ns,
                w.c.checkpoint_id == bindparam("id", type_=String()),
            )
            .order_by(*_write_order(w))
        )
        pairs = func.json_each(bindparam("versions", type_=String())).table_valued("key", "value")
        first = select(*(b.c[name] for name in _BLOB_COLUMNS)).join(
            pairs,
            and_(b.c.channel == pairs.c.key, b.c.version == pairs.c.value),
        )
        first = first.where(b.c.thread_id == thread, b.c.checkpoint_ns == ns)
        chain = first.add_columns(literal(0).label("depth")).cte("chain", recursive=True)
        step = b.alias("step")
        chain = chain.union_all(
            select(*(step.c[name] for name in _BLOB_COLUMNS), chain.c.depth + 1)
            .join(
                chain,
                and_(
                    step.c.thread_id == thread,
                    step.c.checkpoint_ns == ns,
                    step.c.channel == chain.c.channel,
                    step.c.version == chain.c.base,
                ),
            )
            .where(chain.c.depth < _LONGEST)  # a damaged table's cycle ends here
        )
        self.chain = compiled(select(*(chain.c[name] for name in _BLOB_COLUMNS)))

    async def put(self, scoped: bool, values: dict[str, Any]) -> tuple[int, Any] | None:
        """As :meth:`_OneStatement.put`."""
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
                    **{f"b_{name}": value for name, value in zip(_BLOB_COLUMNS, row, strict=True)},
                }
                for row in columns
            ]
            self._hot.execute_many(cursor, self.new_blob, rows)
        return int(found[0]), None if beyond is None else beyond[0]

    async def put_writes(self, scoped: bool, values: dict[str, Any]) -> bool:
        """As :meth:`_OneStatement.put_writes`."""
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

    async def fetch(self, stmt: Any, values: dict[str, Any]) -> list[Any]:
        """The rows of one statement, in one read transaction, in one thread hop."""
        return await self._backend.read_in_thread(
            lambda cursor: self._hot.execute(cursor, stmt, values).fetchall()
        )

    async def read(self, scoped: bool, values: dict[str, Any]) -> Mapping[str, Any] | None:
        """As :meth:`_OneStatement.read`."""
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
            blobs = run(cursor, self.chain, {**v, "versions": record["versions"]}).fetchall()
        for i, name in enumerate(_BLOB_COLUMNS):
            record[f"b_{name}"] = [r[i] for r in blobs]
        return record


@dataclass(frozen=True)
class KeyLimits:
    """The longest strings the LangGraph key columns hold on this database (255
    characters; on MySQL, whose InnoDB keys are at most 3072 bytes, fewer)."""

    namespace: int
    channel: int
    version: int
    task_id: int
    checkpoint_id: int

    @classmethod
    def of(cls, store: Store) -> KeyLimits:
        dialect = store.backend.engine.dialect
        tables = store.tables

        def length(column: Any) -> int:
            found = getattr(column.type.dialect_impl(dialect), "length", None)
            return int(found) if found else KEY

        return cls(
            namespace=min(
                length(t.c.checkpoint_ns) for t in (tables.lg_checkpoints, tables.lg_blobs)
            ),
            channel=length(tables.lg_blobs.c.channel),
            version=length(tables.lg_blobs.c.version),
            task_id=length(tables.lg_writes.c.task_id),
            checkpoint_id=length(tables.lg_checkpoints.c.checkpoint_id),
        )

    def storable(self, channel: str, version: str = "") -> bool:
        """Whether a channel's value at a version can be kept in ``lg_blobs`` (else it
        stays inline in its checkpoint): a name and version the key columns hold, as
        written (no U+0000, which some databases do not keep in text)."""
        return (
            len(channel) <= self.channel
            and len(version) <= self.version
            and "\x00" not in channel
            and "\x00" not in version
        )


class LangGraphTables:
    """LangGraph checkpoints and writes of a repository's threads."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._sql = _Statements(store)
        self._histories: dict[tuple[bool, int], tuple[Any, Any]] = {}
        # (thread, namespace) -> checkpoints its last prune kept (in this process)
        self._kept: OrderedDict[tuple[Any, str], int] = OrderedDict()
        # (thread, namespace) -> puts in this process (a count, for the looks)
        self._puts: dict[tuple[Any, str], int] = {}
        # namespaces a one-statement put found due for pruning (the next put prunes)
        self._due: set[tuple[Any, str]] = set()
        # (thread, namespace, channel) -> the value a next version may be a delta of
        self._bases = Bases()
        self._one: _OneStatement | _OneHop | None = None
        self.limits = KeyLimits.of(store)

    def _one_statement(self) -> _OneStatement | _OneHop | None:
        """The one-round-trip paths: one statement where the backend runs statements at
        driver level (PostgreSQL), one thread hop on a SQLite file; None otherwise."""
        backend = self._store.backend
        if self._one is None:
            if backend.one_statement_writes:
                self._one = _OneStatement(self._store)
            elif getattr(backend, "hot_path", None) is not None:
                self._one = _OneHop(self._store)
        elif isinstance(self._one, _OneStatement) and not backend.one_statement_writes:
            return None
        return self._one

    @property
    def keys(self) -> KeyRing | None:
        """The key ring values are sealed with, or None."""
        return self._store.keys

    def thread_id_of(self, config: dict[str, Any]) -> Any:
        """The thread id of a call, as validated (an int for int id types)."""
        return self._store.ids(config).thread_id

    def _seal(self, kind: str, data: bytes, thread_id: Any, column: str) -> tuple[str, bytes]:
        """A ``(type, bytes)`` as it is stored: sealed when a key ring is configured
        (then the type may be 63 characters: the mark of a sealed value takes one)."""
        keys = self._store.keys
        check_type(kind, sealed=keys is not None)
        return (kind, data) if keys is None else keys.seal_typed(kind, data, thread_id, column)

    def _sealed(
        self, kind: str, data: bytes, thread_id: Any, column: str, name: str
    ) -> dict[str, Any]:
        """``{"type": ..., name: ...}`` as stored (see :meth:`_seal`)."""
        kind, data = self._seal(kind, data, thread_id, column)
        return {"type": kind, name: data}

    def _stored(self, thread_id: Any, r: Any, data: Any) -> Stored:
        """An ``lg_blobs`` row (its bytes ``data``) as a :class:`Stored`, opened."""
        kind, blob = open_typed(self._store.keys, r.type, bytes(data), thread_id, BLOB)
        return Stored(kind, blob, r.base, r.splice, r.skip, r.uid)

    def _blob_writes(self, thread_id: Any, ns: str, values: Values | None) -> list[BlobWrite]:
        """The new values of a put, serialized (outside any lock), each as a delta of
        the channel's last value this process knows where it can be."""
        if values is None:
            return []
        return [
            blob_write(ch, v, values.dump(ch), self._bases.get((thread_id, ns, ch)))
            for ch, v in values.versions.items()
            if ch in values.stored and ch in values.new
        ]

    def _learn(self, thread_id: Any, ns: str, written: Iterable[BlobWrite]) -> None:
        """Remember what a committed put wrote: its next versions' bases."""
        for bw in written:
            self._bases.put((thread_id, ns, bw.channel), bw.remembered())

    async def put(
        self,
        config: dict[str, Any],
        ns: str,
        checkpoint_id: str,
        parent_id: str | None,
        typed: tuple[str, bytes],
        metadata: str,
        history_limit: int | None,
        seen_head: str | None = None,
        run_id: str | None = None,
        values: Values | None = None,
        found_empty: bool = False,
    ) -> int:
        """Store one checkpoint; return the thread's incarnation.

        The namespace's newest checkpoint must be the parent (the run continues from
        the head), or the head the run saw when it read (``seen_head``: a run resumed
        from an older checkpoint forks from there, on purpose). Otherwise another run
        committed after this one read: StaleStateError, so two runs that started from
        the same head cannot both commit. A parent that no longer exists, or an
        incarnation in ``config`` (recorded when the run read) that is not the
        thread's, means the thread was deleted or replaced since the run read it:
        StaleStateError with ``replaced``.

        ``values`` are the checkpoint's channel values, kept in ``lg_blobs`` by
        channel and version: a version already stored is not serialized again. A
        first checkpoint (no parent) of a run that read the namespace empty
        (``found_empty``) needs it empty still.
        """
        ids = self._store.ids(config)
        now = self._store.now()
        typed = self._seal(typed[0], typed[1], ids.thread_id, CHECKPOINT)
        key = (ids.thread_id, ns)
        limit = history_limit
        # pruned once the namespace holds half the limit more than it kept last (a
        # prune costs a transaction of its own: ~8 ms on PostgreSQL for 150 checkpoints)
        probe = (
            None
            if limit is None
            else max(self._kept.get(key, limit), limit) + max(limit // 2, 1) - 2
        )
        # the look costs a walk of the index past ``probe`` entries: made on a
        # namespace's first put in this process, then every tenth of the limit
        puts = self._puts.get(key, 0)
        look = limit is not None and puts % max(limit // 10, 1) == 0
        if len(self._puts) >= _REMEMBERED and key not in self._puts:
            self._puts.clear()  # bounded: a namespace forgotten is looked at again
        self._puts[key] = puts + 1
        if self._store.store_id is None:
            await self._store.ensure_ready()
        if key in self._due and limit is not None:
            self._due.discard(key)
            await self._prune_due(ids.thread_id, ns, limit)
        blobs = self._blob_writes(ids.thread_id, ns, values)
        one = self._one_statement()
        if one is not None and parent_id is not None and values is not None:
            done = await self._put_at_once(
                one, ids, config, ns, checkpoint_id, parent_id, typed, metadata, now, run_id,
                values, blobs, probe or 0, look,
            )  # fmt: skip
            if done is not None:
                self._learn(ids.thread_id, ns, blobs)
                if limit is not None and done[1] is not None:
                    if len(self._due) >= _REMEMBERED:
                        self._due.clear()  # bounded: those are looked at again later
                    self._due.add(key)  # by the next put, before it writes
                return done[0]
        async with self._store.write(ids.thread_id) as (conn, locked):
            self._same_life(config, ids, locked, parent_id)
            row = await self._store.claim_thread(conn, ids, locked, now)
            newest, has_parent, beyond = (
                await conn.execute(
                    self._sql.look,
                    {"t": ids.thread_id, "ns": ns, "parent": parent_id, "off": probe or 0},
                )
            ).one()
            if parent_id is None and found_empty and newest is not None:
                raise StaleStateError(
                    ids.thread_id,
                    "(none)",
                    newest,
                    message=f"thread {ids.thread_id!r}: another run wrote checkpoint {newest} "
                    "after this run found the thread empty; two runs from one head cannot "
                    "both commit: read the state again (get_state) and run again",
                )
            if parent_id is not None and newest != parent_id:
                gone = has_parent is None
                if gone and recorded_incarnation(config) is not None:  # the same life
                    raise StaleStateError(
                        ids.thread_id,
                        parent_id,
                        newest or "(none)",
                        message=f"thread {ids.thread_id!r}: checkpoint {parent_id} is no longer "
                        "stored (pruned by history_limit, aprune or delete_for_runs): run "
                        "from a newer checkpoint (get_state_history), or raise history_limit",
                    )
                if gone or newest != seen_head:
                    raise StaleStateError(
                        ids.thread_id, seen_head or parent_id, newest or "(none)", replaced=gone
                    )
            # a new newest checkpoint takes the mark; a checkpoint put again (or an
            # older one) leaves none where it replaced or deleted values, so a
            # one-statement put whose snapshot predates this one writes nothing
            head = newest is None or checkpoint_id > newest
            await conn.execute(
                self._sql.put_checkpoint,
                {
                    "thread_id": ids.thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                    "parent_checkpoint_id": parent_id,
                    "type": typed[0],
                    "checkpoint": typed[1],
                    "metadata": metadata,
                    "created_at": now,
                    "run_id": run_id,
                    "versions": None if values is None else encode(values.versions, "versions"),
                },
            )
            h = self._store.tables.lg_heads
            if head:  # the mark a one-statement put takes over moves to this one
                await conn.execute(
                    self._sql.put_head,
                    {
                        "thread_id": ids.thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": checkpoint_id,
                    },
                )
            else:  # a checkpoint put again loses its mark (its row was replaced)
                await conn.execute(
                    delete(h).where(
                        h.c.thread_id == ids.thread_id,
                        h.c.checkpoint_ns == ns,
                        h.c.checkpoint_id == checkpoint_id,
                    )
                )
            if values is not None:
                blobs, replaced = await self._put_values(conn, ids.thread_id, ns, values, blobs)
                if replaced and not head:
                    await self._unmark(conn, ids.thread_id, ns)
            if limit is not None and beyond is not None:  # grown by half the limit since
                # (with the mark moved to this put, the old head's is gone already: a put
                # racing this one fails)
                kept, pruned = await self._prune_namespace(
                    conn, ids.thread_id, ns, limit, unmark=not head
                )
                # Nothing to prune (a DeltaChannel graph's namespace, kept whole): look
                # again when it has doubled, so the looks cost O(1) per put.
                self._remember(key, kept if pruned else 2 * kept)
        self._learn(ids.thread_id, ns, blobs)
        incarnation: int = row.incarnation
        return incarnation

    async def _put_at_once(
        self,
        one: _OneStatement | _OneHop,
        ids: RunIds,
        config: dict[str, Any],
        ns: str,
        checkpoint_id: str,
        parent_id: str,
        typed: tuple[str, bytes],
        metadata: str,
        now: Any,
        run_id: str | None,
        values: Values,
        blobs: list[BlobWrite],
        probe: int,
        look: bool,
    ) -> tuple[int, Any] | None:
        """The put in one round trip (see :class:`_OneStatement`): ``(incarnation, the
        checkpoint at offset probe or None)``, or None when it wrote nothing."""
        life = recorded_incarnation(config)
        unchanged = {ch: v for ch, v in values.versions.items() if ch not in values.new}
        based = [bw for bw in blobs if bw.base is not None]
        sealed = [self._seal(bw.type, bw.blob, ids.thread_id, BLOB) for bw in blobs]
        return await one.put(
            ids.isolated,
            {
                "t": ids.thread_id,
                "ns": ns,
                "u": ids.user_id,
                "life": life,
                "id": checkpoint_id,
                "parent": parent_id,
                "type": typed[0],
                "checkpoint": typed[1],
                "metadata": metadata,
                "now": now,
                "run": run_id,
                "versions": encode(values.versions, "versions"),
                "old": encode(unchanged, "versions"),
                "bc": [bw.channel for bw in based],
                "bv": [bw.base.version for bw in based if bw.base is not None],
                "bu": [bw.base.uid for bw in based if bw.base is not None],
                "nb": len(based),
                "ch": [bw.channel for bw in blobs],
                "ver": [bw.version for bw in blobs],
                "ty": [kind for kind, _ in sealed],
                "bl": [data for _, data in sealed],
                "ba": [None if bw.base is None else bw.base.version for bw in blobs],
                "sp": [bw.splice for bw in blobs],
                "sk": [bw.skip for bw in blobs],
                "ui": [bw.uid for bw in blobs],
                "off": probe,
                "look": look,
            },
        )

    async def _prune_due(self, thread_id: Any, ns: str, limit: int) -> None:
        """Prune a namespace that a one-statement put found grown (in a transaction of
        its own, before the next put writes: a put that committed never fails, nor is
        held up, by housekeeping). A prune that cannot run now (a lock held too long, a
        lost connection, any database error) is left for a later put, which looks
        again; a cancellation propagates (nothing of this put was written)."""
        try:
            async with self._store.write(thread_id) as (conn, _):
                kept, pruned = await self._prune_namespace(conn, thread_id, ns, limit)
        except (TenxStoreError, DBAPIError):
            return
        self._remember((thread_id, ns), kept if pruned else 2 * kept)

    async def _put_values(
        self, conn: Any, thread_id: Any, ns: str, values: Values, fresh: list[BlobWrite]
    ) -> tuple[list[BlobWrite], bool]:
        """Store a checkpoint's new values (``fresh``: a delta whose base is no longer
        there is written whole), and those of its other versions that are not stored
        yet (a run that goes on from a checkpoint written before 0005); what was
        written of ``fresh``, and whether a stored value was replaced (a version
        stored already is: a checkpoint put again with other values reads them)."""
        b = self._store.tables.lg_blobs
        here = (b.c.thread_id == thread_id, b.c.checkpoint_ns == ns)
        older = [(ch, v) for ch, v in values.versions.items() if ch in values.stored - values.new]
        bases = [(bw.channel, bw.base.version) for bw in fresh if bw.base is not None]
        keys = [(bw.channel, bw.version) for bw in fresh]
        wanted = sorted(set(older + bases + keys))
        there: set[tuple[str, str, int]] = set()
        for start in range(0, len(wanted), _BATCH):  # under the thread's lock
            found = await conn.execute(
                select(b.c.channel, b.c.version, b.c.uid).where(
                    *here, tuple_(b.c.channel, b.c.version).in_(wanted[start : start + _BATCH])
                )
            )
            there.update((r.channel, r.version, r.uid) for r in found)
        stored = {(channel, version) for channel, version, _ in there}
        # a delta is written on its base only if that very row is still there
        fresh = [
            bw
            if bw.base is None or (bw.channel, bw.base.version, bw.base.uid) in there
            else bw.as_whole()
            for bw in fresh
        ]
        replaced = stored & set(keys)
        if replaced:  # a checkpoint put again: what rests on its values is made whole
            await self._unbase(conn, thread_id, ns, sorted(replaced))
        unstored = [
            blob_write(ch, v, values.dump(ch), None) for ch, v in older if (ch, v) not in stored
        ]
        rows = [
            {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "channel": bw.channel,
                "version": bw.version,
                **self._sealed(bw.type, bw.blob, thread_id, BLOB, "blob"),
                "base": None if bw.base is None else bw.base.version,
                "splice": bw.splice,
                "skip": bw.skip,
                "uid": bw.uid,
            }
            for bw in fresh + unstored
        ]
        if rows:  # one statement for all
            await conn.execute(self._sql.put_blob, rows)
        return fresh, bool(replaced)

    async def _unmark(self, conn: Any, thread_id: Any, ns: str) -> None:
        """Take the head mark away in a namespace: the next put takes the locked path."""
        h = self._store.tables.lg_heads
        await conn.execute(delete(h).where(h.c.thread_id == thread_id, h.c.checkpoint_ns == ns))

    async def _unbase(
        self, conn: Any, thread_id: Any, ns: str, replaced: list[tuple[str, str]]
    ) -> None:
        """Before values stored at these versions are replaced (a checkpoint put again
        with other values), the deltas resting on them are written whole."""
        b = self._store.tables.lg_blobs
        here = (b.c.thread_id == thread_id, b.c.checkpoint_ns == ns)
        for start in range(0, len(replaced), _BATCH):
            batch = replaced[start : start + _BATCH]
            resting = select(b.c.channel, b.c.version, b.c.base).where(
                *here, b.c.base.is_not(None), tuple_(b.c.channel, b.c.base).in_(batch)
            )
            stored: dict[str, dict[str, Stored]] = {}
            for r in await conn.execute(_chain(self._store, thread_id, ns, resting)):
                stored.setdefault(r.channel, {})[r.version] = self._stored(thread_id, r, r.blob)
            for channel, rows in stored.items():
                for version, row in rows.items():
                    if row.base is None or (channel, row.base) not in batch:
                        continue
                    kind, whole, _, _ = rebuild(rows, version)
                    kind, whole = self._seal(kind, whole, thread_id, BLOB)
                    await conn.execute(
                        update(b)
                        .where(*here, b.c.channel == channel, b.c.version == version)
                        .values(type=kind, blob=whole, base=None, splice=None, skip=None)
                    )

    def _remember(self, key: tuple[Any, str], kept: int) -> None:
        """How many checkpoints a namespace's last prune kept (the next looks past it
        and half the limit): in this process, for the most recent namespaces."""
        self._kept.pop(key, None)
        self._kept[key] = kept
        while len(self._kept) > _REMEMBERED:
            self._kept.popitem(last=False)

    async def _prune_namespace(
        self,
        conn: Any,
        thread_id: Any,
        ns: str,
        newest: int,
        *,
        branches: bool = True,
        unmark: bool = True,
    ) -> tuple[int, int]:
        """Delete a namespace's checkpoints (and writes) but the newest ``newest`` and
        what they need (:func:`needed`; with ``branches``, the heads of branches left
        at an interrupt, and the subgraph runs of the root checkpoints it pruned); how
        many are kept, and how many pruned."""
        c, w = self._store.tables.lg_checkpoints, self._store.tables.lg_writes
        here = and_(c.c.thread_id == thread_id, c.c.checkpoint_ns == ns)
        rows = (
            await conn.execute(
                select(c.c.checkpoint_id, c.c.parent_checkpoint_id, c.c.metadata).where(here)
            )
        ).all()
        waiting: list[str] = []
        if branches:
            has_child = {r.parent_checkpoint_id for r in rows}
            heads = [r.checkpoint_id for r in rows if r.checkpoint_id not in has_child]
            for start in range(0, len(heads), _BATCH):
                found = await conn.execute(
                    select(w.c.checkpoint_id)
                    .where(
                        w.c.thread_id == thread_id,
                        w.c.checkpoint_ns == ns,
                        w.c.checkpoint_id.in_(heads[start : start + _BATCH]),
                        w.c.channel == INTERRUPT,
                    )
                    .distinct()
                )
                waiting.extend(found.scalars())
        keep = needed(rows, newest, waiting)
        doomed = [r.checkpoint_id for r in rows if r.checkpoint_id not in keep]
        await self._delete(conn, thread_id, ns, doomed, unmark=unmark)
        if ns == "" and doomed and branches:  # aprune keeps each namespace's newest
            await self._prune_subgraph_runs(conn, thread_id, keep)
        return len(keep), len(doomed)

    async def _delete(
        self, conn: Any, thread_id: Any, ns: str, doomed: list[str], *, unmark: bool = True
    ) -> None:
        """Delete these checkpoints of a namespace, with their writes and the values no
        checkpoint left needs. With ``unmark``, the namespace's head loses its mark, so
        a one-statement put whose snapshot predates this deletion writes nothing (its
        delta's base may be gone): the next put takes the locked path and marks again."""
        c, w = self._store.tables.lg_checkpoints, self._store.tables.lg_writes
        for start in range(0, len(doomed), _BATCH):
            batch = doomed[start : start + _BATCH]
            for table in (w, c):
                await conn.execute(
                    delete(table).where(
                        table.c.thread_id == thread_id,
                        table.c.checkpoint_ns == ns,
                        table.c.checkpoint_id.in_(batch),
                    )
                )
        if doomed:
            if unmark:
                await self._unmark(conn, thread_id, ns)
            await self._collect(conn, thread_id, ns)

    async def _collect(self, conn: Any, thread_id: Any, ns: str) -> None:
        """Delete the values of a namespace that no checkpoint of it needs any more: not
        named by one, nor the base of a delta that is kept."""
        c, b = self._store.tables.lg_checkpoints, self._store.tables.lg_blobs
        needed: set[tuple[str, str]] = set()
        versions = select(c.c.versions).where(
            c.c.thread_id == thread_id, c.c.checkpoint_ns == ns, c.c.versions.is_not(None)
        )
        for text in (await conn.execute(versions)).scalars():
            needed.update(decode(text).items())
        here = (b.c.thread_id == thread_id, b.c.checkpoint_ns == ns)
        stored = await conn.execute(select(b.c.channel, b.c.version, b.c.base).where(*here))
        base_of = {(r.channel, r.version): r.base for r in stored}
        walk = [key for key in needed if key in base_of]
        while walk:
            channel, version = walk.pop()
            base = base_of[(channel, version)]
            if base is not None and (channel, base) not in needed:
                needed.add((channel, base))
                if (channel, base) in base_of:
                    walk.append((channel, base))
        doomed = sorted(set(base_of) - needed)
        for start in range(0, len(doomed), _BATCH):
            batch = doomed[start : start + _BATCH]
            await conn.execute(delete(b).where(*here, tuple_(b.c.channel, b.c.version).in_(batch)))

    async def _prune_subgraph_runs(self, conn: Any, thread_id: Any, roots: set[str]) -> None:
        """Delete the namespaces of subgraph runs (``node:task``: one per run) all of
        whose checkpoints ran under root checkpoints older than every one kept (ids
        sort by time). A subgraph with a namespace of its own across runs
        (``checkpointer=True``) is left alone."""
        c = self._store.tables.lg_checkpoints
        rows = await conn.execute(
            select(c.c.checkpoint_ns, c.c.checkpoint_id, c.c.metadata).where(
                c.c.thread_id == thread_id, c.c.checkpoint_ns != ""
            )
        )
        spaces: dict[str, list[Any]] = {}
        for row in rows:
            spaces.setdefault(row.checkpoint_ns, []).append(row)
        for ns, members in spaces.items():
            if not all(NS_END in part for part in ns.split(NS_SEP)):
                continue
            under = {_root_of(r.metadata) for r in members}
            # Older than every root checkpoint kept: a run under a root checkpoint
            # whose own put has not landed yet (puts run concurrently) stays.
            if None not in under and max(under) < min(roots):
                await self._delete(conn, thread_id, ns, [r.checkpoint_id for r in members])
                self._kept.pop((thread_id, ns), None)

    @staticmethod
    def _same_life(config: dict[str, Any], ids: RunIds, locked: Any, parent: Any) -> None:
        """Refuse a write of a run that read another life of the thread."""
        expected = recorded_incarnation(config)
        if expected is not None and (locked is None or locked.incarnation != expected):
            actual = "(none)" if locked is None else locked.version
            raise StaleStateError(ids.thread_id, parent or 0, actual, replaced=True)

    async def put_writes(
        self,
        config: dict[str, Any],
        ns: str,
        checkpoint_id: str,
        rows: list[dict[str, Any]],
    ) -> None:
        """Store a task's writes: a write already stored is kept, except the special
        channels (negative ``idx``: errors, interrupts...), whose latest write wins."""
        ids = self._store.ids(config)
        w = self._store.tables.lg_writes
        now = self._store.now()
        unique: dict[tuple[Any, int], dict[str, Any]] = {}
        for row in rows:  # within the call too: the first write, or the latest special one
            if row["idx"] < 0:
                unique[(row["task_id"], row["idx"])] = row
            else:
                unique.setdefault((row["task_id"], row["idx"]), row)
        rows = [
            {
                **row,
                **self._sealed(row["type"], row["value"], ids.thread_id, WRITE, "value"),
            }
            for row in unique.values()
        ]
        if self._store.store_id is None:
            await self._store.ensure_ready()
        one = self._one_statement()
        if one is not None and rows:  # one statement when the thread is there, the run's
            life = recorded_incarnation(config)
            stored = await one.put_writes(
                ids.isolated,
                {
                    "t": ids.thread_id,
                    "ns": ns,
                    "u": ids.user_id,
                    "life": life,
                    "id": checkpoint_id,
                    **{
                        key: [row[name] for row in rows]
                        for key, name in (
                            ("ta", "task_id"),
                            ("ix", "idx"),
                            ("ch", "channel"),
                            ("ty", "type"),
                            ("va", "value"),
                            ("pa", "task_path"),
                        )
                    },
                },
            )
            if stored:
                return
        here = (w.c.thread_id == ids.thread_id, w.c.checkpoint_ns == ns)
        keep_first = self._store.backend.insert_ignore(
            w, "thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"
        )
        async with self._store.write(ids.thread_id) as (conn, locked):
            self._same_life(config, ids, locked, checkpoint_id)
            await self._store.claim_thread(conn, ids, locked, now)
            for task_id in {row["task_id"] for row in rows if row["idx"] < 0}:
                special = [r["idx"] for r in rows if r["idx"] < 0 and r["task_id"] == task_id]
                await conn.execute(
                    delete(w).where(
                        *here,
                        w.c.checkpoint_id == checkpoint_id,
                        w.c.task_id == task_id,
                        w.c.idx.in_(special),
                    )
                )
            if rows:
                await conn.execute(
                    keep_first,
                    [
                        {
                            "thread_id": ids.thread_id,
                            "checkpoint_ns": ns,
                            "checkpoint_id": checkpoint_id,
                            **row,
                        }
                        for row in rows
                    ],
                )

    async def rows(
        self,
        config: dict[str, Any],
        ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None,
        metadata: dict[str, Any] | None = None,
    ) -> list[tuple[Any, list[Any], dict[str, tuple[str, bytes]]]]:
        """Checkpoints newest first (with their writes, and the values they name in
        ``lg_blobs``: ``{channel: (type, blob)}``), narrowed as asked.

        A config without a thread lists every thread the caller may see: the user's
        while isolation applies, every thread otherwise. ``metadata`` keeps the
        checkpoints whose metadata has those top-level values: narrowed in SQL by
        each pair's JSON text (for keys and values whose text is plain), then checked
        exactly; writes are read only for the checkpoints returned. One checkpoint
        of a thread's namespace is read in one round trip where the backend has such
        a path.
        """
        store = self._store
        c, w = store.tables.lg_checkpoints, store.tables.lg_writes
        ids = store.ids(config, need_thread=False)
        one_thread = ids.thread_id is not None
        single = one_thread and ns is not None and limit == 1 and before is None
        single = single and not metadata
        learn = single and checkpoint_id is None  # a run's read of the head
        if store.store_id is None:
            await store.ensure_ready()
        one = self._one_statement()
        if one is not None and single:
            assert ns is not None
            return await self._read_at_once(one, ids, ns, checkpoint_id)
        t = store.tables.threads
        newest = c.alias("newest")
        head = (
            select(func.max(newest.c.checkpoint_id))
            .where(
                newest.c.thread_id == c.c.thread_id,
                newest.c.checkpoint_ns == c.c.checkpoint_ns,
            )
            .scalar_subquery()
        )
        stmt = select(*c.c, t.c.incarnation, t.c.user_id, head.label("head")).join(
            t, t.c.thread_id == c.c.thread_id
        )
        if one_thread:
            stmt = stmt.where(c.c.thread_id == store.visible_thread(ids))
        elif ids.isolated:
            stmt = stmt.where(t.c.user_id == ids.user_id)
        if ns is not None:
            stmt = stmt.where(c.c.checkpoint_ns == ns)
        if checkpoint_id is not None:
            stmt = stmt.where(c.c.checkpoint_id == checkpoint_id)
        if before is not None:
            stmt = stmt.where(c.c.checkpoint_id < before)
        for name, value in (metadata or {}).items():
            fragment = _json_pair(name, value)
            if fragment is not None:
                stmt = stmt.where(c.c.metadata.like(f"%{fragment}%", escape="\\"))
        if one_thread:  # newest first across its namespaces
            stmt = stmt.order_by(c.c.checkpoint_id.desc(), c.c.checkpoint_ns)
        else:
            stmt = stmt.order_by(c.c.thread_id, c.c.checkpoint_ns, c.c.checkpoint_id.desc())
        if limit is not None and not metadata:
            stmt = stmt.limit(limit)
        async with store.snapshot() as conn:
            rows = (await conn.execute(stmt)).all()
            if metadata:
                rows = [r for r in rows if _has_metadata(r.metadata, metadata)][:limit]
            writes: dict[tuple[Any, str, str], list[Any]] = {
                (r.thread_id, r.checkpoint_ns, r.checkpoint_id): [] for r in rows
            }
            # One query per batch of checkpoints, not one per checkpoint.
            for start in range(0, len(rows), _BATCH):
                batch = rows[start : start + _BATCH]
                found = await conn.execute(
                    select(
                        w.c.thread_id,
                        w.c.checkpoint_ns,
                        w.c.checkpoint_id,
                        w.c.task_id,
                        w.c.channel,
                        w.c.type,
                        w.c.value,
                    )
                    .where(
                        w.c.thread_id.in_({r.thread_id for r in batch}),
                        w.c.checkpoint_id.in_({r.checkpoint_id for r in batch}),
                    )
                    .order_by(*_write_order(w))
                )
                for write in found:
                    key = (write.thread_id, write.checkpoint_ns, write.checkpoint_id)
                    if key in writes:
                        writes[key].append(write)
            values = await self._values(conn, rows, learn=learn)
        return [
            (
                row,
                writes[(row.thread_id, row.checkpoint_ns, row.checkpoint_id)],
                values.get((row.thread_id, row.checkpoint_ns, row.checkpoint_id), {}),
            )
            for row in rows
        ]

    async def _read_at_once(
        self, one: _OneStatement | _OneHop, ids: RunIds, ns: str, checkpoint_id: str | None
    ) -> list[tuple[Any, list[Any], dict[str, tuple[str, bytes]]]]:
        """One checkpoint (the head when no id is given) with its writes and values, in
        one round trip."""
        found = await one.read(
            ids.isolated, {"t": ids.thread_id, "ns": ns, "u": ids.user_id, "id": checkpoint_id}
        )
        if found is None:
            return []
        row = SimpleNamespace(**found)
        writes = [
            SimpleNamespace(task_id=task, channel=channel, type=kind, value=value)
            for task, channel, kind, value in zip(
                row.w_task_id or (),
                row.w_channel or (),
                row.w_type or (),
                row.w_value or (),
                strict=True,
            )
        ]
        stored: dict[str, dict[str, Stored]] = {}
        for channel, version, kind, blob, base, splice, skip, uid in zip(
            *(getattr(row, f"b_{name}") or () for name in _BLOB_COLUMNS), strict=True
        ):
            kind, blob = open_typed(self._store.keys, kind, blob, row.thread_id, BLOB)
            stored.setdefault(channel, {})[version] = Stored(kind, blob, base, splice, skip, uid)
        values: dict[str, tuple[str, bytes]] = {}
        if row.versions is not None:
            values = self._rebuilt(
                row.thread_id, ns, decode(row.versions), stored, learn=checkpoint_id is None
            )
        return [(row, writes, values)]

    def _rebuilt(
        self,
        thread_id: Any,
        ns: str,
        versions: dict[str, str],
        stored: dict[str, dict[str, Stored]],
        *,
        learn: bool,
    ) -> dict[str, tuple[str, bytes]]:
        """A checkpoint's values ``{channel: (type, bytes)}`` from the rows of their
        chains (``learn``: remember them as the next versions' bases)."""
        values: dict[str, tuple[str, bytes]] = {}
        for channel, version in versions.items():
            rows = stored.get(channel)
            if not rows or version not in rows:
                continue  # a channel without a value
            try:
                kind, data, depth, tails = rebuild(rows, version)
            except BrokenChain as exc:
                raise SerializationError(
                    f"thread {thread_id!r}: the value of channel {channel!r} at version "
                    f"{version} cannot be rebuilt: {exc}"
                ) from exc
            values[channel] = (kind, data)
            if learn and rows[version].uid:  # uid 0: migrated or imported, not unique
                base = Base(version, rows[version].uid, kind, data, depth, tails)
                self._bases.put((thread_id, ns, channel), base)
        return values

    async def _values(
        self,
        conn: Any,
        rows: Sequence[Any],
        *,
        learn: bool = False,
    ) -> dict[tuple[Any, str, str], dict[str, tuple[str, bytes]]]:
        """The ``lg_blobs`` values of these checkpoints: ``{channel: (type, blob)}``
        each, read with the chains of their deltas in one query per namespace and batch
        of versions (a version shared by many checkpoints is read once)."""
        b = self._store.tables.lg_blobs
        wanted: dict[tuple[Any, str], set[tuple[str, str]]] = {}
        named: list[tuple[Any, dict[str, str]]] = []
        for row in rows:
            if row.versions is None:  # its values are inline (written before 0005)
                continue
            versions = decode(row.versions)
            named.append((row, versions))
            wanted.setdefault((row.thread_id, row.checkpoint_ns), set()).update(versions.items())
        found: dict[tuple[Any, str], dict[str, dict[str, Stored]]] = {}
        for (thread_id, ns), pairs in wanted.items():
            ordered = sorted(pairs)
            space = found.setdefault((thread_id, ns), {})
            for start in range(0, len(ordered), _BATCH):
                batch = ordered[start : start + _BATCH]
                keys = select(b.c.channel, b.c.version, b.c.base).where(
                    b.c.thread_id == thread_id,
                    b.c.checkpoint_ns == ns,
                    tuple_(b.c.channel, b.c.version).in_(batch),
                )
                for r in await conn.execute(_chain(self._store, thread_id, ns, keys)):
                    space.setdefault(r.channel, {})[r.version] = self._stored(thread_id, r, r.blob)
        values: dict[tuple[Any, str, str], dict[str, tuple[str, bytes]]] = {}
        for row, versions in named:
            t, ns = row.thread_id, row.checkpoint_ns
            stored = found.get((t, ns), {})
            values[(t, ns, row.checkpoint_id)] = self._rebuilt(t, ns, versions, stored, learn=learn)
        return values

    async def history(
        self, config: dict[str, Any], ns: str, checkpoint_id: str | None, channels: set[str]
    ) -> list[tuple[str, list[Any], dict[str, tuple[str, bytes]], Any]]:
        """What a walk of a checkpoint's ancestors for ``channels`` needs (LangGraph's
        ``DeltaChannel`` history), parent first, up to the nearest ancestor that holds a
        value of each channel: per ancestor, its id, its writes to those channels
        (LangGraph's order), the values of those channels it holds, and — when some of
        its values are inline (written before 0005, or a channel name longer than
        the table's key) — its row (``type``, ``checkpoint``), else None.

        Read in one snapshot, a batch of ancestors at a time (one query each for the
        ancestors, which of them hold values, their writes, and the values): neither
        the checkpoints nor other channels' writes are read or decoded.
        """
        store = self._store
        c, w, b = store.tables.lg_checkpoints, store.tables.lg_writes, store.tables.lg_blobs
        ids = store.ids(config)
        asked = sorted(channels)
        if 0 < len(asked) <= _HISTORY_CHANNELS and all(
            self.limits.storable(ch) and _verbatim_in_json(ch) for ch in asked
        ):
            at_once = await self._history_at_once(ids, ns, checkpoint_id, asked)
            if at_once is not None:
                return at_once
        thread = store.visible_thread(ids)
        steps: list[tuple[str, list[Any], dict[str, tuple[str, bytes]], Any]] = []
        remaining = set(channels)
        async with store.snapshot() as conn:
            start = checkpoint_id
            if start is None:
                newest = select(func.max(c.c.checkpoint_id)).where(
                    c.c.thread_id == thread, c.c.checkpoint_ns == ns
                )
                start = (await conn.execute(newest)).scalar()
            first = True
            held: set[tuple[str, str]] | None = None
            while start is not None and remaining:
                chain = await self._walk(conn, ids.thread_id, thread, ns, start, skip=first)
                first = False
                if not chain:
                    break
                named = {
                    r.checkpoint_id: {
                        ch: v for ch, v in decode(r.versions).items() if ch in remaining
                    }
                    for r in chain
                    if r.versions is not None
                }
                # kept inline: looked at
                long = any(not self.limits.storable(ch) for ch in remaining)
                inline = [
                    r.checkpoint_id
                    for r in chain
                    if r.versions is None
                    or long
                    or "" in named.get(r.checkpoint_id, {}).values()  # a None, inline
                ]
                if held is None:  # the stored versions of those channels (few: snapshots)
                    rows = await conn.execute(
                        select(b.c.channel, b.c.version).where(
                            b.c.thread_id == ids.thread_id,
                            b.c.checkpoint_ns == ns,
                            b.c.channel.in_(sorted(remaining)),
                        )
                    )
                    held = {(r.channel, r.version) for r in rows}
                # the ancestors walked: up to the one where the last channel found a value
                walked, seeds, looking = [], {}, set(remaining)
                for r in chain:
                    walked.append(r)
                    versions = named.get(r.checkpoint_id, {})
                    for ch in [ch for ch in looking if (ch, versions.get(ch)) in held]:
                        seeds[(r.checkpoint_id, ch)] = versions[ch]
                        looking.discard(ch)
                    looking -= {ch for ch in looking if versions.get(ch) == ""}  # inline
                    if not looking:
                        break
                walked_ids = [r.checkpoint_id for r in walked]
                writes: dict[str, list[Any]] = {cid: [] for cid in walked_ids}
                # the ids of one path sort by time: a range (a branch's ids in it are
                # read and left out), one statement text whatever the count
                rows = await conn.execute(
                    select(w.c.checkpoint_id, w.c.task_id, w.c.channel, w.c.type, w.c.value)
                    .where(
                        w.c.thread_id == ids.thread_id,
                        w.c.checkpoint_ns == ns,
                        w.c.checkpoint_id.between(min(walked_ids), max(walked_ids)),
                        w.c.channel.in_(sorted(remaining)),
                    )
                    .order_by(w.c.checkpoint_id, *_write_order(w))
                )
                for row in rows:
                    if row.checkpoint_id in writes:
                        writes[row.checkpoint_id].append(row)
                wanted = sorted({(ch, v) for (_, ch), v in seeds.items()})
                values: dict[str, dict[str, Stored]] = {}
                if wanted:
                    keys = select(b.c.channel, b.c.version, b.c.base).where(
                        b.c.thread_id == ids.thread_id,
                        b.c.checkpoint_ns == ns,
                        tuple_(b.c.channel, b.c.version).in_(wanted),
                    )
                    for r in await conn.execute(_chain(store, ids.thread_id, ns, keys)):
                        values.setdefault(r.channel, {})[r.version] = self._stored(
                            ids.thread_id, r, r.blob
                        )
                inline_rows = {}
                if inline:
                    found = await conn.execute(
                        select(c.c.checkpoint_id, c.c.type, c.c.checkpoint).where(
                            c.c.thread_id == ids.thread_id,
                            c.c.checkpoint_ns == ns,
                            c.c.checkpoint_id.in_([i for i in inline if i in walked_ids]),
                        )
                    )
                    inline_rows = {r.checkpoint_id: r for r in found}
                for r in walked:
                    held_here = {
                        ch: version
                        for (cid, ch), version in seeds.items()
                        if cid == r.checkpoint_id
                    }
                    steps.append(
                        (
                            r.checkpoint_id,
                            writes[r.checkpoint_id],
                            self._rebuilt(ids.thread_id, ns, held_here, values, learn=False),
                            inline_rows.get(r.checkpoint_id),
                        )
                    )
                    remaining -= set(held_here)
                if len(walked) < len(chain) or not remaining:
                    break
                start = chain[-1].checkpoint_id
                first = True
        return steps

    async def _history_at_once(
        self, ids: RunIds, ns: str, checkpoint_id: str | None, channels: list[str]
    ) -> list[tuple[str, list[Any], dict[str, tuple[str, bytes]], Any]] | None:
        """:meth:`history` in one statement (one round trip; on a SQLite file one thread
        hop): None when a channel's walk ends at a value kept in the checkpoint itself
        (written before 0005, or a None) or goes deeper than one statement walks."""
        from .backends.driver import DriverStatement

        store = self._store
        if store.store_id is None:
            await store.ensure_ready()
        key = (ids.isolated, len(channels))
        if key not in self._histories:
            stmt = _history_statement(store, *key)
            self._histories[key] = (stmt, DriverStatement(stmt, store.backend.engine.dialect))
        stmt, driver = self._histories[key]
        values: dict[str, Any] = {"t": ids.thread_id, "ns": ns, "id": checkpoint_id}
        values["u"] = ids.user_id
        for i, channel in enumerate(channels):
            values[f"ch{i}"], values[f"p{i}"] = channel, f'$."{channel}"'
        one = self._one_statement()
        rows: Sequence[Any]
        if isinstance(one, _OneStatement):
            rows = await store.backend.run_statement(driver, values, write=False, many=True)
        elif isinstance(one, _OneHop):
            rows = await one.fetch(driver, values)
        else:
            async with store.snapshot() as conn:
                rows = (await conn.execute(stmt, values)).all()
        walked: list[Any] = []
        writes: dict[str, list[Any]] = {}
        stored: dict[str, dict[str, Stored]] = {}
        for row in rows:
            r = SimpleNamespace(**dict(zip(_HISTORY_COLUMNS, row, strict=True)))
            if r.kind == 0:
                # MySQL types a UNION of its bit arithmetic as DECIMAL: back to int.
                r.came, r.rest = int(r.came), int(r.rest)
                walked.append(r)
            elif r.kind == 1:
                writes.setdefault(r.checkpoint_id, []).append(r)
            else:
                stored.setdefault(r.channel, {})[r.version] = self._stored(
                    ids.thread_id, r, r.value
                )
        if walked and walked[-1].rest and walked[-1].depth >= _HISTORY_DEPTH:
            return None  # deeper than one statement walks: batches
        steps = []
        for r in walked:
            held: dict[str, str] = {}
            if r.came != r.rest:
                versions = {} if r.versions is None else decode(r.versions)
                for i, channel in enumerate(channels):
                    if r.came & (1 << i) and not r.rest & (1 << i):
                        version = versions.get(channel)
                        if not version:  # kept in the checkpoint: read the long way
                            return None
                        held[channel] = version
            steps.append(
                (
                    r.checkpoint_id,
                    writes.get(r.checkpoint_id, []),
                    self._rebuilt(ids.thread_id, ns, held, stored, learn=False),
                    None,
                )
            )
        return steps

    async def _walk(
        self, conn: Any, thread_id: Any, thread: Any, ns: str, start: str, *, skip: bool
    ) -> list[Any]:
        """Up to :data:`_WALK` ancestors of ``start`` (its parent first; ``start`` itself
        too unless ``skip``), with their ``versions``, in ONE query: each step looks its
        parent up by the whole primary key (on PostgreSQL a lateral with LIMIT 1, so
        no plan scans the namespace per step however stale the statistics)."""
        c = self._store.tables.lg_checkpoints
        columns = (c.c.checkpoint_id, c.c.parent_checkpoint_id, c.c.versions)
        chain = (
            select(*columns, literal(0).label("depth"))
            .where(c.c.thread_id == thread, c.c.checkpoint_ns == ns, c.c.checkpoint_id == start)
            .cte("walk", recursive=True)
        )
        parent = _by_key(
            self._store,
            c,
            (c.c.thread_id == thread_id, c.c.checkpoint_ns == ns),
            c.c.checkpoint_id == chain.c.parent_checkpoint_id,
            ["checkpoint_id", "parent_checkpoint_id", "versions"],
            "parent",
        )
        chain = chain.union_all(
            select(*parent.columns, chain.c.depth + 1)
            .select_from(chain)
            .join(parent.source, parent.on)
            .where(chain.c.depth < _WALK)
        )
        rows = await conn.execute(
            select(chain.c.checkpoint_id, chain.c.versions)
            .where(chain.c.depth > (0 if skip else -1))
            .order_by(chain.c.depth)
        )
        return list(rows)

    async def delete_runs(self, config: dict[str, Any], run_ids: list[str]) -> int:
        """Delete the checkpoints (and their writes) whose metadata names one of
        ``run_ids``, in the threads the caller may see; how many were deleted.

        Found by the indexed ``run_id`` column, then deleted thread by thread under
        the thread's lock.
        """
        store = self._store
        c, t = store.tables.lg_checkpoints, store.tables.threads
        ids = store.ids(config, need_thread=False)
        wanted = sorted({key for run in run_ids if (key := run_id_of({"run_id": run}))})
        if not wanted:
            return 0
        found: dict[Any, list[tuple[str, str]]] = {}
        for start in range(0, len(wanted), _BATCH):
            stmt = select(c.c.thread_id, c.c.checkpoint_ns, c.c.checkpoint_id).where(
                c.c.run_id.in_(wanted[start : start + _BATCH])
            )
            if ids.isolated:
                stmt = stmt.join(t, t.c.thread_id == c.c.thread_id).where(
                    t.c.user_id == ids.user_id
                )
            for row in await store.read(stmt):
                found.setdefault(row.thread_id, []).append((row.checkpoint_ns, row.checkpoint_id))
        for thread_id, doomed in found.items():
            self._forget(thread_id)
            async with store.write(thread_id) as (conn, _):
                spaces: dict[str, list[str]] = {}
                for ns, checkpoint_id in doomed:
                    spaces.setdefault(ns, []).append(checkpoint_id)
                for ns, ids_of_runs in spaces.items():
                    await self._delete(conn, thread_id, ns, ids_of_runs)
        return sum(len(doomed) for doomed in found.values())

    async def prune(self, configs: Iterable[dict[str, Any]], keep_latest: bool) -> None:
        """Keep only each namespace's newest checkpoint (with its writes), or nothing, of
        each config's thread (another user's: ThreadOwnershipError).

        Raises:
            NotImplementedError: ``keep_latest`` on a thread of a ``DeltaChannel``
                graph (its values are rebuilt from the ancestors), as LangGraph's own
                savers do; nothing of any thread is pruned then.
        """
        store = self._store
        c, w = store.tables.lg_checkpoints, store.tables.lg_writes
        every = [store.ids(config) for config in configs]  # all checked before any I/O
        if keep_latest and every:
            delta = select(c.c.thread_id).where(
                c.c.thread_id.in_([ids.thread_id for ids in every]),
                c.c.metadata.like(r'%"counters\_since\_delta\_snapshot"%', escape="\\"),
            )
            found = await store.read(delta.limit(1))
            if found:
                raise NotImplementedError(
                    f"thread {found[0].thread_id!r} uses a DeltaChannel: its values are "
                    "rebuilt from every ancestor since the last snapshot, so keep_latest "
                    "cannot prune it; use strategy='delete' or keep its history"
                )
        for ids in every:
            thread_id = ids.thread_id
            self._forget(thread_id)
            async with store.write(thread_id) as (conn, locked):
                if locked is None:
                    continue
                store.check_owner(ids, locked)
                if not keep_latest:
                    for table in (w, store.tables.lg_blobs, store.tables.lg_heads, c):
                        await conn.execute(delete(table).where(table.c.thread_id == thread_id))
                    continue
                spaces = select(c.c.checkpoint_ns).where(c.c.thread_id == thread_id).distinct()
                for ns in (await conn.execute(spaces)).scalars().all():
                    await self._prune_namespace(conn, thread_id, ns, 1, branches=False)

    def _forget(self, thread_id: Any) -> None:
        """Drop what this process remembers of a thread's last prunes."""
        for key in [key for key in self._kept if key[0] == thread_id]:
            del self._kept[key]

    async def copy(self, source: dict[str, Any], target: dict[str, Any]) -> None:
        """Copy the checkpoints, writes and values of the source config's thread to the
        target's.

        The source is read as the caller may see it (another user's thread is absent:
        nothing is copied). The target is created for the caller (or, for an operator,
        for the source's owner); another user's target is a ThreadOwnershipError.
        """
        store = self._store
        c, w, b = store.tables.lg_checkpoints, store.tables.lg_writes, store.tables.lg_blobs
        src, dst = store.ids(source), store.ids(target)
        t = store.tables.threads
        async with store.snapshot() as conn:
            owner = (await conn.execute(select(t.c.user_id).where(store.owned(src)))).first()
            rows = {
                table: [
                    dict(r._mapping)
                    for r in await conn.execute(
                        select(*table.c).where(table.c.thread_id == src.thread_id)
                    )
                ]
                for table in (c, w, b)
            }
        if owner is None or not rows[c]:
            return
        user = dst.user_id if dst.isolated else owner.user_id
        ids = RunIds(thread_id=dst.thread_id, user_id=user, isolated=dst.isolated)
        async with store.write(dst.thread_id) as (conn, locked):
            await store.claim_thread(conn, ids, locked, store.now())
            for table in (w, b, store.tables.lg_heads, c):
                await conn.execute(delete(table).where(table.c.thread_id == dst.thread_id))
            for table, (data, column) in (
                (c, ("checkpoint", CHECKPOINT)),
                (w, ("value", WRITE)),
                (b, ("blob", BLOB)),
            ):
                if rows[table]:
                    await conn.execute(
                        insert(table),
                        [
                            self._moved(r, data, column, src.thread_id, dst.thread_id)
                            for r in rows[table]
                        ],
                    )

    def _moved(
        self, row: dict[str, Any], data: str, column: str, src: Any, dst: Any
    ) -> dict[str, Any]:
        """A row copied to thread ``dst``: a sealed value opened and sealed again for it
        (its associated data names the thread)."""
        moved = {**row, "thread_id": dst}
        if row["type"][:1] == "!" or self._store.keys is not None:
            kind, plain = open_typed(self._store.keys, row["type"], bytes(row[data]), src, column)
            moved["type"], moved[data] = self._seal(kind, plain, dst, column)
        return moved
