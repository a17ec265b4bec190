"""``states.write_id``, and MySQL's one-round-trip state write.

``write_id`` is a random number each one-step state write stores in the row it
inserts: when the connection of such a write breaks mid-flight, tenxstore looks, on a
fresh connection, for a state row holding it — which tells its own write from another
writer's that took the next version. NULL in every row written before, and in the
rows the locked path writes (it commits in its own round trip; nothing to look for).

MySQL / MariaDB: the procedure ``tenx_commit_head``, the common state write in one
round trip (a prepared ``CALL``): the compare-and-swap of the thread's version (and
owner, and incarnation) under its row lock, the state, the new messages (a JSON array
of ``[message_id, role, payload]``, inserted in order, one already stored kept) and the
prune, committed together — or, when the thread does not match, nothing written and
no row returned. Any error rolls the whole of it back and is raised as is.

Its parameters and ``JSON_TABLE``'s columns take the types, character sets and
collations of the columns they are compared with or stored in, as the tables were made
(``id_type``, ``user_id_type``): a routine's text would otherwise take the database's
default character set. The prune scans the unique index of ``states(thread_id,
version)`` by name: a young table's statistics may have it scan every row, and writers
of different threads deadlock. It runs with the caller's privileges (``SQL SECURITY
INVOKER``) and the strict ``sql_mode`` tenxstore's sessions run (a routine keeps the
mode it was created under). Creating it needs the ``CREATE ROUTINE`` privilege;
calling it ``EXECUTE``.

Downgrade drops the procedure and the column.

Revision ID: 0013_states_write_id
Revises: 0012_memory_vectors_written
Create Date: 2026-12-07

"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from alembic import context, op, util

_frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")
is_mysql = _frozen.is_mysql

revision: str = "0013_states_write_id"
down_revision: str | Sequence[str] | None = "0012_memory_vectors_written"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here rather than imported: a revision must not change with later code.
_SQL_MODE = (
    "STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
    "NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO"
)
_PROCEDURE = """
CREATE PROCEDURE tenx_commit_head(
    IN p_thread {thread}, IN p_user {user}, IN p_owned TINYINT, IN p_expected BIGINT,
    IN p_life BIGINT, IN p_state {state}, IN p_meta {state}, IN p_now DATETIME(6),
    IN p_messages {state}, IN p_limit BIGINT, IN p_write_id BIGINT)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    DECLARE v_life BIGINT;
    DECLARE v_user {user};
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    UPDATE threads SET version = version + 1, updated_at = p_now
        WHERE thread_id = p_thread AND version = p_expected
        AND (p_owned = 0 OR user_id <=> p_user)
        AND (p_life IS NULL OR incarnation = p_life);
    IF ROW_COUNT() = 1 THEN
        SELECT incarnation, user_id INTO v_life, v_user FROM threads
            WHERE thread_id = p_thread;
        INSERT INTO states (thread_id, version, state_data, meta, created_at, write_id)
            VALUES (p_thread, p_expected + 1, p_state, p_meta, p_now, p_write_id);
        INSERT INTO messages (thread_id, message_id, role, payload, created_at)
            SELECT p_thread, batch.message_id, batch.role, batch.payload, p_now
            FROM JSON_TABLE(p_messages, '$[*]' COLUMNS (
                ord FOR ORDINALITY,
                message_id {message_id} PATH '$[0]' ERROR ON ERROR,
                role {role} PATH '$[1]' ERROR ON ERROR,
                payload {payload} PATH '$[2]' ERROR ON ERROR)) AS batch
            ORDER BY batch.ord
            ON DUPLICATE KEY UPDATE thread_id = messages.thread_id;
        IF p_expected + 1 - p_limit > 0 THEN
            DELETE pruned FROM states AS pruned FORCE INDEX ({states_key})
                WHERE pruned.thread_id = p_thread AND pruned.version <= p_expected + 1 - p_limit;
        END IF;
        COMMIT;
        SELECT p_expected + 1, v_life, v_user;
    ELSE
        ROLLBACK;
        SELECT p_expected, p_life, p_user FROM DUAL WHERE FALSE;
    END IF;
END
"""


def _column_type(bind: sa.engine.Connection, table: str, column: str, offline: str) -> str:
    """The column's type as MySQL names it, with its character set and collation (a
    parameter compared with it must collate alike); ``offline`` without a database."""
    if context.is_offline_mode():
        return offline
    row = bind.execute(
        sa.text(
            "SELECT COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME FROM "
            "information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = :table AND COLUMN_NAME = :column"
        ),
        {"table": table, "column": column},
    ).one()
    if row[1] is None:  # a number
        return str(row[0])
    return f"{row[0]} CHARACTER SET {row[1]} COLLATE {row[2]}"


def _states_key(bind: sa.engine.Connection) -> str:
    """The unique index of ``states(thread_id, version)``, which the prune must scan: on
    a table whose statistics are young (a new database) the optimizer may scan the
    whole table instead, locking other threads' rows, and concurrent writers of
    different threads deadlock."""
    if context.is_offline_mode():
        return "uq_states_thread_id_version"
    name = bind.execute(
        sa.text(
            "SELECT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = "
            "DATABASE() AND TABLE_NAME = 'states' AND COLUMN_NAME = 'thread_id' "
            "AND SEQ_IN_INDEX = 1 AND NON_UNIQUE = 0"
        )
    ).scalar_one()
    return f"`{name}`"


def _offline_id(kind: str) -> str:
    return {"int": "INT", "bigint": "BIGINT"}.get(kind, "VARCHAR(255)")


def upgrade() -> None:
    op.add_column("states", sa.Column("write_id", sa.BigInteger(), nullable=True))
    bind = op.get_bind()
    if not is_mysql(bind):
        return
    attributes = context.config.attributes
    types = {
        "thread": _column_type(
            bind, "threads", "thread_id", _offline_id(attributes.get("id_type", "string"))
        ),
        "user": _column_type(
            bind, "threads", "user_id", _offline_id(attributes.get("user_id_type", "string"))
        ),
        "state": _column_type(bind, "states", "state_data", "LONGTEXT"),
        # JSON_TABLE's columns as the columns they fill: untyped, a routine's text
        # takes the database's default character set (latin1 loses what it cannot hold)
        "message_id": _column_type(bind, "messages", "message_id", "VARCHAR(255)"),
        "role": _column_type(bind, "messages", "role", "LONGTEXT"),
        "payload": _column_type(bind, "messages", "payload", "LONGTEXT"),
        "states_key": _states_key(bind),
    }
    if _has_procedure(bind):  # an earlier run's, resumed (IF EXISTS would warn)
        op.execute("DROP PROCEDURE tenx_commit_head")
    op.execute(f"SET SESSION sql_mode = '{_SQL_MODE}'")
    op.execute(_PROCEDURE.format(**types))


def _has_procedure(bind: sa.engine.Connection) -> bool:
    if context.is_offline_mode():
        return False
    found = bind.execute(
        sa.text(
            "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() "
            "AND ROUTINE_NAME = 'tenx_commit_head'"
        )
    ).scalar()
    return bool(found)


def downgrade() -> None:
    bind = op.get_bind()
    if is_mysql(bind) and (context.is_offline_mode() or _has_procedure(bind)):
        op.execute("DROP PROCEDURE tenx_commit_head")
    with op.batch_alter_table("states") as batch:
        batch.drop_column("write_id")
