"""Statements compiled once by SQLAlchemy and executed at driver level.

The hot path (a state write, a read of the head state) is the same few statements
millions of times. SQLAlchemy builds and compiles them — it stays the one source of
SQL, types and dialects — and the backend sends the compiled text straight to the
driver on a connection from SQLAlchemy's pool, without the execution layer's
per-statement work (the profile put ~0.1 ms per statement and per checkout there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement, ColumnElement
from sqlalchemy.sql.compiler import SQLCompiler

__all__ = ["DRIVER_PACKAGES", "DriverStatement", "RowDecoder", "causes"]

DRIVER_PACKAGES = ("sqlalchemy", "asyncpg", "aiosqlite", "sqlite3", "asyncmy", "pymysql")
"""Packages whose exceptions are the database layer's (a class from one of them, or from
a module under it): what :mod:`tenxstore.boundary` turns into ``DatabaseError``."""


def causes(exc: BaseException | None, limit: int = 5) -> Iterator[BaseException]:
    """``exc`` and what it wraps, outermost first, at most ``limit`` of them: each one's
    SQLAlchemy ``orig`` (the driver's error), else its ``__cause__``, else its
    ``__context__``."""
    seen = exc
    for _ in range(limit):
        if seen is None:
            return
        yield seen
        seen = getattr(seen, "orig", None) or seen.__cause__ or seen.__context__


class DriverStatement:
    """One statement compiled for a dialect: its SQL text and how to order its arguments.

    Arguments are named as the statement's ``bindparam`` names; literal values the
    statement carries itself (``version + 1``) are filled in, and each value goes
    through its type's bind processor for that dialect (a datetime becomes SQLite's
    text, say), as SQLAlchemy's own execution would do.
    """

    __slots__ = ("_order", "sql")

    def __init__(self, statement: ClauseElement, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        self.sql: str = compiled.string
        order: list[tuple[str, Any, Callable[[Any], Any] | None]] = []
        for name in compiled.positiontup or ():
            bind = compiled.binds[name]
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            order.append((name, bind.value, processor))
        self._order = tuple(order)

    def args(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """The positional arguments of one execution."""
        out = []
        for name, default, processor in self._order:
            value = values.get(name, default)
            out.append(value if processor is None else processor(value))
        return tuple(out)


class RowDecoder:
    """The values of rows of given columns as SQLAlchemy's execution would hand them
    back: each through its type's result processor for the dialect (SQLite's stored
    text of a datetime becomes a datetime, say)."""

    __slots__ = ("_processors",)

    def __init__(self, columns: Iterable[ColumnElement[Any]], dialect: Dialect) -> None:
        self._processors = tuple(
            c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns
        )

    def values(self, row: Sequence[Any]) -> list[Any]:
        """The first values of ``row``, one per column, processed."""
        return [
            value if processor is None else processor(value)
            for value, processor in zip(row, self._processors, strict=False)
        ]
