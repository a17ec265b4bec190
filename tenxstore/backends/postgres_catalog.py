"""What PostgreSQL's catalogs say of a store: the identity of its database and schema
(``astore_id``) and its tables' sizes and rows (``astats``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Table, column, func, literal_column, select, text
from sqlalchemy import table as catalog_table
from sqlalchemy.ext.asyncio import AsyncConnection

from .records import Footprint, TableSizes

__all__ = ["declared_type", "identity_columns", "identity_text", "table_footprint"]


def identity_columns(schema: str | None) -> list[ColumnElement[Any]]:
    """The cluster's system identifier (where this role may read it), the database's
    oid and the schema's: the same through a pooler or another host name, different
    in a copy."""
    return [
        literal_column(
            "CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE')"
            " THEN (SELECT system_identifier::text FROM pg_control_system()) END"
        ),
        literal_column("(SELECT oid FROM pg_database WHERE datname = current_database())"),
        # By its exact name: to_regnamespace() would parse the text as SQL (folding
        # Acme to acme, refusing 'a b')
        select(_NAMESPACE.c.oid)
        .where(_NAMESPACE.c.nspname == (schema or "public"))
        .scalar_subquery(),
    ]


def identity_text(values: Sequence[Any]) -> str:
    """The identity :func:`identity_columns` read."""
    return f"{values[0] or ''}/{values[1]}/{values[2]}"


_NAMESPACE = catalog_table("pg_namespace", column("oid"), column("nspname"), schema="pg_catalog")
_CLASS = catalog_table(
    "pg_class", column("oid"), column("relname"), column("relnamespace"), schema="pg_catalog"
)
_ATTRIBUTE = catalog_table(
    "pg_attribute",
    column("attrelid"),
    column("attname"),
    column("atttypid"),
    column("atttypmod"),
    schema="pg_catalog",
)


def declared_type(of: Table, name: str, schema: str | None) -> ColumnElement[Any]:
    """``format_type`` of a column of a table in ``schema`` (None: the first schema of
    the search path, where unqualified names go)."""
    a, c, n = _ATTRIBUTE, _CLASS, _NAMESPACE
    where = n.c.nspname == (schema if schema is not None else func.current_schema())
    return (
        select(func.format_type(a.c.atttypid, a.c.atttypmod))
        .select_from(a.join(c, c.c.oid == a.c.attrelid).join(n, n.c.oid == c.c.relnamespace))
        .where(where, c.c.relname == of.name, a.c.attname == name)
        .scalar_subquery()
    )


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
