"""A thread's state read back: the head state, the retained versions and the messages,
each opened for the life of the thread it is stored in.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from .config import record_read
from .crypto import MESSAGE, STATE, Life, life_of
from .statements import snapshot_of
from .store import Store
from .types import StateSnapshot
from .validate import check_id, check_limit

__all__ = ["list_states", "read_messages", "read_state"]


async def read_state(store: Store, config: dict[str, Any]) -> dict[str, Any] | None:
    """The latest durable state, or None; records its version (0 when none) in config."""
    ids = store.ids(config)
    head = await store.read_head(ids)
    if head is None:
        record_read(config, 0, None)
        return None
    record_read(config, head.version, head.incarnation)
    if head.state is None:
        return None
    life = Life(head.incarnation, head.user_id)
    state: dict[str, Any] = store.load(head.state, ids.thread_id, STATE, life)
    return state


async def list_states(
    store: Store, config: dict[str, Any], limit: int | None
) -> list[StateSnapshot]:
    """The retained state versions, newest first."""
    ids = store.ids(config)
    limit = check_limit(limit)
    s, t = store.tables.states, store.tables.threads
    stmt = (  # the thread's life joined in: what its values are sealed for
        select(s.c.version, s.c.state_data, s.c.meta, s.c.created_at, *store.life_columns)
        .join(t, t.c.thread_id == s.c.thread_id)
        .where(s.c.thread_id == ids.thread_id, store.owned(ids))
        .order_by(s.c.version.desc())
        .limit(limit)
    )
    rows = await store.read_lagging(
        stmt, guard=store.caught_up(config), config=config, thread_id=ids.thread_id
    )
    return [snapshot_of(row, ids.thread_id, store.keys, life_of(row)) for row in rows]


async def read_messages(
    store: Store, config: dict[str, Any], limit: int | None, after_id: str | None
) -> list[dict[str, Any]]:
    """Messages in insertion order: the first ``limit`` after ``after_id``."""
    ids = store.ids(config)
    limit = check_limit(limit)
    m, t = store.tables.messages, store.tables.threads
    stmt = (  # the thread's life joined in: what its values are sealed for
        select(m.c.payload, *store.life_columns)
        .join(t, t.c.thread_id == m.c.thread_id)
        .where(m.c.thread_id == ids.thread_id, store.owned(ids))
    )
    if after_id is not None:
        after = (
            select(m.c.seq)
            .where(m.c.thread_id == ids.thread_id, m.c.message_id == check_id("after_id", after_id))
            .scalar_subquery()
        )
        stmt = stmt.where(m.c.seq > after)
    stmt = stmt.order_by(m.c.seq).limit(limit)
    rows = await store.read_lagging(
        stmt, guard=store.caught_up(config), config=config, thread_id=ids.thread_id
    )
    return [store.load(row.payload, ids.thread_id, MESSAGE, life_of(row)) for row in rows]
