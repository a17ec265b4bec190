"""The column types and table options the revisions in ``versions/`` were written with.

Frozen: a revision must emit the same DDL whatever the library becomes, so the
revisions take these from here, never from ``tenxstore`` (the models' live types are
``tenxstore.models``; a unit test, ``tests/unit/test_frozen_migrations.py``, refuses a
revision that imports ``tenxstore`` beyond ``tenxstore.errors``). Never change a
function here: a later revision that needs another type gets a new function.

Not a revision (Alembic loads every ``.py`` in ``versions/`` as one, so this sits
beside ``env.py``), and not importable by name (this directory is ``alembic/`` in a
checkout and ``tenxstore/_alembic`` in the wheel): each revision loads it from its
own path with Alembic's ``load_python_file``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DateTime, LargeBinary, String, Text
from sqlalchemy.dialects.mysql import DATETIME, LONGBLOB, LONGTEXT


def long_text() -> Any:
    """TEXT everywhere; LONGTEXT on MySQL (its TEXT holds 64 KB; LONGTEXT 4 GB)."""
    return Text().with_variant(LONGTEXT(), "mysql", "mariadb")


def long_blob() -> Any:
    """A binary column; LONGBLOB on MySQL (its BLOB holds 64 KB)."""
    return LargeBinary().with_variant(LONGBLOB(), "mysql", "mariadb")


def timestamp() -> Any:
    """A time with its zone; on MySQL ``DATETIME(6)`` (microseconds, UTC by convention:
    every session runs in UTC, and the store writes UTC)."""
    return DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb")


def key_string(length: int, mysql_length: int) -> Any:
    """A VARCHAR in a composite key: shorter on MySQL, whose InnoDB index keys hold at
    most 3072 bytes (a utf8mb4 character takes 4)."""
    return String(length).with_variant(String(mysql_length), "mysql", "mariadb")


def is_mysql(bind: Any) -> bool:
    """Whether a connection (or dialect) is MySQL or MariaDB."""
    dialect = getattr(bind, "dialect", bind)
    return dialect.name in ("mysql", "mariadb")


def table_options(bind: Any) -> dict[str, Any]:
    """``create_table`` keywords: InnoDB in utf8mb4 with a binary no-pad collation on
    MySQL/MariaDB (ids compare byte for byte, trailing spaces included); none elsewhere."""
    if not is_mysql(bind):
        return {}
    mariadb = getattr(bind.dialect, "is_mariadb", False)
    collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": collation}
