"""Running the Alembic migrations programmatically, from a checkout or a wheel, and
checking that a database is at the revision this release needs.

The wheel ships the repository's ``alembic/`` directory as ``tenxstore/_alembic``
(hatchling ``force-include``); a checkout uses ``alembic/`` beside the package.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import MetaData, Table, func, inspect, literal, select
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .backends import Backend
from .backends.schema_facts import id_kind
from .errors import ConfigError, SchemaNotReady
from .models import Base, tables_for
from .validate import IdType

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = [
    "HEAD",
    "alembic_config",
    "check_schema",
    "current_revision",
    "downgrade",
    "head_revision",
    "refuse_foreign_tables",
    "script_location",
    "upgrade",
    "upgrade_connection",
]

HEAD = "0013_states_write_id"
"""The newest revision this release ships (tests/unit/test_cold_imports.py holds it
to the scripts' head): what a first call compares the schema with, without importing
Alembic, which only a migration, or a schema that is not at head, needs."""

log = logging.getLogger("tenxstore.migrate")
_PACKAGE = Path(__file__).resolve().parent
_FIX = "run `await checkpointer.asetup()` (or `checkpointer.setup()`, or `tenxstore upgrade`) once"
_VERSION_TABLE = "alembic_version"
_REMEDY = {
    "postgresql": "another schema (schema='tenxstore', say)",
    "sqlite": "another database file",
    "mysql": "another database (the one the URL names)",
}


def script_location() -> Path:
    """The directory holding ``env.py`` and ``versions/``."""
    for candidate in (_PACKAGE / "_alembic", _PACKAGE.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError("tenxstore's migration scripts are missing from this installation")


def alembic_config(**attributes: Any) -> Config:
    """An Alembic ``Config`` pointing at tenxstore's scripts, with ``attributes`` set."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(script_location()))
    config.attributes.update(attributes)
    return config


@functools.cache
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this installation ships (:data:`HEAD`)."""
    return HEAD


def _check_id_types(
    connection: Connection, schema: str | None, id_type: IdType, user_id_type: IdType
) -> None:
    """The id types a schema was created with must be the checkpointer's."""
    columns = {c["name"]: c["type"] for c in inspect(connection).get_columns("threads", schema)}
    found = tuple(id_kind(type(columns[name]).__name__) for name in ("thread_id", "user_id"))
    if found != (id_type, user_id_type):
        raise ConfigError(
            f"the schema was created with id_type={found[0]!r}, user_id_type={found[1]!r}; "
            f"this checkpointer asks for id_type={id_type!r}, user_id_type={user_id_type!r}"
        )


def _read_schema(
    connection: Connection,
    schema: str | None,
    id_types: tuple[IdType, IdType] | None = None,
) -> tuple[str | None, str | None]:
    """(revision, store id) of the database; (None, None) when it was never migrated.
    With ``id_types``, a migrated schema's id columns must be of those types."""
    inspector = inspect(connection)
    if not inspector.has_table(_VERSION_TABLE, schema):
        return None, None
    has_store = inspector.has_table("tenxstore_store", schema)
    heads = _recorded_heads(connection, schema, has_store)
    if id_types is not None and heads and inspector.has_table("threads", schema):
        _check_id_types(connection, schema, *id_types)
    revision = heads[0] if heads else None
    store_id = None
    if has_store:
        store = tables_for(schema=schema).store
        store_id = connection.execute(select(store.c.store_id)).scalar()
    return revision, store_id


def check_schema(revision: str | None, store_id: str | None, where: str) -> str:
    """The store id of a database at head; otherwise a SchemaNotReady that says why.

    Raises:
        SchemaNotReady: Never migrated, behind head, or migrated by a newer release.
    """
    head = head_revision()
    if revision is None:
        raise SchemaNotReady(f"{where} has no tenxstore schema: {_FIX}")
    if revision != head:
        if not _known(revision):
            raise _newer(revision, where)
        raise SchemaNotReady(f"{where} is at revision {revision}, behind {head}: {_FIX}")
    if store_id is None:  # pragma: no cover - revision 0003 writes it
        raise SchemaNotReady(f"{where} has no store identity row: {_FIX}")
    return store_id


def _place(connection: Connection, schema: str | None) -> str:
    """Where tenxstore was asked to live, in words, for messages (no password)."""
    url = connection.engine.url
    database = url.set(drivername=url.get_backend_name()).render_as_string(hide_password=True)
    return f"schema {schema!r} of {database}" if schema else f"the database {database}"


def _not_ours(
    connection: Connection, schema: str | None, names: list[str], why: str
) -> ConfigError:
    dialect = "mysql" if connection.dialect.name == "mariadb" else connection.dialect.name
    listed = ", ".join(repr(name) for name in names)
    return ConfigError(
        f"{_place(connection, schema)} already holds {'a table' if len(names) == 1 else 'tables'}"
        f" named like tenxstore's that tenxstore did not create: {listed} ({why}). "
        f"Nothing was changed, and tenxstore never touches {'it' if len(names) == 1 else 'them'}"
        f": give tenxstore a place of its own, {_REMEDY.get(dialect, 'another schema')}, or "
        f"move {'that table' if len(names) == 1 else 'those tables'} away."
    )


def refuse_foreign_tables(connection: Connection, schema: str | None) -> None:
    """Before the first migration step: tables named like tenxstore's in its place that
    another application made are refused, untouched (a migration would fail on them
    halfway with the driver's error, or, on MySQL whose DDL commits as it goes, build
    on them). An Alembic version table of another application likewise.

    Raises:
        ConfigError: A table tenxstore did not create is in the way (named).
        SchemaNotReady: A newer tenxstore migrated the schema.
    """
    inspector = inspect(connection)
    present = set(inspector.get_table_names(schema)) | set(inspector.get_view_names(schema))
    if _VERSION_TABLE in present:
        heads = _recorded_heads(connection, schema, "tenxstore_store" in present)
        for head in heads:
            if not _known(head):  # tenxstore's own history, from a newer release
                raise _newer(head, _place(connection, schema))
        if heads:
            return  # tenxstore's history: its tables are its own
    # No revision recorded. Transactional DDL (PostgreSQL, SQLite) leaves nothing of an
    # unfinished run; MySQL's leaves tables behind, after the version table it creates
    # first: a table with tenxstore's primary key is taken as such a run's, to finish.
    foreign = []
    for name in sorted(present & set(Base.metadata.tables)):
        key = inspector.get_pk_constraint(name, schema).get("constrained_columns") or []
        expected = [column.name for column in Base.metadata.tables[name].primary_key]
        if _VERSION_TABLE not in present or list(key) != expected:
            foreign.append(name)
    if foreign:
        raise _not_ours(connection, schema, foreign, "no tenxstore migration made it")


def _recorded_heads(connection: Connection, schema: str | None, has_store: bool) -> tuple[str, ...]:
    """The revisions the version table (which exists) records: none when empty.

    Raises:
        ConfigError: It is another application's: not Alembic's, or the history of
            migrations that are not tenxstore's (and no tenxstore store row beside it).
    """
    columns = {c["name"] for c in inspect(connection).get_columns(_VERSION_TABLE, schema)}
    if "version_num" not in columns:
        raise _not_ours(connection, schema, [_VERSION_TABLE], "it is not Alembic's")
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"version_table_schema": schema})
    heads: tuple[str, ...] = tuple(context.get_current_heads())
    unknown = [head for head in heads if not _known(head)]
    if unknown and not has_store:
        why = f"another application's Alembic history, at revision {unknown[0]!r}"
        raise _not_ours(connection, schema, [_VERSION_TABLE], why)
    return heads


