"""LangGraph storage: channel values stored once per version, runs found by an index.

``lg_blobs`` keeps each version of each channel's value once (LangGraph's own
layout): a checkpoint names its channels' versions in ``lg_checkpoints.versions``
and stores no values of its own, so a step that changes one channel writes that
channel alone, not the whole state again. Checkpoints written before keep their
values inline (``versions`` NULL) and read as they did: nothing is converted.

``lg_checkpoints.run_id`` holds the ``run_id`` of a checkpoint's metadata (a longer
one than 255 characters as ``sha256:`` and its digest), indexed, so
``adelete_for_runs`` reads the checkpoints of those runs only. Existing rows are
filled in from their metadata, a page of 1,000 per statement. On PostgreSQL the
migration runs in one transaction holding the table's lock: measured 3 s per
20,000 checkpoints on a 2-core machine (SQLite 0.6 s); plan a window for a large table.

Revision ID: 0005_langgraph_storage
Revises: 0004_hot_updates
Create Date: 2026-11-30

"""

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from alembic import context, op, util

# The column types and table options this revision was written with: frozen copies,
# never the library's (alembic/frozen_ddl.py, loaded by path as Alembic loads this file).
_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
key_string, long_blob, long_text, table_options = (
    _frozen.key_string,
    _frozen.long_blob,
    _frozen.long_text,
    _frozen.table_options,
)

revision: str = "0005_langgraph_storage"
down_revision: str | Sequence[str] | None = "0004_hot_updates"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BATCH = 1000


def _run_id(metadata: str) -> str | None:
    # Frozen here (tenxstore.langgraph.tables.run_id_of writes the same for new rows).
    run_id = json.loads(metadata).get("run_id")
    if not isinstance(run_id, str):
        return None
    if len(run_id) <= 255:
        return run_id
    return "sha256:" + hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()


def _id_type(kind: str) -> sa.types.TypeEngine:  # type: ignore[type-arg]
    # Frozen here rather than imported: a revision must not change with later model code.
    return {"int": sa.Integer(), "bigint": sa.BigInteger()}.get(kind, sa.String(length=255))


def upgrade() -> None:
    """Create lg_blobs, add run_id and versions to lg_checkpoints, fill run_id from each
    checkpoint's metadata in keyset pages, then index it.

    Long because a revision is history: it reads as the steps it takes, in the order it
    takes them (the index after the fill), and is not refactored once released.
    """
    op.create_table(
        "lg_blobs",
        sa.Column(
            "thread_id",
            _id_type(context.config.attributes.get("id_type", "string")),
            nullable=False,
        ),
        sa.Column("checkpoint_ns", key_string(255, 191), nullable=False),
        sa.Column("channel", key_string(255, 191), nullable=False),
        sa.Column("version", key_string(255, 128), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("blob", long_blob(), nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"],
            ["threads.thread_id"],
            name=op.f("fk_lg_blobs_thread_id_threads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "thread_id", "checkpoint_ns", "channel", "version", name=op.f("pk_lg_blobs")
        ),
        **table_options(op.get_bind()),
    )
    with op.batch_alter_table("lg_checkpoints") as batch:
        batch.add_column(sa.Column("run_id", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("versions", long_text(), nullable=True))
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
    fill = (
        sa.update(table)
        .where(
            table.c.thread_id == sa.bindparam("k_thread"),
            table.c.checkpoint_ns == sa.bindparam("k_ns"),
            table.c.checkpoint_id == sa.bindparam("k_id"),
        )
        .values(run_id=sa.bindparam("k_run"))
    )
    after: tuple[object, ...] | None = None
    while True:  # keyset pages; each page's updates in one executemany
        stmt = (
            sa.select(*key, table.c.metadata)
            .where(table.c.run_id.is_(None), table.c.metadata.like('%"run\\_id"%', escape="\\"))
            .order_by(*key)
            .limit(_BATCH)
        )
        if after is not None:
            stmt = stmt.where(sa.tuple_(*key) > after)
        rows = bind.execute(stmt).all()
        updates = [
            {"k_thread": r[0], "k_ns": r[1], "k_id": r[2], "k_run": run}
            for r in rows
            if (run := _run_id(r.metadata)) is not None
        ]
        if updates:
            bind.execute(fill, updates)
        if len(rows) < _BATCH:
            break
        after = tuple(rows[-1][:3])
    # The index last: built once over the filled column, not kept up row by row.
    op.create_index("ix_lg_checkpoints_run_id", "lg_checkpoints", ["run_id"], unique=False)


def downgrade() -> None:
    # Checkpoints whose values live in lg_blobs cannot be read without it.
    op.execute(
        "DELETE FROM lg_writes WHERE EXISTS (SELECT 1 FROM lg_checkpoints c WHERE "
        "c.versions IS NOT NULL AND c.thread_id = lg_writes.thread_id AND "
        "c.checkpoint_ns = lg_writes.checkpoint_ns AND "
        "c.checkpoint_id = lg_writes.checkpoint_id)"
    )
    op.execute("DELETE FROM lg_checkpoints WHERE versions IS NOT NULL")
    op.drop_index("ix_lg_checkpoints_run_id", table_name="lg_checkpoints")
    with op.batch_alter_table("lg_checkpoints") as batch:
        batch.drop_column("versions")
        batch.drop_column("run_id")
    op.drop_table("lg_blobs")
