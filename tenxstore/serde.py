"""Encoding and decoding of states, messages, tool arguments and results.

Payloads are stored as JSON text. orjson encodes the common case; the few values
it cannot represent exactly — integers beyond 64 bits and non-finite floats, which
orjson would reject or silently turn into ``null`` — are encoded by the standard
library instead, and such text is marked by one leading space. A leading space is
insignificant JSON whitespace, so the column still holds JSON, yet orjson never
writes one: decoding reads the mark and picks the parser that round-trips exactly.

U+0000 is written as the escape ``\\u0000`` by both encoders, which is why the
columns are ``TEXT`` and not PostgreSQL ``JSONB`` (JSONB rejects that escape).

Nesting is bounded by :data:`MAX_DEPTH` (254, orjson's own limit): a value nested
deeper is refused as soon as validation reaches that depth.

Both encoders accept the same values: JSON's own, plus what orjson writes natively and
the standard library is taught to write the same way (a ``UUID`` as its text, an
``Enum`` member as its value). Datetimes and dataclasses are refused by both.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from typing import Any
from uuid import UUID

import msgspec
import orjson

from .errors import SerializationError

__all__ = ["MAX_DEPTH", "RESERVED_KEY", "decode", "encode", "encode_state"]

RESERVED_KEY = "__checkpoint_version__"
MAX_DEPTH = 254
"""Objects and arrays nested more than this deep are refused (SerializationError):
orjson's own limit, and far beyond what a conversation needs."""
_STDLIB_MARK = " "
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _as_orjson_writes(value: Any) -> Any:
    """The standard library's ``default``: what orjson writes natively, written alike."""
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    return _refuse(value)


Path = tuple[Any, "Path"] | None
"""Where a value sits, as a linked list back to the root: (key or index, parent)."""


def _path(what: str, where: Path) -> str:
    steps: list[str] = []
    while where is not None:
        step, where = where
        steps.append(f"[{step!r}]")
    return what + "".join(reversed(steps))


