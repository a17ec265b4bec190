"""Running the Alembic migrations programmatically, from a checkout or a wheel.

The wheel ships the repository's ``alembic/`` directory as ``tenxstore/_alembic``
(hatchling ``force-include``); a checkout uses ``alembic/`` beside the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from alembic import command

from .backends import Backend
from .errors import ConfigError
from .validate import IdType

__all__ = [
    "alembic_config",
    "current_revision",
    "head_revision",
    "script_location",
    "upgrade",
    "upgrade_connection",
]

_PACKAGE = Path(__file__).resolve().parent


def script_location() -> Path:
    """The directory holding ``env.py`` and ``versions/``."""
    for candidate in (_PACKAGE / "_alembic", _PACKAGE.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError("tenxstore's migration scripts are missing from this installation")


def alembic_config(**attributes: Any) -> Config:
    """An Alembic ``Config`` pointing at tenxstore's scripts, with ``attributes`` set."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    config.attributes.update(attributes)
    return config


def _id_kind(column_type: Any) -> IdType:
    name = type(column_type).__name__.upper()
    if "BIGINT" in name:
        return "bigint"
    if "INT" in name:
        return "int"
    return "string"


def _upgrade_sync(
    connection: Connection,
    schema: str | None,
    id_type: IdType,
    user_id_type: IdType,
    revision: str,
) -> None:
    config = alembic_config(
        connection=connection, schema=schema, id_type=id_type, user_id_type=user_id_type
    )
    command.upgrade(config, revision)
    columns = {c["name"]: c["type"] for c in inspect(connection).get_columns("threads", schema)}
    found = (_id_kind(columns["thread_id"]), _id_kind(columns["user_id"]))
    if found != (id_type, user_id_type):
        raise ConfigError(
            f"the schema was created with id_type={found[0]!r}, user_id_type={found[1]!r}; "
            f"this checkpointer asks for id_type={id_type!r}, user_id_type={user_id_type!r}"
        )


async def upgrade(
    backend: Backend,
    *,
    schema: str | None = None,
    id_type: IdType = "string",
    user_id_type: IdType = "string",
    revision: str = "head",
) -> None:
    """Migrate the database behind ``backend`` to ``revision`` in one locked transaction.

    Concurrent callers are serialized: on PostgreSQL by a transaction-scoped advisory
    lock taken in ``env.py``, on SQLite by ``BEGIN IMMEDIATE``.

    Raises:
        ConfigError: The schema exists with other id column types.
    """
    async with backend.migration_connection() as connection:
        await connection.run_sync(_upgrade_sync, schema, id_type, user_id_type, revision)


async def upgrade_connection(
    connection: AsyncConnection,
    *,
    schema: str | None = None,
    id_type: IdType = "string",
    user_id_type: IdType = "string",
) -> None:
    """Migrate to head on ``connection``, in a transaction of its own."""
    async with connection.begin():
        await connection.run_sync(_upgrade_sync, schema, id_type, user_id_type, "head")


def head_revision() -> str | None:
    """The newest revision this installation ships."""
    head: str | None = ScriptDirectory.from_config(alembic_config()).get_current_head()
    return head


async def current_revision(engine: AsyncEngine, schema: str | None = None) -> str | None:
    """The revision the database behind ``engine`` is at (None: never migrated)."""

    def read(connection: Connection) -> str | None:
        context = MigrationContext.configure(connection, opts={"version_table_schema": schema})
        revision: str | None = context.get_current_revision()
        return revision

    async with engine.connect() as connection:
        return await connection.run_sync(read)
