"""A LangGraph namespace's head mark in a row of its own.

``lg_checkpoints.is_head`` gives way to ``lg_heads`` (one row per thread and
namespace, naming the checkpoint the last put wrote): a one-statement put's
compare-and-swap now rewrites that small row instead of its parent checkpoint's
(~1 KB on a chat), which left a dead version of the checkpoint row behind on every
put until a vacuum — the files grew about twice as fast as the rows.

No mark is carried over: a namespace without one takes the locked path on its next
put, which marks it again (as after 0006). Downgrade likewise leaves every
``is_head`` false.

Revision ID: 0008_langgraph_heads
Revises: 0007_checkpoint_versions_once
Create Date: 2026-12-01

"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from alembic import context, op, util

# The column types and table options this revision was written with: frozen copies,
# never the library's (alembic/frozen_ddl.py, loaded by path as Alembic loads this file).
_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
key_string, table_options = _frozen.key_string, _frozen.table_options

revision: str = "0008_langgraph_heads"
down_revision: str | Sequence[str] | None = "0007_checkpoint_versions_once"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id_type(kind: str) -> sa.types.TypeEngine:  # type: ignore[type-arg]
    # Frozen here rather than imported: a revision must not change with later model code.
    return {"int": sa.Integer(), "bigint": sa.BigInteger()}.get(kind, sa.String(length=255))


def upgrade() -> None:
    op.create_table(
        "lg_heads",
        sa.Column(
            "thread_id",
            _id_type(context.config.attributes.get("id_type", "string")),
            nullable=False,
        ),
        sa.Column("checkpoint_ns", key_string(255, 191), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            ["threads.thread_id"],
            name=op.f("fk_lg_heads_thread_id_threads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("thread_id", "checkpoint_ns", name=op.f("pk_lg_heads")),
        **table_options(op.get_bind()),
    )
    with op.batch_alter_table("lg_checkpoints") as batch:
        batch.drop_column("is_head")


def downgrade() -> None:
    with op.batch_alter_table("lg_checkpoints") as batch:
        batch.add_column(
            sa.Column("is_head", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    op.drop_table("lg_heads")
