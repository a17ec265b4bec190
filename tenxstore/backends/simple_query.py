"""Statements sent over PostgreSQL's simple query protocol, their values written into
the SQL as literals, and their rows read back as binary ``COPY ... TO STDOUT``.

A transaction-pooling PgBouncer (1.18 has no prepared statements in transaction mode)
routes one Query message as a unit, where the extended protocol's Parse and Bind may
land on two server connections. A statement compiled once by SQLAlchemy (its
``$n`` placeholders, each followed by the dialect's cast) is split at its placeholders
once (:class:`LiteralStatement`); each call joins the pieces with its values written
as literals:

* strings are dollar-quoted with a random tag that the value does not contain (the
  tag alone, not only ``$tag$``: a value ending in ``$tag`` would otherwise close the
  quote early), so no character of the value is special, whatever
  ``standard_conforming_strings`` says; a string with a NUL (the Query message is a C
  string) or a lone surrogate (not UTF-8) is refused;
* integers (never booleans) as decimal digits in parentheses (``- -1`` would be a
  comment), booleans as ``TRUE``/``FALSE``, None as ``NULL``;
* aware datetimes as ISO 8601 text cast to ``timestamptz``; UUIDs cast to ``uuid``;
* lists of strings as ``ARRAY[...]::text[]`` (``'{}'::text[]`` when empty).

Anything else (naive datetimes, floats, bytes...) is refused: :meth:`~LiteralStatement.render`
returns None and the caller takes its bound path, which accepts or refuses the value
as it always did. ``COPY (query) TO STDOUT (FORMAT binary)`` returns the rows
(:func:`copy_rows`): each field's bytes with its length, so text comes back
byte-exact with no escaping to undo.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.sql import ColumnElement

from .driver import DriverStatement

__all__ = ["LiteralStatement", "Unrenderable", "copy_rows", "decoders", "literal"]

#: A placeholder outside quotes, not inside an identifier (``my$1schema`` is a name).
_PLACES = re.compile(
    r"\"(?:[^\"]|\"\")*\"|'(?:[^']|'')*'|(?<![A-Za-z0-9_$\u0080-\U0010ffff])\$(\d+)"
)
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"


class Unrenderable(ValueError):
    """A value that is not written as a literal (the bound path takes it)."""


def _quoted(text: str) -> str:
    if "\x00" in text:
        raise Unrenderable("a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Unrenderable("not UTF-8") from exc
    while True:
        tag = "t" + secrets.token_hex(8)
        if tag not in text:
            return f"${tag}${text}${tag}$"


def literal(value: Any) -> str:
    """``value`` as a SQL literal (see the module's docstring); raises
    :class:`Unrenderable` for a value it does not write."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return f"({int(value)})"
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise Unrenderable("a naive datetime")
        return f"'{value.isoformat()}'::timestamptz"
    if isinstance(value, uuid.UUID):
        return f"'{value}'::uuid"
    if isinstance(value, (list, tuple)):
        if not all(v is None or isinstance(v, str) for v in value):
            raise Unrenderable("an array of other than strings")
        if not value:
            return "'{}'::text[]"
        return "ARRAY[" + ", ".join(literal(v) for v in value) + "]::text[]"
    raise Unrenderable(f"a {type(value).__name__}")


class LiteralStatement:
    """A compiled statement whose ``$n`` placeholders are filled with literals.

    The SQL is split once at its placeholders; a placeholder numbered past the
    statement's arguments, or an argument with no placeholder, refuses the statement
    (ValueError) rather than send it half filled."""

    __slots__ = ("_pieces", "_slots", "statement")

    def __init__(self, statement: DriverStatement) -> None:
        self.statement = statement
        sql, pieces, slots, at = statement.sql, [], [], 0
        for found in _PLACES.finditer(sql):
            if found.group(1) is None:
                continue  # a quoted name or string: kept as it is
            pieces.append(sql[at : found.start()])
            slots.append(int(found.group(1)) - 1)
            at = found.end()
        pieces.append(sql[at:])
        count = len(statement.args({}))
        if set(slots) != set(range(count)):
            raise ValueError("the statement's placeholders do not match its arguments")
        self._pieces: tuple[str, ...] = tuple(pieces)
        self._slots: tuple[int, ...] = tuple(slots)

    def render(self, args: Sequence[Any]) -> str | None:
        """The SQL with ``args`` (as :meth:`DriverStatement.args` orders them) written in
        as literals; None when one cannot be (the caller takes its bound path)."""
        try:
            values = [literal(value) for value in args]
        except Unrenderable:
            return None
        out = [self._pieces[0]]
        for slot, piece in zip(self._slots, self._pieces[1:], strict=True):
            out.append(values[slot])
            out.append(piece)
        return "".join(out)


Decoder = Callable[[bytes], Any]


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _integer(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def decoders(columns: Sequence[ColumnElement[Any]]) -> tuple[Decoder, ...]:
    """How to read each column's binary COPY field: integers and strings (the hot
    statements' columns); another type raises ValueError."""
    out: list[Decoder] = []
    for column in columns:
        kind = column.type.python_type
        if kind is int:
            out.append(_integer)
        elif kind is str:
            out.append(_text)
        else:
            raise ValueError(f"no binary COPY decoder for {kind.__name__}")
    return tuple(out)


def copy_rows(data: bytes, columns: Sequence[Decoder]) -> list[tuple[Any, ...]]:
    """The rows of a binary ``COPY ... TO STDOUT``, each field decoded."""
    if not data.startswith(_SIGNATURE):
        raise ValueError("not binary COPY data")
    at = len(_SIGNATURE) + 4
    at += 4 + int.from_bytes(data[at : at + 4], "big")  # the header extension
    rows: list[tuple[Any, ...]] = []
    while True:
        fields = int.from_bytes(data[at : at + 2], "big", signed=True)
        at += 2
        if fields == -1:
            return rows
        if fields != len(columns):
            raise ValueError(f"{fields} fields, {len(columns)} expected")
        row: list[Any] = []
        for decode in columns:
            size = int.from_bytes(data[at : at + 4], "big", signed=True)
            at += 4
            if size < 0:
                row.append(None)
            else:
                row.append(decode(data[at : at + size]))
                at += size
        rows.append(tuple(row))
