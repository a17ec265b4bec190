"""``memory_vectors.written``: a random stamp every write of a vector writes anew, so
a process's cached matrix of vectors can tell a vector rewritten at the same memory
version and model (``areembed`` back to a model with another ``text_of``, or of
memories whose vector was deleted) from the one it holds.

The vectors already stored get 0 (any later write of theirs gives another stamp).
A plain ``ADD COLUMN`` with a default on every database (SQLite included: no copy of
the table, and pgvector's ``embedding`` column, which the models do not declare, is
left as it is).

Downgrade drops the column.

Revision ID: 0012_memory_vectors_written
Revises: 0011_memory_vectors
Create Date: 2026-12-07

"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0012_memory_vectors_written"
down_revision: str | Sequence[str] | None = "0011_memory_vectors"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "memory_vectors",
        sa.Column("written", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("memory_vectors") as batch:
        batch.drop_column("written")
