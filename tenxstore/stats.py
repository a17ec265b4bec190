"""What an operator checks when something grows: who holds the threads, how big the
tables and their indexes are, how much of them is dead rows, how many cache keys.

The per-user counts are exact. Table sizes come from the database's own accounting,
asked by the backend (:meth:`~tenxstore.backends.base.Backend.footprint`):
PostgreSQL's ``pg_table_size`` / ``pg_indexes_size`` and ``pg_stat_user_tables``
(whose row and dead-row counts are the statistics' estimates, refreshed as
autovacuum and ANALYZE run); SQLite's ``dbstat`` table where the library was built
with it, else only the whole file's pages. SQLite has no dead rows (a deleted row's
space goes to the free list, reported as ``free_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, case, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .errors import ConfigError
from .store import Store
from .validate import is_int

__all__ = ["Stats", "StoreStats", "TableStats", "UserStats"]

MAX_TOP = 10_000


@dataclass(frozen=True)
class UserStats:
    """What one user holds (exact counts).

    Attributes:
        user_id: The owner (None: threads written with isolation off, owned by no one).
        threads: Threads.
        states: Retained state versions.
        messages: Messages.
        tool_executions: Tool-ledger records.
        checkpoints: LangGraph checkpoints.
        memories: Long-term memories (current versions; not expired or not yet swept).
    """

    user_id: Any
    threads: int
    states: int
    messages: int
    tool_executions: int
    checkpoints: int
    memories: int = 0


@dataclass(frozen=True)
class TableStats:
    """One table's size on disk.

    Attributes:
        name: The table.
        rows: Live rows (PostgreSQL: the statistics' estimate unless counted exactly).
        table_bytes: The table's own pages (PostgreSQL: with its TOAST), or None when
            the database cannot say.
        index_bytes: Its indexes' pages, or None.
        dead_rows: Rows deleted or updated away and not yet vacuumed (PostgreSQL's
            estimate; None on SQLite).
    """

    name: str
    rows: int | None
    table_bytes: int | None
    index_bytes: int | None
    dead_rows: int | None

    @property
    def total_bytes(self) -> int | None:
        """Table and indexes together."""
        if self.table_bytes is None:
            return None
        return self.table_bytes + (self.index_bytes or 0)

    @property
    def dead_ratio(self) -> float | None:
        """Dead rows over all rows the table holds (None when not known)."""
        if self.dead_rows is None or self.rows is None:
            return None
        held = self.rows + self.dead_rows
        return self.dead_rows / held if held else 0.0


@dataclass(frozen=True)
class StoreStats:
    """What :meth:`~tenxstore.CheckpointRepository.astats` found.

    Attributes:
        backend: The database mode (``"postgresql"``, ``"sqlite"``...).
        threads: Threads in all.
        users: Distinct owners (threads owned by no one count as one).
        top_users: The users holding the most threads, most first.
        tables: Each table of the store.
        database_bytes: The whole database (PostgreSQL: ``pg_database_size``;
            SQLite: the file's pages), or None.
        free_bytes: SQLite's free pages (reused by later writes; ``VACUUM`` returns
            them to the file system); None on PostgreSQL.
        cache_keys: Keys under the cache's prefix (entries and fences), counted with
            ``SCAN``; None without a cache.
        cache_error: Why the keys could not be counted, or None.
        memories: Long-term memories in all (expired ones not yet swept included).
        memory_users: Distinct owners of memories.
        expired_memories: Memories expired and waiting for a sweep
            (``tenxstore memories sweep``).
    """

    backend: str
    threads: int
    users: int
    top_users: tuple[UserStats, ...]
    tables: tuple[TableStats, ...]
    database_bytes: int | None
    free_bytes: int | None
    cache_keys: int | None = None
    cache_error: str | None = None
    memories: int = 0
    memory_users: int = 0
    expired_memories: int = 0


class Stats:
    """The queries of :meth:`~tenxstore.CheckpointRepository.astats`."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def astats(self, *, top: int = 10, exact: bool = False) -> StoreStats:
        """See :meth:`tenxstore.CheckpointRepository.astats`."""
        if not is_int(top) or not 0 <= top <= MAX_TOP:
            raise ConfigError(f"top must be an int from 0 to {MAX_TOP}, not {top!r}")
        if not isinstance(exact, bool):
            raise ConfigError(f"exact must be a bool, not {exact!r}")
        store = self._store
        await store.ensure_ready()
        tables = store.tables
        t = tables.threads
        ours = [
            tables.threads,
            tables.states,
            tables.messages,
            tables.tool_executions,
            tables.lg_checkpoints,
            tables.lg_writes,
            tables.lg_blobs,
            tables.memories,
            tables.memory_versions,
            tables.memory_vectors,
            tables.memory_revisions,
            tables.store,
        ]
        async with store.snapshot() as conn:
            threads = (await conn.execute(select(func.count()).select_from(t))).scalar_one()
            users = (
                await conn.execute(select(func.count(func.distinct(t.c.user_id))))
            ).scalar_one()
            if (
                await conn.execute(select(func.count()).select_from(t).where(t.c.user_id.is_(None)))
            ).scalar_one():
                users += 1
            top_users = await self._top_users(conn, top)
            m = tables.memories
            memories, memory_users, expired = (
                await conn.execute(
                    select(
                        func.count(),
                        func.count(func.distinct(m.c.user_id)),
                        func.coalesce(
                            func.sum(case((m.c.expires_at <= store.now(), 1), else_=0)), 0
                        ),
                    ).select_from(m)
                )
            ).one()
            footprint = await store.backend.footprint(conn, store.schema, ours, exact)
        return StoreStats(
            backend=store.backend.name,
            threads=threads,
            users=users,
            top_users=top_users,
            tables=tuple(TableStats(table.name, *footprint.tables[table.name]) for table in ours),
            database_bytes=footprint.database_bytes,
            free_bytes=footprint.free_bytes,
            memories=int(memories),
            memory_users=int(memory_users),
            expired_memories=int(expired),
        )

    async def _top_users(self, conn: AsyncConnection, top: int) -> tuple[UserStats, ...]:
        tables = self._store.tables
        t = tables.threads
        if top == 0:
            return ()
        n = func.count().label("n")
        leaders = (
            await conn.execute(
                select(t.c.user_id, n)
                .group_by(t.c.user_id)
                .order_by(n.desc(), t.c.user_id)
                .limit(top)
            )
        ).all()
        users = [row.user_id for row in leaders]
        owners = [u for u in users if u is not None]
        chosen: ColumnElement[bool] = t.c.user_id.in_(owners)
        if None in users:
            chosen = or_(chosen, t.c.user_id.is_(None))
        counts: dict[str, dict[Any, int]] = {}
        for name, table in (
            ("states", tables.states),
            ("messages", tables.messages),
            ("tool_executions", tables.tool_executions),
            ("checkpoints", tables.lg_checkpoints),
        ):
            rows = await conn.execute(
                select(t.c.user_id, func.count())
                .select_from(table.join(t, table.c.thread_id == t.c.thread_id))
                .where(chosen)
                .group_by(t.c.user_id)
            )
            counts[name] = {row[0]: row[1] for row in rows}
        m = tables.memories
        held = await conn.execute(
            select(m.c.user_id, func.count()).where(m.c.user_id.in_(owners)).group_by(m.c.user_id)
        )
        counts["memories"] = {row[0]: row[1] for row in held}
        return tuple(
            UserStats(
                user_id=row.user_id,
                threads=row.n,
                **{name: counts[name].get(row.user_id, 0) for name in counts},
            )
            for row in leaders
        )
