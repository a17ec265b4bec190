"""Alembic environment for tenxstore (async template + the cookbook's shared connection).

Run from a checkout (`alembic upgrade head`) it builds its own engine from
`-x url=`, TENXSTORE_DATABASE_URL or `sqlalchemy.url`. Called by
`tenxstore.migrate` it uses the connection passed in `config.attributes`, which is
already inside the write transaction that holds the migration lock.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from alembic import context
from tenxstore.backends import async_url, open_backend
from tenxstore.backends.mysql import is_mysql, resumable
from tenxstore.migrate import refuse_foreign_tables
from tenxstore.models import Base
from tenxstore.validate import check_id_type, check_schema_name

config = context.config
target_metadata = Base.metadata
_x = context.get_x_argument(as_dictionary=True)


def _setting(key: str, env: str | None = None) -> Any:
    """A setting from -x, then config.attributes, then the environment."""
    if key in _x:
        return _x[key]
    if key in config.attributes:
        return config.attributes[key]
    return os.environ.get(env) if env else None


schema = check_schema_name(_setting("schema", "TENXSTORE_SCHEMA") or None)
config.attributes["id_type"] = check_id_type("id_type", _setting("id_type") or "string")
config.attributes["user_id_type"] = check_id_type(
    "user_id_type", _setting("user_id_type") or "string"
)


def _lock_and_place(connection: Connection) -> None:
    """Serialize concurrent migrations and point DDL at the schema (PostgreSQL)."""
    if is_mysql(connection):
        # The caller holds GET_LOCK (MysqlBackend.migration_connection). Alembic's own
        # version table names its primary key, which MySQL ignores with a warning the
        # driver logs: make the same table without the name (Alembic keeps a table
        # that exists).
        if not inspect(connection).has_table("alembic_version"):
            connection.execute(
                text(
                    "CREATE TABLE IF NOT EXISTS alembic_version (version_num VARCHAR(32) NOT NULL, "
                    "PRIMARY KEY (version_num))"
                )
            )
        return
    if connection.dialect.name != "postgresql":
        return  # SQLite: the caller's BEGIN IMMEDIATE already serializes writers
    # Transaction-scoped: released at commit, safe behind PgBouncer transaction pooling.
    connection.execute(
        text("SELECT pg_advisory_xact_lock(7305, hashtext(:key))"),
        {"key": f"tenxstore.migrate:{schema or ''}"},
    )
    if schema:
        quoted = connection.dialect.identifier_preparer.quote_schema(schema)
        # Sent as written: text() would take a ':name' inside the quoted name for a
        # bind parameter.
        connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        connection.exec_driver_sql(f"SET LOCAL search_path TO {quoted}")


def _include_name(name: str | None, type_: str, _parents: Any) -> bool:
    """Leave Alembic's own table out of autogenerate, wherever the search path finds it,
    MySQL's index on the AUTO_INCREMENT incarnation (which InnoDB requires; no model
    index of other databases), and the memories' full-text index of each database
    (migration 0010: a GIN expression index, a FULLTEXT index, SQLite's FTS5 table and
    its shadow tables), which the models do not declare."""
    if type_ == "index" and name in ("ix_threads_incarnation", "ix_memories_terms"):
        return False
    if type_ == "table" and name is not None and name.startswith("memories_fts"):
        return False
    return not (type_ == "table" and name == "alembic_version")


def do_run_migrations(connection: Connection) -> None:
    """Configure the context on ``connection`` and run the migrations."""
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table_schema=schema,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_name=_include_name,
    )
    if is_mysql(connection):
        resumable(context.get_context().impl)  # DDL commits as it goes: resume, not fail
    if config.attributes.get("connection") is None:
        # Run from the command line: the same refusal as asetup() (which checked already).
        refuse_foreign_tables(connection, schema)
    with context.begin_transaction():
        _lock_and_place(connection)
        context.run_migrations()


async def run_async_migrations() -> None:
    """Create an engine from the configured URL and migrate in one write transaction."""
    url = _setting("url", "TENXSTORE_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit(
            "no database URL: set TENXSTORE_DATABASE_URL, pass -x url=..., "
            "or set sqlalchemy.url in alembic.ini"
        )
    backend = open_backend(url)
    try:
        async with backend.migration_connection() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await backend.aclose()


def run_migrations_offline() -> None:
    """Emit SQL for the configured URL without connecting (`alembic upgrade --sql`)."""
    url = _setting("url", "TENXSTORE_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    context.configure(
        url=str(async_url(url)) if url else None,
        target_metadata=target_metadata,
        version_table_schema=schema,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
elif (shared := config.attributes.get("connection")) is not None:
    do_run_migrations(shared)
else:
    asyncio.run(run_async_migrations())
