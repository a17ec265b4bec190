"""Find a LangGraph run's checkpoints by an index, not by reading every metadata.

``lg_checkpoints.run_id`` holds the ``run_id`` of a checkpoint's metadata (when it
is a string of at most 255 characters), indexed, so ``adelete_for_runs`` reads the
checkpoints of those runs only. Existing rows are filled in from their metadata,
in batches, and a run that stopped half way is finished by the next one (the rows
still to do are those whose metadata names a run and whose column is empty).

Revision ID: 0005_langgraph_runs
Revises: 0004_hot_updates
Create Date: 2026-11-30

"""

import json
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0005_langgraph_runs"
down_revision: str | Sequence[str] | None = "0004_hot_updates"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BATCH = 1000


def upgrade() -> None:
    with op.batch_alter_table("lg_checkpoints") as batch:
        batch.add_column(sa.Column("run_id", sa.String(length=255), nullable=True))
    op.create_index("ix_lg_checkpoints_run_id", "lg_checkpoints", ["run_id"], unique=False)
    bind = op.get_bind()
    table = sa.table(
        "lg_checkpoints",
        sa.column("thread_id"),
        sa.column("checkpoint_ns"),
        sa.column("checkpoint_id"),
        sa.column("metadata"),
        sa.column("run_id"),
    )
    key = (table.c.thread_id, table.c.checkpoint_ns, table.c.checkpoint_id)
    after: tuple[object, ...] | None = None
    while True:
        stmt = (
            sa.select(*key, table.c.metadata)
            .where(table.c.run_id.is_(None), table.c.metadata.like('%"run\\_id"%', escape="\\"))
            .order_by(*key)
            .limit(_BATCH)
        )
        if after is not None:
            stmt = stmt.where(sa.tuple_(*key) > after)
        rows = bind.execute(stmt).all()
        for row in rows:
            run_id = json.loads(row.metadata).get("run_id")
            if isinstance(run_id, str) and len(run_id) <= 255:
                bind.execute(
                    sa.update(table)
                    .where(*(column == value for column, value in zip(key, row[:3], strict=True)))
                    .values(run_id=run_id)
                )
        if len(rows) < _BATCH:
            return
        after = tuple(rows[-1][:3])


def downgrade() -> None:
    op.drop_index("ix_lg_checkpoints_run_id", table_name="lg_checkpoints")
    with op.batch_alter_table("lg_checkpoints") as batch:
        batch.drop_column("run_id")
