"""Statements compiled once by SQLAlchemy and executed at driver level.

The hot path (a state write, a read of the head state) is the same few statements
millions of times. SQLAlchemy builds and compiles them — it stays the one source of
SQL, types and dialects — and the backend sends the compiled text straight to the
driver on a connection from SQLAlchemy's pool, without the execution layer's
per-statement work (the profile put ~0.1 ms per statement and per checkout there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement, ColumnElement
from sqlalchemy.sql.compiler import SQLCompiler

__all__ = ["DRIVER_PACKAGES", "DriverStatement", "OnFirstUse", "RowDecoder", "causes"]

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

    __slots__ = ("_dialect", "_order", "_statement", "sql")
    sql: str

    def __init__(self, statement: ClauseElement, dialect: Dialect) -> None:
        # Compiled at first use (a process that never sends it never pays for it):
        # until then the slots ``sql`` and ``_order`` are unset, and __getattr__ fills
        # them; afterwards they are plain slot reads.
        self._statement = statement
        self._dialect = dialect

    def __getattr__(self, name: str) -> Any:
        if name not in ("sql", "_order"):
            raise AttributeError(name)
        self._compile()
        return object.__getattribute__(self, name)

    def _compile(self) -> None:
        dialect = self._dialect
        compiled = self._statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        order: list[tuple[str, Any, Callable[[Any], Any] | None]] = []
        for name in compiled.positiontup or ():
            bind = compiled.binds[name]
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            order.append((name, bind.value, processor))
        self._order = tuple(order)
        self.sql = compiled.string

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


_K = TypeVar("_K")
_V = TypeVar("_V")


class OnFirstUse(dict[_K, _V]):
    """A dict whose values are made when first asked for (``make(key)``) and kept: the
    variants of a statement a process never sends are never built. Two threads asking
    at once may both make a value; either is kept (the values are alike)."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[_K], _V]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, key: _K) -> _V:
        value = self[key] = self._make(key)
        return value
