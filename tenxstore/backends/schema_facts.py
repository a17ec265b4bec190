"""What a store reads of its schema at first use, in ONE statement.

A process's first call checks that the schema is at the revision this release needs,
was made for the checkpointer's id types, and reads the store's id, its sealed marker
and what tells the database apart from a copy (:meth:`.base.Backend.identity_columns`).
Read through Alembic and SQLAlchemy's inspector that is a dozen round trips and an
import of Alembic; a schema at head needs none of that, so the facts come back as one
row of one statement — the version table, the store's row and the catalog's types of
the id columns — and only a schema that is not plainly at head (never migrated,
behind, ahead, or of other id types) is examined the slow way, which says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, column, func, select, table
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from ..models import Tables

if TYPE_CHECKING:
    from .base import Backend

__all__ = ["SchemaFacts", "facts_statement", "id_kind", "read_facts", "read_identity"]


def id_kind(type_name: str | None) -> str | None:
    """The id type (``bigint``, ``int``, ``string``) a column's declared type is, as
    its catalog or SQLAlchemy's reflection names it (``bigint``, ``INTEGER``,
    ``character varying(255)``, ``VARCHAR``...); None for none."""
    if type_name is None:
        return None
    name = type_name.upper()
    if "BIGINT" in name:
        return "bigint"
    if "INT" in name:
        return "int"
    return "string"


@dataclass(frozen=True)
class SchemaFacts:
    """One row of the facts statement."""

    revisions: int
    """Rows in the version table (one for tenxstore's linear history)."""
    revision: str | None
    store_id: str | None
    sealed_since: datetime | None
    id_kinds: tuple[str | None, str | None]
    """The id kinds of ``threads.thread_id`` and ``threads.user_id`` (:func:`id_kind`)."""
    identity: str

    def at(self, head: str, id_kinds: tuple[str, str]) -> bool:
        """Whether the schema is plainly at ``head``, with these id kinds and a store
        row: nothing for the slow check to explain."""
        return (
            self.revisions == 1
            and self.revision == head
            and self.store_id is not None
            and self.id_kinds == id_kinds
        )


def facts_statement(backend: Backend, tables: Tables, schema: str | None) -> Select[Any]:
    """The one statement: the version table's rows, the store's row, the declared
    types of the id columns and the database's identity (a row only when the store
    row exists; an error when a table does not)."""
    versions = table("alembic_version", column("version_num"), schema=schema)
    store, threads = tables.store, tables.threads
    return select(
        select(func.count()).select_from(versions).scalar_subquery(),
        select(func.max(versions.c.version_num)).scalar_subquery(),
        store.c.store_id,
        store.c.sealed_since,
        backend.declared_type(threads, "thread_id", schema),
        backend.declared_type(threads, "user_id", schema),
        *backend.identity_columns(schema),
    ).limit(1)


async def read_facts(
    backend: Backend, conn: AsyncConnection, tables: Tables, schema: str | None
) -> SchemaFacts | None:
    """The facts of the schema, in one statement; None when they cannot be read so
    (a table is missing, the store's row is): the caller then looks the slow way.
    The connection's transaction is rolled back after a failed read."""
    try:
        row = (await conn.execute(facts_statement(backend, tables, schema))).first()
    except DBAPIError:
        if conn.invalidated:
            raise
        await conn.rollback()  # an aborted transaction (PostgreSQL) is usable again
        return None
    if row is None:
        return None
    return SchemaFacts(
        revisions=row[0],
        revision=row[1],
        store_id=row[2],
        sealed_since=row[3],
        id_kinds=(id_kind(row[4]), id_kind(row[5])),
        identity=backend.identity_text(row[6:]),
    )


async def read_identity(backend: Backend, conn: AsyncConnection, schema: str | None) -> str:
    """The database's identity alone (:meth:`.base.Backend.identity_columns`)."""
    columns = backend.identity_columns(schema)
    if not columns:
        return backend.identity_text(())
    row: Sequence[Any] = (await conn.execute(select(*columns))).one()
    return backend.identity_text(row)
