"""A LangGraph checkpoint's channel versions stored once.

A checkpoint blob (LangGraph's msgpack) no longer repeats the channel versions its
row's ``versions`` column names: tenxstore puts them back when it reads the row.
Nothing changes in the tables; the revision is there so that an older tenxstore,
which would read such a blob without its versions (and LangGraph would then run
nodes again), refuses the schema instead (it was migrated by a newer release).

Downgrade writes the versions back into every blob that lacks them (the top-level
map is rewritten; LangGraph's extension types inside are kept as bytes).

Revision ID: 0007_checkpoint_versions_once
Revises: 0006_langgraph_deltas
Create Date: 2026-12-01

"""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from alembic import op, util

# The column types and table options this revision was written with: frozen copies,
# never the library's (alembic/frozen_ddl.py, loaded by path as Alembic loads this file).
_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
long_blob = _frozen.long_blob

revision: str = "0007_checkpoint_versions_once"
down_revision: str | Sequence[str] | None = "0006_langgraph_deltas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PAGE = 500


def upgrade() -> None:
    """Nothing to rewrite: blobs written before keep their versions, and read so."""


def downgrade() -> None:
    bind = op.get_bind()
    c = sa.table(
        "lg_checkpoints",
        sa.column("thread_id"),
        sa.column("checkpoint_ns"),
        sa.column("checkpoint_id"),
        sa.column("type"),
        sa.column("checkpoint", long_blob()),
        sa.column("versions"),
    )
    key = (c.c.thread_id, c.c.checkpoint_ns, c.c.checkpoint_id)
    fill = (
        sa.update(c)
        .where(*(column == sa.bindparam(f"k_{column.name}") for column in key))
        .values(checkpoint=sa.bindparam("k_checkpoint"))
    )
    after: tuple[Any, ...] | None = None
    while True:  # a page of checkpoints at a time, in key order
        page = sa.select(*key, c.c.checkpoint, c.c.versions).where(
            c.c.versions.is_not(None), c.c.type == "msgpack"
        )
        if after is not None:
            page = page.where(sa.tuple_(*key) > sa.tuple_(*after))
        rows = bind.execute(page.order_by(*key).limit(_PAGE)).all()
        if not rows:
            return
        updates = []
        for row in rows:
            whole = _with_versions(bytes(row.checkpoint), json.loads(row.versions))
            if whole is not None:
                updates.append(
                    {
                        "k_thread_id": row.thread_id,
                        "k_checkpoint_ns": row.checkpoint_ns,
                        "k_checkpoint_id": row.checkpoint_id,
                        "k_checkpoint": whole,
                    }
                )
        if updates:
            bind.execute(fill, updates)
        after = tuple(rows[-1][: len(key)])


def _with_versions(blob: bytes, versions: dict[str, str]) -> bytes | None:
    """The msgpack checkpoint ``blob`` with the versions ``versions`` names put back
    (``""`` marks a value kept inline: its version is in the blob); None when it has
    them all."""
    import ormsgpack  # LangGraph's own msgpack: there when such rows were written

    checkpoint = ormsgpack.unpackb(blob, ext_hook=lambda tag, data: ormsgpack.Ext(tag, data))
    held = checkpoint.get("channel_versions") or {}
    missing = {ch: v for ch, v in versions.items() if v != "" and ch not in held}
    if not missing:
        return None
    checkpoint["channel_versions"] = {**missing, **held}
    return bytes(ormsgpack.packb(checkpoint))