def _check_tree(value: Any, what: str) -> bool:
    """Walk ``value``; raise SerializationError where it is not JSON.

    Linear in time and memory (each pending item holds its depth and a link to its
    parent, not its path) and bounded in depth: nesting beyond :data:`MAX_DEPTH`
    is refused as soon as the walk reaches it.

    Returns True when it holds a non-finite float (which orjson turns into null).
    """
    nonfinite = False
    stack: list[tuple[Any, int, Path]] = [(value, 0, None)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise SerializationError(
                        f"{_path(what, where)}: string is not valid Unicode ({exc.reason})"
                    ) from None
        elif item is None or isinstance(item, (bool, int, UUID)):
            continue
        elif isinstance(item, Enum):
            stack.append((item.value, depth, where))
        elif isinstance(item, float):
            nonfinite = nonfinite or not math.isfinite(item)
        elif isinstance(item, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise SerializationError(
                    f"{_path(what, where)}: nested more than {MAX_DEPTH} levels deep"
                )
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise SerializationError(
                            f"{_path(what, where)}: key {key!r} is a {type(key).__name__}; "
                            "JSON keys are str"
                        )
                    stack.append((key, depth + 1, where))
                    stack.append((child, depth + 1, (key, where)))
            else:
                stack.extend((child, depth + 1, (i, where)) for i, child in enumerate(item))
        else:
            raise SerializationError(
                f"{_path(what, where)}: {type(item).__name__} is not JSON serializable"
            )
    return nonfinite


def _stdlib_encode(value: Any, what: str, sort_keys: bool = False) -> str:
    _check_tree(value, what)
    try:
        text = json.dumps(
            value,
            ensure_ascii=False,
            separators=(",", ":"),
            sort_keys=sort_keys,
            default=_as_orjson_writes,
        )
        return _STDLIB_MARK + text
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"{what}: {exc}") from exc


def encode(value: Any, what: str = "value", *, sort_keys: bool = False) -> str:
    """Encode any JSON value to text that :func:`decode` turns back into an equal value.

    With ``sort_keys`` the text is canonical: two values are the same JSON (type for
    type: ``1``, ``1.0`` and ``true`` differ) exactly when their texts are equal.

    Raises:
        SerializationError: ``value`` is not JSON (an object, a set, a non-str key,
            an unpaired surrogate...).
    """
    options = _ORJSON_OPTIONS | orjson.OPT_SORT_KEYS if sort_keys else _ORJSON_OPTIONS
    try:
        out = orjson.dumps(value, default=_refuse, option=options)
    except (orjson.JSONEncodeError, RecursionError):
        return _stdlib_encode(value, what, sort_keys)
    # orjson writes NaN and infinities as null: only then is a look at the floats needed.
    if b"null" in out and _has_nonfinite(value):
        return _stdlib_encode(value, what, sort_keys)
    return out.decode()


_PACK = msgspec.msgpack.Encoder()
_FLOAT64 = b"\xcb"  # msgpack's float64 marker, then the 8 bytes big-endian


def _has_nonfinite(value: Any) -> bool:
    """Whether a value orjson accepted holds a NaN or an infinity.

    msgpack writes every float as its 8 bytes, and a non-finite one starts with an
    exponent of all ones (``7f f?`` or ``ff f?``): C code finds the candidates (about
    1.7x orjson's own time on a 5 KB state), and only a candidate — a non-finite float,
    or those bytes by chance in a length or an int — costs the exact walk.
    """
    try:
        packed = _PACK.encode(value)
    except (TypeError, ValueError, OverflowError):  # not msgpack: look at every value
        return _walk_nonfinite(value)
    at = packed.find(_FLOAT64)
    while at >= 0:
        if packed[at + 1 : at + 2] in (b"\x7f", b"\xff") and packed[at + 2 : at + 3] >= b"\xf0":
            return _walk_nonfinite(value)
        at = packed.find(_FLOAT64, at + 1)
    return False


def _walk_nonfinite(value: Any) -> bool:
    """The exact answer, by visiting every container and float."""
    if not isinstance(value, (dict, list, tuple)):
        return isinstance(value, float) and value - value != 0.0
    stack = [value]
    while stack:
        item = stack.pop()
        for child in item.values() if isinstance(item, dict) else item:
            kind = type(child)
            if kind is str or kind is int or kind is bool or child is None:
                continue
            if kind is dict or kind is list or kind is tuple:
                stack.append(child)
            elif kind is float:
                if child - child != 0.0:  # NaN - NaN and inf - inf are NaN
                    return True
            elif isinstance(child, (dict, list, tuple)):  # subclasses orjson writes as such
                stack.append(child)
    return False


def encode_state(state: Any) -> str:
    """Encode a state: a ``dict`` that does not use the reserved key."""
    if not isinstance(state, dict):
        raise SerializationError(f"a state must be a dict, not {type(state).__name__}")
    if RESERVED_KEY in state:
        raise SerializationError(f"the top-level key {RESERVED_KEY!r} is reserved")
    return encode(state, "state")


class TooDeep(ValueError):
    """JSON nested more than :data:`MAX_DEPTH` levels: refused as orjson refuses it."""


def decode(text: str | bytes) -> Any:
    """Decode text written by :func:`encode`.

    Raises:
        ValueError: Not JSON, or nested more than :data:`MAX_DEPTH` levels (on both
            parsers: orjson refuses that itself; the standard library's is bounded
            here, where it would otherwise recurse until ``RecursionError``).
    """
    stdlib = text[:1] == (b" " if isinstance(text, bytes) else _STDLIB_MARK)
    if not stdlib:
        return orjson.loads(text)
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"JSON nested more than {MAX_DEPTH} levels deep") from None
    if _deeper_than(value, MAX_DEPTH):
        raise TooDeep(f"JSON nested more than {MAX_DEPTH} levels deep")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` deep (an iterative walk: only the
    standard library's rare texts, with huge integers or non-finite floats, pay it)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend(
                (child, depth + 1) for child in children if isinstance(child, (dict, list))
            )
    return False
