"""Which LangGraph values may be written from outside: those the strict serde opens.

A LangGraph value is ``(type, bytes)`` from LangGraph's serde. Its msgpack may hold
*extensions* that name a callable and its arguments (``["os", "mkdir", "/tmp/x"]``);
LangGraph's permissive serde imports and calls it when the value is read. The
saver's default serde is strict (:mod:`tenxstore.langgraph`: only LangGraph's
``SAFE_MSGPACK_TYPES`` and the types a user allows), and an import or a copy —
values that come from a file or another database, not from this process's graph —
checks every value before writing it: one that the strict serde would refuse is
refused here, with :class:`~tenxstore.errors.SerializationError`, and nothing is
written. The check decodes the value, never constructs anything.

Needs LangGraph (the ``langgraph`` extra) for the list of safe types; a file with
LangGraph values cannot be imported without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from ..errors import ConfigError, SerializationError
from ..extras import require_extra
from ..serde import decode

__all__ = ["AllowedTypes", "allowed_set", "check_value"]

AllowedTypes = Iterable[tuple[str, ...] | type]
"""Types a user allows beyond LangGraph's safe ones: ``(module, name)`` or the class."""

# LangGraph's msgpack extension codes (langgraph.checkpoint.serde.jsonplus).
_CONSTRUCTORS = frozenset((0, 1, 2, 4, 5))  # one arg, args, kwargs, pydantic v1, v2
_METHOD, _NUMPY, _DELTA = 3, 6, 7
_PLAIN_KINDS = frozenset(("null", "bytes", "bytearray"))


def allowed_set(types: AllowedTypes) -> frozenset[tuple[str, ...]]:
    """``(module, name)`` pairs of allowed types (a class given as itself).

    Raises:
        ConfigError: An entry is neither a class nor a tuple of strs.
    """
    if isinstance(types, (str, bytes)):
        raise ConfigError("allowed types must be (module, name) pairs or classes, not one str")
    found: set[tuple[str, ...]] = set()
    for entry in types:
        if isinstance(entry, type):
            found.add((entry.__module__, entry.__name__))
        elif (
            isinstance(entry, tuple) and len(entry) >= 2 and all(isinstance(p, str) for p in entry)
        ):
            found.add(entry)
        else:
            raise ConfigError(f"an allowed type is a (module, name) pair or a class, not {entry!r}")
    return frozenset(found)


def _safe() -> tuple[frozenset[tuple[str, ...]], frozenset[tuple[str, ...]]]:
    try:
        from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_METHODS, SAFE_MSGPACK_TYPES
    except ImportError:
        require_extra(
            "langgraph",
            "langgraph.checkpoint",
            needed_by="checking LangGraph values against LangGraph's safe types",
        )
        raise
    return SAFE_MSGPACK_TYPES, SAFE_MSGPACK_METHODS


def check_value(
    kind: str, data: bytes, what: str, allowed: frozenset[tuple[str, ...]] = frozenset()
) -> None:
    """Refuse a LangGraph value that the strict serde would not open.

    Args:
        kind: The serializer's type (``msgpack``, ``json``, ``bytes``...).
        data: The serialized bytes.
        what: The value's place, for the message (``langgraph_blobs[3].blob``).
        allowed: Types allowed beyond LangGraph's safe ones (see :func:`allowed_set`).

    Raises:
        SerializationError: A type or method that is neither safe nor allowed, a
            pickled value, a serializer type the strict serde does not know, or bytes
            that do not decode.
        ConfigError: LangGraph is not installed.
    """
    if kind in _PLAIN_KINDS:
        return
    if kind == "pickle":
        raise SerializationError(
            f"{what}: a pickled value (type 'pickle') runs code when it is read; it is not written"
        )
    if kind not in ("msgpack", "json"):
        raise SerializationError(
            f"{what}: serializer type {kind[:64]!r} is not one LangGraph's serde reads "
            "(msgpack, json, bytes, bytearray, null); it is not written"
        )
    types, methods = _safe()
    refused: list[str] = []  # ormsgpack turns a hook's exception into its own ValueError
    try:
        if kind == "msgpack":
            _check_msgpack(data, types | allowed, methods, refused)
        else:
            _check_json(data, types | allowed, refused)
    except RecursionError:
        raise SerializationError(f"{what}: nested too deeply to be checked") from None
    except (_Refused, ValueError, TypeError) as exc:
        if refused:
            raise SerializationError(
                f"{what}: names {refused[0]}, which is not a type LangGraph's strict serde "
                "opens (allow your own types with allowed_types= / --allow-type "
                "module:Name); it is not written"
            ) from None
        raise SerializationError(f"{what}: not valid {kind} ({exc})") from None


class _Refused(Exception):
    """A value names something the strict serde would not construct."""


def _refuse(refused: list[str], what: str) -> NoReturn:
    refused.append(what)
    raise _Refused(what)


def _named(parts: Any, count: int, refused: list[str]) -> tuple[str, ...]:
    if not isinstance(parts, (list, tuple)) or len(parts) < count:
        _refuse(refused, "a malformed extension")
    named = tuple(parts[:count])
    if not all(isinstance(p, str) for p in named):
        _refuse(refused, "a malformed extension")
    return named


def _check_msgpack(
    data: bytes,
    types: frozenset[tuple[str, ...]],
    methods: frozenset[tuple[str, ...]],
    refused: list[str],
) -> None:
    import ormsgpack  # LangGraph's own decoder: the value reads as LangGraph reads it

    def hook(code: int, raw: bytes) -> None:
        if code == _NUMPY:  # dtype, shape and a buffer: names no callable
            return None
        inner = ormsgpack.unpackb(raw, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
        if code == _DELTA:
            return None
        if code in _CONSTRUCTORS:
            named = _named(inner, 2, refused)
            if named not in types:
                _refuse(refused, ".".join(named))
            return None
        if code == _METHOD:
            named = _named(inner, 2, refused)
            if len(inner) < 4 or (*named, inner[3]) not in methods:
                _refuse(refused, ".".join(str(p) for p in (*named, *inner[3:4])))
            return None
        _refuse(refused, f"msgpack extension {code}")

    ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)


def _check_json(data: bytes, types: frozenset[tuple[str, ...]], refused: list[str]) -> None:
    """LangChain's ``lc: 2`` constructors in JSON values (LangGraph's older format)."""
    pending: list[Any] = [decode(data)]
    while pending:
        value = pending.pop()
        if isinstance(value, Mapping):
            if value.get("lc") == 2 and value.get("type") == "constructor":
                ids = value.get("id")
                if not isinstance(ids, list) or len(ids) < 2:
                    _refuse(refused, "a malformed constructor")
                named = (".".join(map(str, ids[:-1])), str(ids[-1]))
                if named not in types:
                    _refuse(refused, ".".join(named))
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
