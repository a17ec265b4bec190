"""Create threads, states, messages and tool_executions.

The thread and user id columns take the types chosen when the schema is first
created (`-x id_type=...` / `-x user_id_type=...`, or the checkpointer's
`id_type` / `user_id_type`); `env.py` validates them into `config.attributes`.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-30

"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from alembic import context, op, util

# The column types and table options this revision was written with: frozen copies,
# never the library's (alembic/frozen_ddl.py, loaded by path as Alembic loads this file).
_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
long_text, table_options, timestamp = _frozen.long_text, _frozen.table_options, _frozen.timestamp

revision: str = "0001_initial"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id_type(kind: str) -> sa.types.TypeEngine:  # type: ignore[type-arg]
    # Frozen here rather than imported: a revision must not change with later model code.
    return {"int": sa.Integer(), "bigint": sa.BigInteger()}.get(kind, sa.String(length=255))


def _surrogate() -> sa.types.TypeEngine:  # type: ignore[type-arg]
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create threads, states, messages and tool_executions.

    Long because a revision is history: it reads as the DDL it emits, one table after
    another in order, and is not refactored once released (a split would move the same
    four create_table calls apart, and any edit risks what old databases were made by).
    """
    attributes = context.config.attributes
    thread_id = _id_type(attributes.get("id_type", "string"))
    user_id = _id_type(attributes.get("user_id_type", "string"))
    stamp = timestamp()

    op.create_table(
        "threads",
        # Never AUTO_INCREMENT (MySQL's default for a lone integer primary key): ids are given.
        sa.Column("thread_id", thread_id, nullable=False, autoincrement=False),
        sa.Column("user_id", user_id, nullable=True),
        sa.Column("name", long_text(), nullable=True),
        sa.Column("metadata", long_text(), nullable=True),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", stamp, nullable=False),
        sa.Column("updated_at", stamp, nullable=False),
        sa.PrimaryKeyConstraint("thread_id", name=op.f("pk_threads")),
        **table_options(op.get_bind()),
    )
    op.create_index(
        "ix_threads_user_id_updated_at", "threads", ["user_id", "updated_at"], unique=False
    )
    op.create_table(
        "states",
        sa.Column("state_id", _surrogate(), autoincrement=True, nullable=False),
        sa.Column("thread_id", thread_id, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("state_data", long_text(), nullable=False),
        sa.Column("meta", long_text(), nullable=True),
        sa.Column("created_at", stamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            ["threads.thread_id"],
            name=op.f("fk_states_thread_id_threads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("state_id", name=op.f("pk_states")),
        sa.UniqueConstraint("thread_id", "version", name=op.f("uq_states_thread_id_version")),
        **table_options(op.get_bind()),
    )
    op.create_table(
        "messages",
        sa.Column("seq", _surrogate(), autoincrement=True, nullable=False),
        sa.Column("thread_id", thread_id, nullable=False),
        sa.Column("message_id", sa.String(length=255), nullable=False),
        sa.Column("role", long_text(), nullable=True),
        sa.Column("payload", long_text(), nullable=False),
        sa.Column("created_at", stamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            ["threads.thread_id"],
            name=op.f("fk_messages_thread_id_threads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_messages")),
        sa.UniqueConstraint(
            "thread_id", "message_id", name=op.f("uq_messages_thread_id_message_id")
        ),
        **table_options(op.get_bind()),
    )
    op.create_table(
        "tool_executions",
        sa.Column("thread_id", thread_id, nullable=False),
        sa.Column("tool_call_id", sa.String(length=255), nullable=False),
        sa.Column("tool_name", long_text(), nullable=False),
        sa.Column("args", long_text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("result", long_text(), nullable=True),
        sa.Column("error", long_text(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="1", nullable=False),
        sa.Column("lease_expires_at", stamp, nullable=True),
        sa.Column("started_at", stamp, nullable=False),
        sa.Column("finished_at", stamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            ["threads.thread_id"],
            name=op.f("fk_tool_executions_thread_id_threads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("thread_id", "tool_call_id", name=op.f("pk_tool_executions")),
        **table_options(op.get_bind()),
    )


def downgrade() -> None:
    op.drop_table("tool_executions")
    op.drop_table("messages")
    op.drop_table("states")
    op.drop_index("ix_threads_user_id_updated_at", table_name="threads")
    op.drop_table("threads")
