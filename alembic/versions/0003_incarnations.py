"""Thread incarnations and the store's identity.

* ``threads.incarnation``: a number the store gives each life of a thread id, larger
  for every new life (a thread created again after a delete, or replaced by an
  import). A run records it beside ``_checkpoint_version``; a write from a run that
  read an earlier life is refused even when the new life has reached the same version.
  PostgreSQL draws it from the sequence ``thread_incarnations``; SQLite, whose writers
  are serialized anyway, from ``tenxstore_store.last_incarnation`` in a trigger;
  MySQL/MariaDB from an AUTO_INCREMENT column (InnoDB allows one beside another
  primary key when an index leads with it; MySQL 8 has no sequences).
* ``tenxstore_store``: one row holding a random ``store_id`` that names this database
  and schema (the cache's default key namespace: two stores sharing a Redis never
  share an entry, and one store reached two ways — directly or through PgBouncer,
  by two host names — always shares it).

Nothing is kept after a thread is deleted: the counter is store-wide.

Revision ID: 0003_incarnations
Revises: 0002_langgraph
Create Date: 2026-11-30

"""

import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import sqlalchemy as sa

from alembic import op, util

# The column types and table options this revision was written with: frozen copies,
# never the library's (alembic/frozen_ddl.py, loaded by path as Alembic loads this file).
_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
is_mysql, table_options, timestamp = _frozen.is_mysql, _frozen.table_options, _frozen.timestamp

revision: str = "0003_incarnations"
down_revision: str | Sequence[str] | None = "0002_langgraph"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SQLITE_TRIGGER = """
CREATE TRIGGER threads_incarnation AFTER INSERT ON threads FOR EACH ROW
BEGIN
    UPDATE tenxstore_store SET last_incarnation = last_incarnation + 1;
    UPDATE threads SET incarnation = (SELECT last_incarnation FROM tenxstore_store)
        WHERE rowid = NEW.rowid;
END
"""


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    mysql = is_mysql(op.get_bind())
    store = op.create_table(
        "tenxstore_store",
        sa.Column("store_id", sa.String(length=32), nullable=False),
        sa.Column("last_incarnation", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("store_id", name=op.f("pk_tenxstore_store")),
        **table_options(op.get_bind()),
    )
    if sqlite:
        op.add_column(
            "threads",
            sa.Column("incarnation", sa.BigInteger(), server_default="0", nullable=False),
        )
        op.execute("UPDATE threads SET incarnation = rowid")
    elif mysql:
        # Existing rows are numbered as the column is added; new ones draw the next.
        # (A run that failed after this step left the column: the next one keeps it.)
        columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("threads")}
        if "incarnation" not in columns:
            op.execute(
                "ALTER TABLE threads ADD COLUMN incarnation BIGINT NOT NULL AUTO_INCREMENT, "
                "ADD INDEX ix_threads_incarnation (incarnation)"
            )
        if op.get_bind().execute(sa.select(sa.func.count()).select_from(store)).scalar():
            return  # the identity row of a run that failed after writing it
    else:
        op.execute("CREATE SEQUENCE thread_incarnations")
        op.add_column(
            "threads",
            sa.Column(
                "incarnation",
                sa.BigInteger(),
                server_default=sa.text("nextval('thread_incarnations')"),
                nullable=False,
            ),
        )
        op.execute("ALTER SEQUENCE thread_incarnations OWNED BY threads.incarnation")
    op.bulk_insert(
        store,
        [
            {
                "store_id": uuid.uuid4().hex,
                "last_incarnation": 0,
                "created_at": datetime.now(timezone.utc),
            }
        ],
    )
    if sqlite:
        op.execute(
            "UPDATE tenxstore_store SET last_incarnation = "
            "(SELECT COALESCE(MAX(incarnation), 0) FROM threads)"
        )
        op.execute(_SQLITE_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER threads_incarnation")
    if is_mysql(op.get_bind()):
        # (A downgrade that failed after this step dropped it: the next one goes on.)
        columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("threads")}
        if "incarnation" in columns:
            op.execute("ALTER TABLE threads DROP COLUMN incarnation")  # drops its index too
        op.drop_table("tenxstore_store")
        return
    op.drop_column("threads", "incarnation")  # PostgreSQL: drops the sequence it owns
    op.drop_table("tenxstore_store")
