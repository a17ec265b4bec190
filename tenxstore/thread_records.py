"""Thread records: a thread's name and metadata written (sealed for its life) and read,
the caller's threads listed, and a thread deleted whole.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, exists, select, update

from .crypto import METADATA, NAME, life_of
from .errors import SerializationError
from .serde import encode
from .statements import thread_info
from .store import Store
from .types import Commit, ThreadInfo
from .validate import check_count, check_limit

__all__ = ["delete_thread", "get_thread", "list_threads", "put_thread"]


async def put_thread(
    store: Store, config: dict[str, Any], name: str | None, metadata: dict[str, Any] | None
) -> ThreadInfo:
    """Create or update the thread record; ``None`` leaves a field as it is."""
    ids = store.ids(config)
    plain: dict[str, tuple[str, str]] = {}
    if name is not None:
        if not isinstance(name, str):
            raise SerializationError(f"name must be a str, not {type(name).__name__}")
        plain["name"] = (encode(name, "name"), NAME)
    if metadata is not None:
        plain["metadata"] = (store.encode_object(metadata, "metadata"), METADATA)
    now = store.now()
    t = store.tables.threads
    async with store.write(ids.thread_id) as (conn, locked):
        life = life_of(await store.claim_thread(conn, ids, locked, now))
        # sealed for the life the lock found (or created): a name is the thread's
        values = {k: store.seal(v, ids.thread_id, c, life) for k, (v, c) in plain.items()}
        here = t.c.thread_id == ids.thread_id
        stmt = update(t).where(here).values(updated_at=now, **values)
        row = await store.backend.update_returning(conn, stmt, t, here)
    return thread_info(row, store.keys)


async def get_thread(store: Store, config: dict[str, Any]) -> ThreadInfo | None:
    """The thread record, or None (also when another user owns it)."""
    ids = store.ids(config)
    rows = await store.read(select(*store.tables.threads.c).where(store.owned(ids)))
    return thread_info(rows[0], store.keys) if rows else None


async def list_threads(
    store: Store, config: dict[str, Any], limit: int | None, offset: int
) -> list[ThreadInfo]:
    """The caller's threads, most recently updated first (all when isolation is off)."""
    ids = store.ids(config, need_thread=False)
    limit = check_limit(limit)
    offset = check_count("offset", offset)
    t = store.tables.threads
    stmt = select(*t.c)
    if ids.isolated:
        stmt = stmt.where(t.c.user_id == ids.user_id)
    stmt = stmt.order_by(t.c.updated_at.desc(), t.c.thread_id.desc()).limit(limit).offset(offset)
    guard: list[ColumnElement[bool]] = []
    if ids.thread_id is not None:  # the run's own thread listed as it last saw it, or later
        own = t.alias("own")
        if held := store.caught_up(config, own):
            guard.append(exists().where(own.c.thread_id == ids.thread_id, *held))
    rows = await store.read_lagging(stmt, guard=guard, config=config)
    return [thread_info(row, store.keys) for row in rows]


async def delete_thread(store: Store, config: dict[str, Any]) -> Commit | None:
    """Delete the thread whole; what was deleted (None: no such thread)."""
    ids = store.ids(config)
    async with store.write(ids.thread_id, deletes_only=True) as (conn, locked):
        if locked is None:
            return None
        store.check_owner(ids, locked)
        await store.delete_thread(conn, ids.thread_id)
    return Commit(ids.thread_id, locked.user_id, locked.incarnation, locked.version)
