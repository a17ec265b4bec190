"""Checks of ids, limits, counts and constructor arguments, done once, before any I/O.

Every public call validates its input here first, so bad input raises a typed error
(``ConfigError`` or ``SerializationError``) and never reaches a database.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Any, Literal, TypeGuard, TypeVar

from .errors import ConfigError, SerializationError

__all__ = [
    "ID_TYPES",
    "MAX_ID_LENGTH",
    "IdType",
    "check_bool",
    "check_choice",
    "check_count",
    "check_id",
    "check_id_type",
    "check_limit",
    "check_positive_number",
    "check_schema_name",
    "check_text",
    "is_int",
    "masked_url",
    "message_id",
]

IdType = Literal["string", "int", "bigint"]
ID_TYPES: tuple[IdType, ...] = ("string", "int", "bigint")
MAX_ID_LENGTH = 255
MAX_SCHEMA_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: a longer name is cut short, silently
MAX_COUNT = 2**63 - 1  # the largest limit, offset or version a database column holds
_INT_BOUNDS = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
C = TypeVar("C", bound=str)


def is_int(value: object) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool`` (``True`` is an int to Python, not to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite(value: int | float) -> bool:
    """Whether a number is finite: every int is (``math.isfinite`` raises
    ``OverflowError`` on an int too large for a float), a float unless NaN or infinite."""
    return isinstance(value, int) or math.isfinite(value)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool, else raise ``ConfigError``."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be a bool, not {value!r}")
    return value


def check_count(name: str, value: object) -> int:
    """A non-negative int that a BIGINT holds, as a limit, an offset or a version."""
    if not is_int(value) or not 0 <= value <= MAX_COUNT:
        raise ConfigError(f"{name} must be an int from 0 to 2**63-1, not {value!r}")
    return value


def check_limit(value: object) -> int | None:
    """A ``limit`` argument: None means no limit."""
    return None if value is None else check_count("limit", value)


def check_positive_number(name: str, value: object) -> float:
    """A positive int or float (a duration in seconds, say)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number, not {value!r}")
    return float(value)


def check_choice(name: str, value: object, choices: tuple[C, ...]) -> C:
    """One of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value


def check_schema_name(value: object) -> str | None:
    """A PostgreSQL schema name (None: the default schema), taken exactly as written.

    tenxstore quotes the name wherever it uses it, so any name PostgreSQL can hold
    works: spaces, dots, quotes, capitals (``Acme`` and ``acme`` are two schemas),
    any Unicode. Refused: an empty name, one over 63 bytes in UTF-8 (PostgreSQL would
    cut it short: the schema made would not be the one asked for), one holding U+0000
    or a lone surrogate (no database text holds them), and a ``pg_`` prefix
    (PostgreSQL keeps those names for itself).
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"schema must be a str, not {type(value).__name__}")
    if not value:
        raise ConfigError("schema must not be empty (None is the default schema)")
    if "\x00" in value:
        raise ConfigError(f"schema must not contain U+0000: {value!r}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigError(f"schema must be valid Unicode (a lone surrogate?): {value!r}") from None
    if size > MAX_SCHEMA_BYTES:
        raise ConfigError(
            f"schema must be at most {MAX_SCHEMA_BYTES} bytes in UTF-8 (PostgreSQL cuts "
            f"longer names short), not {size}: {value!r}"
        )
    if value.startswith("pg_"):
        raise ConfigError(f"schema names starting with 'pg_' are PostgreSQL's own: {value!r}")
    return value


def check_id_type(name: str, value: object) -> IdType:
    """Validate an ``id_type`` / ``user_id_type`` constructor argument."""
    return check_choice(name, value, ID_TYPES)


def check_text(
    what: str, value: object, limit: int | None = MAX_ID_LENGTH, *, empty: bool = False
) -> str:
    """A str that can be stored as an id: 1-``limit`` characters (0 with ``empty``; no
    bound with ``limit=None``), no U+0000, no lone surrogate."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a str, not {type(value).__name__}")
    if (not value and not empty) or (limit is not None and len(value) > limit):
        low = 0 if empty else 1
        high = "" if limit is None else str(limit)
        raise ConfigError(f"{what} must be {low}-{high} characters, not {len(value)}")
    if "\x00" in value:
        raise ConfigError(f"{what} must not contain U+0000")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{what} contains a lone surrogate: not valid Unicode") from None
    return value


def check_id(what: str, value: object, id_type: IdType = "string") -> Any:
    """Return ``value`` as a stored id of ``id_type``, else raise ``ConfigError``.

    A string id is 1-255 characters without U+0000 or a lone surrogate; a
    ``uuid.UUID`` is accepted as its canonical string. Int ids (``"int"``,
    ``"bigint"``) must be ints in the column's range.
    """
    if id_type == "string":
        if isinstance(value, uuid.UUID):
            return str(value)
        if is_int(value):  # never turned into text: 7 and "7" would name one thread
            raise ConfigError(
                f"{what} must be a str or a uuid.UUID, not int ({value}): pass "
                f"str({what}), or create the checkpointer with an int id type"
            )
        return check_text(what, value)
    if not is_int(value):
        raise ConfigError(f"{what} must be an int ({id_type}), not {type(value).__name__}")
    low, high = _INT_BOUNDS[id_type]
    if not low <= value <= high:
        raise ConfigError(f"{what} {value} is out of range for {id_type}")
    return int(value)


def message_id(value: object) -> str:
    """The id of a message inside a state write: bad ones are ``SerializationError``."""
    try:
        result: str = check_id("message id", value)
    except ConfigError as exc:
        raise SerializationError(str(exc)) from None
    return result


# scheme://user:password@ — the password to the last "@" (an unescaped "@" in it would
# otherwise leave its tail on show as the "host"); and password=... in a query.
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*):.*@", re.DOTALL)
_QUERY_SECRET = re.compile(r"(?P<head>[?&;](?:password|sslpassword)=)[^&#;]*", re.IGNORECASE)


def masked_url(url: object) -> str:
    """A URL as a message may show it: its password (and a ``password=`` query option)
    replaced by ``***`` — also in a URL that does not parse, which is when one is shown
    most (a typo in the port, an unclosed IPv6 bracket)."""
    text = (
        url.render_as_string(hide_password=True) if hasattr(url, "render_as_string") else str(url)
    )
    if "://" in text:
        text = _CREDENTIALS.sub(r"\g<head>:***@", text, count=1)
    elif "@" in text:  # no scheme to go by (a typo in it): the first ":" to the last "@"
        slashes = text.find("//")
        colon, at = text.find(":", 0 if slashes < 0 else slashes + 2), text.rfind("@")
        if 0 <= colon < at:
            text = f"{text[:colon]}:***{text[at:]}"
    return _QUERY_SECRET.sub(r"\g<head>***", text)
