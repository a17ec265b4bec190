"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

"""
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op, util
${imports if imports else ""}

revision: str = ${repr(up_revision)}
down_revision: str | Sequence[str] | None = ${repr(down_revision)}
branch_labels: str | Sequence[str] | None = ${repr(branch_labels)}
depends_on: str | Sequence[str] | None = ${repr(depends_on)}

# Column types and table options come from frozen copies (alembic/frozen_ddl.py, loaded
# by path as Alembic loads this file), never from the library: an edit there must not
# rewrite what a released revision creates. Add a helper there; never change one.
frozen = util.load_python_file(Path(__file__).parents[1], "frozen_ddl.py")


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
