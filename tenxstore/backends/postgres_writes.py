"""PostgreSQL's one-round-trip state write: the common write as ONE statement of
data-modifying CTEs, the look at whether one that lost its connection committed, and
both compiled once per process and set of tables."""

from __future__ import annotations

import collections
import threading
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    Insert,
    Integer,
    Table,
    Text,
    bindparam,
    delete,
    func,
    insert,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import BindParameter

from ..models import Tables
from .driver import DriverStatement, OnFirstUse
from .records import HeadWrite

__all__ = ["did_it_apply", "hot_writes", "write_values"]


def _one_step_write(tables: Tables, scoped: bool, expected: bool, incarnation: bool) -> Select[Any]:
    """The common state write as ONE statement (see
    :meth:`~tenxstore.backends.postgres.PostgresBackend.commit_head`).

    ``cas`` updates the thread row only when it matches (owner, version, incarnation;
    the owner compared null-safe, as a sealed write under isolation off names a thread
    of no user as None):
    the UPDATE takes the row lock (a concurrent writer waits, then sees the new
    version and matches nothing) and returns the new version, which every other CTE
    reads; when it matched nothing, they insert and delete nothing.
    """
    t, s, m = tables.threads, tables.states, tables.messages
    thread: BindParameter[Any] = bindparam("b_thread", type_=t.c.thread_id.type)
    now: BindParameter[Any] = bindparam("b_now", type_=t.c.updated_at.type)
    cas = _matched_thread(t, thread, now, scoped, expected, incarnation)
    new_state = insert(s).from_select(
        ["thread_id", "version", "state_data", "meta", "created_at", "write_id"],
        select(
            thread,
            cas.c.version,
            bindparam("b_state", type_=Text()),
            bindparam("b_meta", type_=Text()),
            now,
            bindparam("b_write_id", type_=BigInteger()),
        ),
    )
    new_messages = _new_messages(m, cas, thread, now)
    newest = select(cas.c.version).scalar_subquery()
    prune = delete(s).where(
        s.c.thread_id == thread, s.c.version <= newest - bindparam("b_limit", type_=Integer())
    )
    return (
        select(cas.c.version, cas.c.incarnation, cas.c.user_id)
        .add_cte(new_state.cte("new_state"))
        .add_cte(new_messages.cte("new_messages"))
        .add_cte(prune.cte("pruned"))
    )


def write_values(write: HeadWrite, write_id: int) -> dict[str, Any]:
    """The one-step write's values, by bind name, for ``write`` marked ``write_id``."""
    messages = write.messages
    return {
        "b_write_id": write_id,
        "b_thread": write.thread_id,
        "b_user": write.user_id,
        "b_expected": write.expected,
        "b_life": write.incarnation,
        "b_state": write.state,
        "b_meta": write.meta,
        "b_now": write.now,
        "b_limit": write.history_limit,
        "b_ids": [m["message_id"] for m in messages],
        "b_roles": [m["role"] for m in messages],
        "b_payloads": [m["payload"] for m in messages],
    }


def _matched_thread(
    t: Table,
    thread: BindParameter[Any],
    now: BindParameter[Any],
    scoped: bool,
    expected: bool,
    incarnation: bool,
) -> CTE:
    """``cas``: the thread's row moved to its next version, when it matches (owner,
    version, incarnation); its new version, incarnation and owner."""
    match = [t.c.thread_id == thread]
    if scoped:
        owner = bindparam("b_user", type_=t.c.user_id.type)
        match.append(t.c.user_id.is_not_distinct_from(owner))
    if expected:
        match.append(t.c.version == bindparam("b_expected", type_=t.c.version.type))
    if incarnation:
        match.append(t.c.incarnation == bindparam("b_life", type_=t.c.incarnation.type))
    return (
        update(t)
        .where(*match)
        .values(version=t.c.version + 1, updated_at=now)
        .returning(t.c.version, t.c.incarnation, t.c.user_id)
        .cte("cas")
    )


def _new_messages(
    m: Table, cas: CTE, thread: BindParameter[Any], now: BindParameter[Any]
) -> Insert:
    """The write's messages (``b_ids``, ``b_roles``, ``b_payloads``), inserted in
    their order when ``cas`` matched; one stored already is kept."""
    batch = func.unnest(
        bindparam("b_ids", type_=ARRAY(Text())),
        bindparam("b_roles", type_=ARRAY(Text())),
        bindparam("b_payloads", type_=ARRAY(Text())),
    ).table_valued("message_id", "role", "payload", with_ordinality="ord")
    batch = batch.render_derived(name="batch")
    return (
        pg_insert(m)
        .from_select(
            ["thread_id", "message_id", "role", "payload", "created_at"],
            select(thread, batch.c.message_id, batch.c.role, batch.c.payload, now)
            .select_from(cas.join(batch, true()))
            .order_by(batch.c.ord),
        )
        .on_conflict_do_nothing(index_elements=["thread_id", "message_id"])
    )


def did_it_apply(tables: Tables) -> Select[Any]:
    """Whether a state write that lost its connection committed: the thread's head, and
    whether the version after the one it expected is the state row holding the
    write's own ``write_id`` (another writer's next version holds another)."""
    t, s = tables.threads, tables.states
    thread: BindParameter[Any] = bindparam("b_thread", type_=t.c.thread_id.type)
    expected = bindparam("b_expected", type_=BigInteger())
    state_there = (
        select(s.c.version)
        .where(
            s.c.thread_id == thread,
            s.c.version == expected + 1,
            s.c.write_id == bindparam("b_write_id", type_=BigInteger()),
        )
        .exists()
    )
    return select(t.c.version, t.c.incarnation, t.c.user_id, state_there).where(
        t.c.thread_id == thread
    )


_HotWrites = tuple[dict[tuple[bool, ...], DriverStatement], DriverStatement]
_HOT_WRITES: collections.OrderedDict[tuple[Tables, str], _HotWrites] = collections.OrderedDict()
_REMEMBERED = 256  # sets of tables: id types and schemas, as models.tables_for keeps
_HOT_WRITES_LOCK = threading.Lock()


def hot_writes(tables: Tables, dialect: Any) -> _HotWrites:
    """The one-step writes (each variant built when first sent) and their check, once
    per process and set of tables (``models.tables_for`` gives one set per id types
    and schema): building them was half the cost of making a repository. Keyed by the
    tables themselves (never by an id a collected object could hand on), the least
    recent forgotten."""
    key = (tables, dialect.name)
    with _HOT_WRITES_LOCK:  # repositories may be made in several threads at once
        found = _HOT_WRITES.get(key)
        if found is None:
            writes = OnFirstUse[tuple[bool, ...], DriverStatement](
                lambda flags: DriverStatement(_one_step_write(tables, *flags), dialect)
            )
            found = (writes, DriverStatement(did_it_apply(tables), dialect))
            _HOT_WRITES[key] = found
            if len(_HOT_WRITES) > _REMEMBERED:
                _HOT_WRITES.popitem(last=False)
        else:
            _HOT_WRITES.move_to_end(key)
    return found
