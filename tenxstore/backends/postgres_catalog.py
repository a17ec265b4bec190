"""What PostgreSQL's catalogs say of a store: the identity of its database and schema
(``astore_id``) and its tables' sizes and rows (``astats``)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from .records import Footprint, TableSizes

__all__ = ["database_identity", "table_footprint"]


async def database_identity(conn: AsyncConnection, schema: str | None) -> str:
    """The cluster's system identifier (where this role may read it), the
    database's oid and the schema's: the same through a pooler or another host
    name, different in a copy."""
    row = (
        await conn.execute(
            text(
                "SELECT CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE')"
                " THEN (SELECT system_identifier::text FROM pg_control_system()) END,"
                " (SELECT oid FROM pg_database WHERE datname = current_database()),"
                # By its exact name: to_regnamespace() would parse the text as SQL
                # (folding Acme to acme, refusing 'a b')
                " (SELECT oid FROM pg_namespace WHERE nspname = :schema)"
            ),
            {"schema": schema or "public"},
        )
    ).one()
    return f"{row[0] or ''}/{row[1]}/{row[2]}"


async def table_footprint(
    conn: AsyncConnection, schema: str | None, tables: Sequence[Table], exact: bool
) -> Footprint:
    """Sizes from ``pg_table_size`` (with TOAST) and ``pg_indexes_size``; live and
    dead rows from ``pg_stat_user_tables`` (the statistics' estimates), or live rows
    counted with ``exact``."""
    rows = {
        row.name: row
        for row in await conn.execute(
            text(
                "SELECT c.relname AS name, s.n_live_tup AS live, s.n_dead_tup AS dead,"
                " pg_table_size(c.oid) AS table_bytes, pg_indexes_size(c.oid) AS index_bytes"
                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid"
                " WHERE n.nspname = COALESCE(:schema, current_schema())"
                " AND c.relkind IN ('r', 'p')"
            ),
            {"schema": schema},
        )
    }
    found = {}
    for table in tables:
        row = rows.get(table.name)
        live = None if row is None else row.live
        if exact:
            live = (await conn.execute(select(func.count()).select_from(table))).scalar_one()
        if row is None:
            found[table.name] = TableSizes(live, None, None, None)
        else:
            found[table.name] = TableSizes(live, row.table_bytes, row.index_bytes, row.dead)
    size = await conn.execute(text("SELECT pg_database_size(current_database())"))
    return Footprint(found, size.scalar_one(), None)
