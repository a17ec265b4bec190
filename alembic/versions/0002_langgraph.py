"""Tables of the LangGraph adapter: lg_checkpoints and lg_writes.

Revision ID: 0002_langgraph
Revises: 0001_initial
Create Date: 2026-11-30

"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from alembic import context, op, util

# The column types and table options this revision was written with: frozen copies,
# never the library's (alembic/frozen_ddl.py, loaded by path as Alembic loads this file).
_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
key_string, long_blob, long_text, table_options, timestamp = (
    _frozen.key_string,
    _frozen.long_blob,
    _frozen.long_text,
    _frozen.table_options,
    _frozen.timestamp,
)

revision: str = "0002_langgraph"
down_revision: str | Sequence[str] | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id_type(kind: str) -> sa.types.TypeEngine:  # type: ignore[type-arg]
    # Frozen here rather than imported: a revision must not change with later model code.
    return {"int": sa.Integer(), "bigint": sa.BigInteger()}.get(kind, sa.String(length=255))


def upgrade() -> None:
    thread_id = _id_type(context.config.attributes.get("id_type", "string"))
    op.create_table(
        "lg_checkpoints",
        sa.Column("thread_id", thread_id, nullable=False),
        sa.Column("checkpoint_ns", key_string(255, 191), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=64), nullable=False),
        sa.Column("parent_checkpoint_id", sa.String(length=64), nullable=True),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("checkpoint", long_blob(), nullable=False),
        sa.Column("metadata", long_text(), nullable=False),
        sa.Column("created_at", timestamp(), nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            ["threads.thread_id"],
            name=op.f("fk_lg_checkpoints_thread_id_threads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "thread_id", "checkpoint_ns", "checkpoint_id", name=op.f("pk_lg_checkpoints")
        ),
        **table_options(op.get_bind()),
    )
    op.create_table(
        "lg_writes",
        sa.Column("thread_id", thread_id, nullable=False),
        sa.Column("checkpoint_ns", key_string(255, 191), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=64), nullable=False),
        sa.Column("task_id", key_string(255, 191), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("channel", long_text(), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("value", long_blob(), nullable=False),
        sa.Column("task_path", long_text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            ["threads.thread_id"],
            name=op.f("fk_lg_writes_thread_id_threads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "thread_id",
            "checkpoint_ns",
            "checkpoint_id",
            "task_id",
            "idx",
            name=op.f("pk_lg_writes"),
        ),
        **table_options(op.get_bind()),
    )


def downgrade() -> None:
    op.drop_table("lg_writes")
    op.drop_table("lg_checkpoints")
