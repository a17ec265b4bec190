"""The SQL every backend shares, built once per repository, and rows turned into values.

Building a Core statement and computing its cache key costs more than the round
trip of a one-row SELECT on loopback; built once with ``bindparam`` values, each
call only binds parameters and hits SQLAlchemy's compiled cache. What one database
does faster (PostgreSQL's one-statement state write) its backend builds here too.

ORM rows never leave the storage modules: the converters at the bottom turn them
into the frozen values of :mod:`tenxstore.types`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import and_, bindparam, insert, select, update
from sqlalchemy.sql.elements import BindParameter

from .backends import Backend
from .crypto import (
    ARGS,
    ERROR,
    META,
    METADATA,
    NAME,
    RESULT,
    STATE,
    KeyRing,
    Life,
    life_of,
    open_json,
)
from .models import Tables
from .serde import decode
from .types import StateSnapshot, ThreadInfo, ToolExecution

__all__ = ["Statements", "snapshot_of", "thread_info", "tool_execution", "utc"]


class Statements:
    """The tables of one repository and the statements of its hot path."""

    def __init__(self, tables: Tables, backend: Backend) -> None:
        self.tables = tables
        t, s, m, x = tables.threads, tables.states, tables.messages, tables.tool_executions
        thread: BindParameter[Any] = bindparam("b_thread")
        self.lock = (
            select(t.c.user_id, t.c.version, t.c.incarnation)
            .where(t.c.thread_id == thread)
            .with_for_update()  # dropped on SQLite, where BEGIN IMMEDIATE serializes
        )
        self.new_thread = backend.insert_ignore(t, "thread_id").values(
            thread_id=thread,
            user_id=bindparam("b_user"),
            version=0,
            created_at=bindparam("b_now"),
            updated_at=bindparam("b_now"),
        )
        self.insert_state = insert(s)
        self.insert_messages = backend.insert_ignore(m, "thread_id", "message_id")
        self.bump = (
            update(t)
            .where(t.c.thread_id == thread)
            .values(version=bindparam("b_version"), updated_at=bindparam("b_now"))
        )
        self.prune = backend.prune(tables)
        self.state_write = backend.build_state_write(tables)
        # the owner last: the hot paths read the first three columns by place
        head = select(t.c.version, t.c.incarnation, s.c.state_data, t.c.user_id).select_from(
            t.outerjoin(s, and_(s.c.thread_id == t.c.thread_id, s.c.version == t.c.version))
        )
        self.head_state = head.where(t.c.thread_id == thread)
        self.head_state_of_user = head.where(
            t.c.thread_id == thread, t.c.user_id == bindparam("b_user")
        )
        self.tool_call = select(*x.c).where(
            x.c.thread_id == thread, x.c.tool_call_id == bindparam("b_call")
        )


def utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


def load(keys: KeyRing | None, text: str, thread_id: Any, column: str, life: Life | None) -> Any:
    """A stored JSON payload's value, opened with ``keys`` when sealed (for the thread's
    ``life``, read with it; see :func:`tenxstore.crypto.open_json`: an opened envelope
    goes to the decoder as bytes)."""
    return decode(open_json(keys, text, thread_id, column, life))


def snapshot_of(row: Any, thread_id: Any, keys: KeyRing | None, life: Life) -> StateSnapshot:
    """A ``states`` row of ``thread_id`` as a :class:`StateSnapshot` (opened with
    ``keys`` when sealed, for the thread's ``life``)."""
    return StateSnapshot(
        version=row.version,
        state=load(keys, row.state_data, thread_id, STATE, life),
        meta={} if row.meta is None else load(keys, row.meta, thread_id, META, life),
        created_at=utc(row.created_at),  # type: ignore[arg-type]  # never NULL
    )


def thread_info(row: Any, keys: KeyRing | None) -> ThreadInfo:
    """A ``threads`` row as a :class:`ThreadInfo` (opened with ``keys`` when sealed, for
    the life the row itself names: its incarnation and owner)."""
    tid, life = row.thread_id, life_of(row)
    return ThreadInfo(
        thread_id=tid,
        user_id=row.user_id,
        name=None if row.name is None else load(keys, row.name, tid, NAME, life),
        metadata={} if row.metadata is None else load(keys, row.metadata, tid, METADATA, life),
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
        version=row.version,
    )


def tool_execution(thread_id: Any, row: Any, keys: KeyRing | None, life: Life) -> ToolExecution:
    """A ``tool_executions`` row as a :class:`ToolExecution` (opened with ``keys``, for
    the thread's ``life``)."""
    return ToolExecution(
        thread_id=thread_id,
        tool_call_id=row.tool_call_id,
        tool_name=row.tool_name,
        args=load(keys, row.args, thread_id, ARGS, life),
        status=row.status,
        result=None if row.result is None else load(keys, row.result, thread_id, RESULT, life),
        error=None if row.error is None else load(keys, row.error, thread_id, ERROR, life),
        attempts=row.attempts,
        started_at=utc(row.started_at),  # type: ignore[arg-type]  # never NULL
        finished_at=utc(row.finished_at),
        lease_expires_at=utc(row.lease_expires_at),
    )
