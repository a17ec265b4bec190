"""Search by meaning: ``memory_vectors`` (one vector per memory, float32 bytes, with the
embedding's model id and dimensions) and ``memory_revisions`` (a revision every write to
a user's namespace writes anew, a random stamp, which a process's cached matrix of
vectors is checked against).

Both are portable (no extension): a vector is ``dims`` little-endian float32 numbers
in a binary column, searched exactly by :mod:`tenxstore.memory.vectors`. PostgreSQL's
pgvector is not touched here: ``CREATE EXTENSION vector`` needs a superuser, so its
column and HNSW indexes are added by ``tenxstore memories enable-pgvector``
(idempotent), never by a migration that would silently do nothing without it.

The revisions of the memories already stored are made here (one row per user and
namespace, at 1); ``memory_revisions.user_id`` takes the type of ``threads.user_id``.

Downgrade drops both tables (the vectors with them; a later upgrade needs a
``tenxstore memories reembed``).

Revision ID: 0011_memory_vectors
Revises: 0010_memories
Create Date: 2026-12-04

"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from alembic import context, op, util

# The column types and table options this revision was written with: frozen copies,
# never the library's (alembic/frozen_ddl.py, loaded by path as Alembic loads this file).
_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
long_blob, table_options = _frozen.long_blob, _frozen.table_options

revision: str = "0011_memory_vectors"
down_revision: str | Sequence[str] | None = "0010_memories"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _surrogate() -> sa.types.TypeEngine:  # type: ignore[type-arg]
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _user_id_type(bind: sa.engine.Connection) -> sa.types.TypeEngine:  # type: ignore[type-arg]
    """The type ``threads.user_id`` was made with (offline: the one asked for)."""
    if context.is_offline_mode():
        kind = context.config.attributes.get("user_id_type", "string")
        return {"int": sa.Integer(), "bigint": sa.BigInteger()}.get(kind, sa.String(length=255))
    for column in sa.inspect(bind).get_columns("threads"):
        if column["name"] == "user_id":
            kind = column["type"]
            if isinstance(kind, sa.BigInteger):
                return sa.BigInteger()
            if isinstance(kind, sa.Integer):
                return sa.Integer()
    return sa.String(length=255)


def upgrade() -> None:
    bind = op.get_bind()
    op.create_table(
        "memory_vectors",
        sa.Column("memory_id", _surrogate(), autoincrement=False, nullable=False),
        sa.Column("model_id", sa.String(length=255), nullable=False),
        sa.Column("dims", sa.Integer(), nullable=False),
        sa.Column("vector", long_blob(), nullable=False),
        sa.ForeignKeyConstraint(
            ["memory_id"],
            ["memories.id"],
            name=op.f("fk_memory_vectors_memory_id_memories"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("memory_id", name=op.f("pk_memory_vectors")),
        **table_options(bind),
    )
    op.create_index(
        op.f("ix_memory_vectors_model_id"), "memory_vectors", ["model_id"], unique=False
    )
    op.create_table(
        "memory_revisions",
        sa.Column("user_id", _user_id_type(bind), nullable=False),
        sa.Column("namespace", sa.String(length=255), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("user_id", "namespace", name=op.f("pk_memory_revisions")),
        **table_options(bind),
    )
    op.execute(
        "INSERT INTO memory_revisions (user_id, namespace, revision) "
        "SELECT DISTINCT user_id, namespace, 1 FROM memories"
    )


def downgrade() -> None:
    op.drop_table("memory_revisions")
    op.drop_index(op.f("ix_memory_vectors_model_id"), table_name="memory_vectors")
    op.drop_table("memory_vectors")
