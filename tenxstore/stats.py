"""What an operator checks when something grows: who holds the threads, how big the
tables and their indexes are, how much of them is dead rows, how many cache keys.

The per-user counts are exact. Table sizes come from the database's own accounting:
PostgreSQL's ``pg_table_size`` / ``pg_indexes_size`` and ``pg_stat_user_tables``
(whose row and dead-row counts are the statistics collector's estimates, refreshed
as autovacuum and ANALYZE run); SQLite's ``dbstat`` table where the library was built
with it, else only the whole file's pages. SQLite has no dead rows (a deleted row's
space goes to the free list, reported as ``free_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Table, func, or_, select, text
from sqlalchemy.exc import DBAPIError
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
    """

    user_id: Any
    threads: int
    states: int
    messages: int
    tool_executions: int
    checkpoints: int


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


_PG_TABLES = text(
    """
    SELECT c.relname AS name, s.n_live_tup AS live, s.n_dead_tup AS dead,
           pg_table_size(c.oid) AS table_bytes, pg_indexes_size(c.oid) AS index_bytes
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
    WHERE n.nspname = COALESCE(:schema, current_schema()) AND c.relkind IN ('r', 'p')
    """
)


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
            if store.backend.dialect == "postgresql":
                found, database_bytes, free_bytes = await self._postgres(conn, ours, exact)
            else:
                found, database_bytes, free_bytes = await self._sqlite(conn, ours)
        return StoreStats(
            backend=store.backend.name,
            threads=threads,
            users=users,
            top_users=top_users,
            tables=found,
            database_bytes=database_bytes,
            free_bytes=free_bytes,
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
        return tuple(
            UserStats(
                user_id=row.user_id,
                threads=row.n,
                **{name: counts[name].get(row.user_id, 0) for name in counts},
            )
            for row in leaders
        )

    async def _postgres(
        self, conn: AsyncConnection, ours: list[Table], exact: bool
    ) -> tuple[tuple[TableStats, ...], int | None, int | None]:
        store = self._store
        rows = {row.name: row for row in await conn.execute(_PG_TABLES, {"schema": store.schema})}
        found = []
        for table in ours:
            row = rows.get(table.name)
            live = None if row is None else row.live
            if exact:
                live = (await conn.execute(select(func.count()).select_from(table))).scalar_one()
            found.append(
                TableStats(
                    table.name,
                    live,
                    None if row is None else row.table_bytes,
                    None if row is None else row.index_bytes,
                    None if row is None else row.dead,
                )
            )
        size = (
            await conn.execute(text("SELECT pg_database_size(current_database())"))
        ).scalar_one()
        return tuple(found), size, None

    async def _sqlite(
        self, conn: AsyncConnection, ours: list[Table]
    ) -> tuple[tuple[TableStats, ...], int | None, int | None]:
        page_size = (await conn.exec_driver_sql("PRAGMA page_size")).scalar_one()
        pages = (await conn.exec_driver_sql("PRAGMA page_count")).scalar_one()
        free = (await conn.exec_driver_sql("PRAGMA freelist_count")).scalar_one()
        sizes: dict[str, int] | None
        try:
            # dbstat is a build option of SQLite (Debian's and Python's builds have it).
            # A failed statement leaves a SQLite transaction as it was.
            found_sizes: Any = await conn.exec_driver_sql(
                "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"
            )
            sizes = {str(row[0]): int(row[1]) for row in found_sizes}
        except DBAPIError:
            sizes = None
        indexes: dict[str, list[str]] = {}
        listed: Any = await conn.exec_driver_sql(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index'"
        )
        for row in listed:
            indexes.setdefault(str(row[1]), []).append(str(row[0]))
        found = []
        for table in ours:
            rows = (await conn.execute(select(func.count()).select_from(table))).scalar_one()
            if sizes is None:
                own = index = None
            else:
                own = sizes.get(table.name, 0)
                index = sum(sizes.get(i, 0) for i in indexes.get(table.name, []))
            found.append(TableStats(table.name, rows, own, index, None))
        return tuple(found), page_size * pages, page_size * free
