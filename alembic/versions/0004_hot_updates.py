"""Let the version bump of every write be a HOT update on PostgreSQL.

Every state write updates ``threads.version`` and ``threads.updated_at``. With
``updated_at`` in an index, PostgreSQL can never update the row in place (a HOT
update): each write left a dead row and a new index entry (9,900 dead rows after
5,000 turns). The listing index now holds ``user_id`` alone — a user's threads are
sorted by ``updated_at`` when listed — and the table keeps 10% of each page free
(fillfactor 90) so the new row version fits beside the old one.

Revision ID: 0004_hot_updates
Revises: 0003_incarnations
Create Date: 2026-11-30

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004_hot_updates"
down_revision: str | Sequence[str] | None = "0003_incarnations"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_threads_user_id_updated_at", table_name="threads")
    op.create_index("ix_threads_user_id", "threads", ["user_id"], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE threads SET (fillfactor = 90)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE threads RESET (fillfactor)")
    op.drop_index("ix_threads_user_id", table_name="threads")
    op.create_index(
        "ix_threads_user_id_updated_at", "threads", ["user_id", "updated_at"], unique=False
    )
