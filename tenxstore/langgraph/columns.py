"""The columns and orders every LangGraph statement shares, whichever database runs it.

:mod:`tenxstore.langgraph.tables` builds the portable statements; the one-round-trip
paths of PostgreSQL and SQLite (:mod:`tenxstore.backends.postgres_langgraph`,
:mod:`tenxstore.backends.sqlite_langgraph`) read and write the same columns.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement

from ..deltas import MAX_DEPTH

__all__ = ["BLOB_COLUMNS", "LONGEST", "CodePointOrder", "write_order"]

BLOB_COLUMNS = ("channel", "version", "type", "blob", "base", "splice", "skip", "uid")
"""The columns of an ``lg_blobs`` row a value chain is read as."""
LONGEST = 4 * MAX_DEPTH
"""A value chain read is cut here (rebuild then says it is broken)."""


class CodePointOrder(ColumnElement[Any]):
    """A text column ordered by code point, the order Python gives ``str``.

    LangGraph orders a checkpoint's pending writes by ``(task_path, task_id, idx)`` as
    Python compares them; a database orders text by its collation, which on PostgreSQL
    is the database's locale (``en_US.UTF-8`` puts ``"b"`` before ``"C"``, Python the
    other way round) — and the order writes are applied in decides a channel's value.
    SQLite's default ``BINARY`` collation already is code-point order, and so is the
    binary no-pad collation of tenxstore's MySQL tables (``utf8mb4_bin`` would not be:
    it pads, putting ``"a\t"`` before ``"a"``). PostgreSQL's is not: it is compiled
    with ``COLLATE "C"`` (below).
    """

    inherit_cache = True

    def __init__(self, column: ColumnElement[Any]) -> None:
        self.column = column
        self.type = column.type


@compiles(CodePointOrder)
def _code_point_default(element: CodePointOrder, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column, **kw)


@compiles(CodePointOrder, "postgresql")
def _code_point_postgresql(element: CodePointOrder, compiler: SQLCompiler, **kw: Any) -> str:
    """Text in code-point order: PostgreSQL's ``COLLATE "C"`` (its default collation is
    the database's locale, which orders ``"b"`` before ``"C"``)."""
    return f'{compiler.process(element.column, **kw)} COLLATE "C"'


def write_order(w: Any) -> tuple[Any, ...]:
    """ORDER BY for one checkpoint's writes: LangGraph's order, whatever the collation."""
    return (CodePointOrder(w.c.task_path), CodePointOrder(w.c.task_id), w.c.idx)
