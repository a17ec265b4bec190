"""The store records that it holds sealed values.

``tenxstore_store.sealed_since``: when the store was first marked as holding values
sealed under a key ring (encryption at rest); NULL: never. tenxstore marks it when an
instance with a key ring first writes to the store, when ``rotate-keys`` runs, and
when an operator says so (``tenxstore mark-sealed``); an instance without a key ring
then refuses to write (it would store plaintext beside the sealed values), and
``tenxstore doctor`` without keys fails.

A store that already holds sealed values is marked by this revision: it looks at the
newest 100 states and 100 messages (by primary key: no scan of the tables), where a
store in use with a key ring has them. Any other store is marked by its first keyed
write.

Downgrade drops the column (a release before this one neither reads nor writes it).

Revision ID: 0009_store_sealed
Revises: 0008_langgraph_heads
Create Date: 2026-12-03

"""

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import sqlalchemy as sa

from alembic import context, op, util

# The column types and table options this revision was written with: frozen copies,
# never the library's (alembic/frozen_ddl.py, loaded by path as Alembic loads this file).
_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
timestamp = _frozen.timestamp

revision: str = "0009_store_sealed"
down_revision: str | Sequence[str] | None = "0008_langgraph_heads"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NEWEST = 100
# Frozen here rather than imported: a revision must not change with later model code.
# An envelope begins with "!" (tenxstore.crypto); JSON text never does.
_LOOKED_AT = (("states", "state_id", "state_data"), ("messages", "seq", "payload"))


def _holds_sealed_values() -> bool:
    bind = op.get_bind()
    for name, key, payload in _LOOKED_AT:
        table = sa.table(name, sa.column(key), sa.column(payload))
        newest = sa.select(table.c[payload]).order_by(table.c[key].desc()).limit(_NEWEST).subquery()
        sealed = sa.select(sa.literal(1)).where(sa.func.substr(newest.c[payload], 1, 1) == "!")
        if bind.execute(sealed.limit(1)).first() is not None:
            return True
    return False


def upgrade() -> None:
    with op.batch_alter_table("tenxstore_store") as batch:
        batch.add_column(sa.Column("sealed_since", timestamp(), nullable=True))
    if context.is_offline_mode():
        return  # no data to look at: the first keyed write marks the store
    if _holds_sealed_values():
        store = sa.table("tenxstore_store", sa.column("sealed_since", timestamp()))
        op.execute(
            store.update()
            .where(store.c.sealed_since.is_(None))
            .values(sealed_since=datetime.now(timezone.utc))
        )


# 0003's trigger, frozen here: batch mode copies tenxstore_store, drops it and renames
# the copy, which SQLite refuses while a trigger names the table.
_SQLITE_TRIGGER = """
CREATE TRIGGER threads_incarnation AFTER INSERT ON threads FOR EACH ROW
BEGIN
    UPDATE tenxstore_store SET last_incarnation = last_incarnation + 1;
    UPDATE threads SET incarnation = (SELECT last_incarnation FROM tenxstore_store)
        WHERE rowid = NEW.rowid;
END
"""


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:  # in the migration's transaction: no insert runs without it
        op.execute("DROP TRIGGER threads_incarnation")
    with op.batch_alter_table("tenxstore_store") as batch:
        batch.drop_column("sealed_since")
    if sqlite:
        op.execute(_SQLITE_TRIGGER)