def _newer(revision: str, where: str) -> SchemaNotReady:
    return SchemaNotReady(
        f"{where} is at revision {revision}, which this release does not know "
        f"(its newest is {head_revision()}): a newer tenxstore migrated it; upgrade tenxstore"
    )


def _known(revision: str) -> bool:
    """Whether ``revision`` is one of this release's migrations."""
    from alembic.util import CommandError

    try:
        return _scripts().get_revision(revision) is not None
    except CommandError:
        return False


def _upgrade_sync(
    connection: Connection,
    schema: str | None,
    id_type: IdType,
    user_id_type: IdType,
    revision: str,
) -> str | None:
    before, store_id = _read_schema(connection, schema, (id_type, user_id_type))
    if before is not None and before == (head_revision() if revision == "head" else revision):
        # There already (every start of an application asks): no Alembic run, and no
        # look for foreign tables — a schema at tenxstore's revision holds its own.
        return store_id
    config = alembic_config(
        connection=connection, schema=schema, id_type=id_type, user_id_type=user_id_type
    )
    refuse_foreign_tables(connection, schema)
    from alembic import command

    command.upgrade(config, revision)
    _check_id_types(connection, schema, id_type, user_id_type)
    after, store_id = _read_schema(connection, schema)
    if after != before:
        log.info("migrated %s from %s to %s", schema or "the database", before, after)
    return store_id


