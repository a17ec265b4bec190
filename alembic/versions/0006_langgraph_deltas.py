"""LangGraph values stored as deltas; a head flag for one-statement puts.

``lg_blobs`` gains ``base``, ``splice`` and ``skip``: a channel's new version that is
its previous version with elements appended (a chat's ``messages``) is stored as
what it gained, with a link to the version it extends (see ``tenxstore.deltas``),
and ``uid``, the row's random identity (a delta is written on a base only while that
very row is there). Existing rows are whole values (``base`` NULL, ``uid`` 0).

``lg_checkpoints.is_head`` marks the checkpoint a namespace's last put wrote (false:
not known, as for every existing row): a put whose parent is marked takes it over in
one statement, a compare-and-swap on that row; any other put takes the locked path,
which sets the flag again. Adding the columns rewrites nothing on PostgreSQL 11+.

Downgrade writes every delta back whole first (per thread and channel, in Python),
so nothing is lost.

Revision ID: 0006_langgraph_deltas
Revises: 0005_langgraph_storage
Create Date: 2026-11-30

"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from alembic import op, util

# The column types and table options this revision was written with: frozen copies,
# never the library's (alembic/frozen_ddl.py, loaded by path as Alembic loads this file).
_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
long_blob = _frozen.long_blob

revision: str = "0006_langgraph_deltas"
down_revision: str | Sequence[str] | None = "0005_langgraph_storage"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("lg_blobs") as batch:
        batch.add_column(sa.Column("base", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("splice", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("skip", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("uid", sa.BigInteger(), server_default="0", nullable=False))
    with op.batch_alter_table("lg_checkpoints") as batch:
        batch.add_column(
            sa.Column("is_head", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def _whole(rows: dict[str, tuple[bytes, str | None, int, int]], version: str) -> bytes:
    # Frozen here (tenxstore.deltas.rebuild reads the same format).
    chain = []
    at: str | None = version
    while at is not None:
        blob, base, splice, skip = rows[at]
        chain.append((blob, splice, skip))
        at = base
    value = chain[-1][0]
    for blob, splice, skip in reversed(chain[:-1]):
        value = blob[:splice] + value[skip:] + blob[splice:]
    return value


def _refuse_sealed_deltas(bind: sa.engine.Connection) -> None:
    """A delta sealed by encryption at rest (its type marked ``!``) is an envelope of its
    own: joining its bytes to its base's would make values that never open again. The
    downgrade refuses before it changes anything (tenxstore cannot open them here: the
    migration has no keys)."""
    from tenxstore.errors import ConfigError

    if "base" not in {c["name"] for c in sa.inspect(bind).get_columns("lg_blobs")}:
        return  # a MySQL downgrade resumed past its last DDL: nothing joined is left
    b = sa.table("lg_blobs", sa.column("base"), sa.column("type"))
    sealed = bind.execute(
        sa.select(sa.literal(1))
        .where(b.c.base.is_not(None), sa.func.substr(b.c.type, 1, 1) == "!")
        .limit(1)
    ).first()
    if sealed is not None:
        raise ConfigError(
            "this database holds LangGraph values stored as deltas under encryption at "
            "rest: a downgrade below 0006 would join sealed bytes into values that never "
            "open again. Nothing was changed. Keep this revision, or first export the "
            "threads (tenxstore export), delete them, downgrade, and import them again."
        )


def downgrade() -> None:
    bind = op.get_bind()
    _refuse_sealed_deltas(bind)
    b = sa.table(
        "lg_blobs",
        sa.column("thread_id"),
        sa.column("checkpoint_ns"),
        sa.column("channel"),
        sa.column("version"),
        sa.column("blob", long_blob()),
        sa.column("base"),
        sa.column("splice"),
        sa.column("skip"),
    )
    # A MySQL downgrade that failed after dropping lg_blobs.base (its last DDL) had
    # rebuilt every blob already: nothing is left to fill.
    filled = "base" not in {c["name"] for c in sa.inspect(bind).get_columns("lg_blobs")}
    channels = (
        []
        if filled
        else bind.execute(
            sa.select(b.c.thread_id, b.c.checkpoint_ns, b.c.channel)
            .where(b.c.base.is_not(None))
            .distinct()
        ).all()
    )
    key = (b.c.thread_id, b.c.checkpoint_ns, b.c.channel, b.c.version)
    fill = (
        sa.update(b)
        .where(*(column == sa.bindparam(f"k_{column.name}") for column in key))
        .values(blob=sa.bindparam("k_blob"), base=None, splice=None, skip=None)
    )
    for thread_id, ns, channel in channels:  # one channel's chains at a time
        found = bind.execute(
            sa.select(b.c.version, b.c.blob, b.c.base, b.c.splice, b.c.skip).where(
                b.c.thread_id == thread_id, b.c.checkpoint_ns == ns, b.c.channel == channel
            )
        ).all()
        rows = {r.version: (bytes(r.blob), r.base, r.splice or 0, r.skip or 0) for r in found}
        updates = [
            {
                "k_thread_id": thread_id,
                "k_checkpoint_ns": ns,
                "k_channel": channel,
                "k_version": version,
                "k_blob": _whole(rows, version),
            }
            for version, (_, base, _, _) in rows.items()
            if base is not None
        ]
        bind.execute(fill, updates)
    with op.batch_alter_table("lg_checkpoints") as batch:
        batch.drop_column("is_head")
    with op.batch_alter_table("lg_blobs") as batch:
        batch.drop_column("uid")
        batch.drop_column("skip")
        batch.drop_column("splice")
        batch.drop_column("base")
