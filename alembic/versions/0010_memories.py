"""Long-term memories: ``memories`` (the current version of each) and
``memory_versions`` (their past versions), with the database's own keyword index.

``memories.terms`` holds the text the full-text engine indexes (the content's words,
tokenized by :mod:`tenxstore.memory.search`); the index over it is each database's:

* SQLite: an FTS5 table ``memories_fts`` (``rowid`` = ``memories.id``; tokenizer
  ``unicode61`` keeping diacritics, letters, digits and marks as token characters),
  kept in step by three triggers on ``memories``. A later batch migration of
  ``memories`` (which copies and drops the table) must create them again.
* PostgreSQL: a GIN index of ``to_tsvector('simple', terms)`` (no stemming, no
  stopwords: every word is found as written).
* MySQL / MariaDB: an InnoDB FULLTEXT index. Its minimum token length and stopwords
  are server settings; the terms are written so that neither applies (see
  ``tenxstore.backends.memory_sql``).

The user id column takes the type of ``threads.user_id`` (as the schema was first
made). The engine's index is named ``ix_memories_terms`` (FTS5: ``memories_fts*``),
left out of ``alembic check``'s comparison: the models do not declare it.

Downgrade drops both tables and the index (their data with them).

Revision ID: 0010_memories
Revises: 0009_store_sealed
Create Date: 2026-12-05

"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from alembic import context, op, util

# The column types and table options this revision was written with: frozen copies,
# never the library's (alembic/frozen_ddl.py, loaded by path as Alembic loads this file).
_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
is_mysql, long_text, table_options, timestamp = (
    _frozen.is_mysql,
    _frozen.long_text,
    _frozen.table_options,
    _frozen.timestamp,
)

revision: str = "0010_memories"
down_revision: str | Sequence[str] | None = "0009_store_sealed"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here rather than imported: a revision must not change with later code.
_SQLITE_FTS = (
    "CREATE VIRTUAL TABLE memories_fts USING fts5(terms, tokenize = "
    "\"unicode61 remove_diacritics 0 categories 'L* N* Co M*'\")",
    "CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN "
    "INSERT INTO memories_fts (rowid, terms) VALUES (NEW.id, NEW.terms); END",
    "CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN "
    "DELETE FROM memories_fts WHERE rowid = OLD.id; END",
    "CREATE TRIGGER memories_fts_update AFTER UPDATE OF terms ON memories BEGIN "
    "DELETE FROM memories_fts WHERE rowid = OLD.id; "
    "INSERT INTO memories_fts (rowid, terms) VALUES (NEW.id, NEW.terms); END",
)
_SQLITE_FTS_DROP = (
    "DROP TRIGGER IF EXISTS memories_fts_update",
    "DROP TRIGGER IF EXISTS memories_fts_delete",
    "DROP TRIGGER IF EXISTS memories_fts_insert",
    "DROP TABLE IF EXISTS memories_fts",
)


def _surrogate() -> sa.types.TypeEngine:  # type: ignore[type-arg]
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _user_id_type(bind: sa.engine.Connection) -> sa.types.TypeEngine:  # type: ignore[type-arg]
    """The type ``threads.user_id`` was made with (``user_id_type``; offline, where
    there is no table to look at: the one asked for, as 0001 takes it)."""
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
    """Create memories and memory_versions, then each database's keyword index.

    Long because a revision is history: it reads as the DDL it emits, in order, and is
    not refactored once released (any edit risks what old databases were made by).
    """
    bind = op.get_bind()
    stamp = timestamp()
    op.create_table(
        "memories",
        sa.Column("id", _surrogate(), autoincrement=True, nullable=False),
        sa.Column("uid", sa.String(length=32), nullable=False),
        sa.Column("user_id", _user_id_type(bind), nullable=False),
        sa.Column("namespace", sa.String(length=255), nullable=False),
        sa.Column("memory_key", sa.String(length=255), nullable=False),
        sa.Column("content", long_text(), nullable=False),
        sa.Column("metadata", long_text(), nullable=False),
        sa.Column("terms", long_text(), nullable=True),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", stamp, nullable=False),
        sa.Column("updated_at", stamp, nullable=False),
        sa.Column("expires_at", stamp, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memories")),
        sa.UniqueConstraint("uid", name=op.f("uq_memories_uid")),
        sa.UniqueConstraint(
            "user_id",
            "namespace",
            "memory_key",
            name=op.f("uq_memories_user_id_namespace_memory_key"),
        ),
        **table_options(bind),
    )
    op.create_index(op.f("ix_memories_expires_at"), "memories", ["expires_at"], unique=False)
    op.create_table(
        "memory_versions",
        sa.Column("memory_id", _surrogate(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("uid", sa.String(length=32), nullable=False),
        sa.Column("content", long_text(), nullable=False),
        sa.Column("metadata", long_text(), nullable=False),
        sa.Column("updated_at", stamp, nullable=False),
        sa.Column("expires_at", stamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["memory_id"],
            ["memories.id"],
            name=op.f("fk_memory_versions_memory_id_memories"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("memory_id", "version", name=op.f("pk_memory_versions")),
        **table_options(bind),
    )
    dialect = bind.dialect.name
    if dialect == "sqlite":
        for statement in _SQLITE_FTS:
            op.execute(statement)
    elif dialect == "postgresql":
        op.execute(
            "CREATE INDEX ix_memories_terms ON memories "
            "USING gin (to_tsvector('simple'::regconfig, terms))"
        )
    elif is_mysql(bind):
        # An empty table: InnoDB adds its hidden FTS_DOC_ID column without a copy. MySQL's
        # DDL commits as it goes: a run resumed after this step finds the index there.
        present = set()
        if not context.is_offline_mode():
            present = {index["name"] for index in sa.inspect(bind).get_indexes("memories")}
        if "ix_memories_terms" not in present:
            op.execute("CREATE FULLTEXT INDEX ix_memories_terms ON memories (terms)")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for statement in _SQLITE_FTS_DROP:
            op.execute(statement)
    op.drop_table("memory_versions")
    op.drop_index(op.f("ix_memories_expires_at"), table_name="memories")
    op.drop_table("memories")