async def upgrade(
    backend: Backend,
    *,
    schema: str | None = None,
    id_type: IdType = "string",
    user_id_type: IdType = "string",
    revision: str = "head",
) -> str | None:
    """Migrate the database behind ``backend`` to ``revision`` in one locked transaction.

    Concurrent callers are serialized: on PostgreSQL by a transaction-scoped advisory
    lock taken in ``env.py``, on SQLite by ``BEGIN IMMEDIATE``.

    Returns:
        The store id (None below the revision that creates it).

    Raises:
        ConfigError: The schema exists with other id column types.
    """
    async with backend.migration_connection() as connection:
        return await connection.run_sync(_upgrade_sync, schema, id_type, user_id_type, revision)


def _downgrade_sync(connection: Connection, schema: str | None, revision: str) -> None:
    config = alembic_config(connection=connection, schema=schema)
    before, _ = _read_schema(connection, schema)
    from alembic import command

    command.downgrade(config, revision)
    after, _ = _read_schema(connection, schema)
    log.warning("downgraded %s from %s to %s", schema or "the database", before, after)


async def downgrade(backend: Backend, *, schema: str | None = None, revision: str) -> None:
    """Migrate the database behind ``backend`` down to ``revision`` (``base``: empty).

    Dropping a revision drops its tables and columns, with their data.

    Raises:
        ConfigError: Below ``0006_langgraph_deltas`` while LangGraph values are stored as
            sealed deltas (encryption at rest): the downgrade would join ciphertexts.
            Checked before any revision is undone (MySQL's DDL is not transactional).
    """
    async with backend.migration_connection() as connection:
        if revision in _BELOW_DELTAS:
            await connection.run_sync(_refuse_sealed_deltas, schema)
        await connection.run_sync(_downgrade_sync, schema, revision)


#: Targets a downgrade reaches only by undoing 0006 (which joins deltas back whole).
_BELOW_DELTAS = frozenset(
    {
        "base",
        "0001_initial",
        "0002_langgraph",
        "0003_incarnations",
        "0004_hot_updates",
        "0005_langgraph_storage",
    }
)


def _refuse_sealed_deltas(connection: Connection, schema: str | None) -> None:
    if not inspect(connection).has_table("lg_blobs", schema=schema):
        return
    columns = {c["name"] for c in inspect(connection).get_columns("lg_blobs", schema=schema)}
    if "base" not in columns:
        return
    b = Table("lg_blobs", MetaData(), schema=schema, autoload_with=connection)
    sealed = connection.execute(
        select(literal(1)).where(b.c.base.is_not(None), func.substr(b.c.type, 1, 1) == "!").limit(1)
    ).first()
    if sealed is not None:
        raise ConfigError(
            "this database holds LangGraph values stored as deltas under encryption at "
            "rest: a downgrade below 0006 would join sealed bytes into values that never "
            "open again. Nothing was changed. Keep this revision, or first export the "
            "threads (tenxstore export), delete them, downgrade, and import them again."
        )


async def upgrade_connection(
    connection: AsyncConnection,
    *,
    schema: str | None = None,
    id_type: IdType = "string",
    user_id_type: IdType = "string",
) -> str | None:
    """Migrate to head on ``connection``, in a transaction of its own; the store id."""
    async with connection.begin():
        return await connection.run_sync(_upgrade_sync, schema, id_type, user_id_type, "head")


async def read_schema(
    connection: AsyncConnection,
    schema: str | None = None,
    id_types: tuple[IdType, IdType] | None = None,
) -> tuple[str | None, str | None]:
    """(revision, store id) of the database behind ``connection``.

    Raises:
        ConfigError: ``id_types`` given, and the schema was created with others.
    """
    return await connection.run_sync(_read_schema, schema, id_types)


async def current_revision(engine: AsyncEngine, schema: str | None = None) -> str | None:
    """The revision the database behind ``engine`` is at (None: never migrated)."""
    async with engine.connect() as connection:
        revision, _ = await read_schema(connection, schema)
        return revision
