"""A memory's expiry moved forward without a new version: a TTL refreshed on read.

LangGraph's stores extend an item's TTL when a read returns it (``refresh_ttl``). A
refresh is not a write of the memory: its version, content, metadata and
``updated_at`` stay as they are, and no past version is recorded. It applies only to
the version that was read and only while it is alive: a memory written again since
(another version) or expired in between keeps the expiry it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import update

from .validation import check_namespace, check_user

if TYPE_CHECKING:
    from .store import MemoryStore

__all__ = ["Refresh", "arefresh"]


class Refresh(NamedTuple):
    """One memory to refresh: the version that was read, and its TTL."""

    namespace: tuple[str, ...]
    key: str
    version: int
    ttl: timedelta


async def arefresh(store: MemoryStore, user_id: Any, items: Sequence[Refresh]) -> int:
    """Set each memory's expiry to now + its TTL, in one write transaction (rows taken
    in a fixed order, so two refreshes cannot deadlock); how many were refreshed."""
    if not items:
        return 0
    owner = check_user(user_id, store.base.settings.user_id_type)
    wanted = sorted(
        {(check_namespace(i.namespace), i.key): i for i in items}.items(), key=lambda kv: kv[0]
    )
    rows = store.rows
    m = rows.m
    (ns, key), _ = wanted[0]
    done = 0
    # Nothing sealed is written (only a time), so a store without a key ring may do it.
    lock = rows.one(owner, ns, key)
    async with store.base.write_rows(rows.lock, lock, deletes_only=True) as (conn, _):
        now = store.base.now()
        for (ns, key), item in wanted:
            result = await conn.execute(
                update(m)
                .where(
                    m.c.user_id == owner,
                    m.c.namespace == ns,
                    m.c.memory_key == key,
                    m.c.version == item.version,
                    m.c.expires_at.is_not(None),
                    m.c.expires_at > now,
                )
                .values(expires_at=now + item.ttl)
            )
            done += max(result.rowcount, 0)
        if done:  # an expiry is part of what a cached matrix of vectors holds
            await rows.bump(conn, [(owner, ns) for (ns, _), _ in wanted])
    return done
