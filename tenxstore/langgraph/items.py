"""What a LangGraph item is as a memory, and the checks of LangGraph's store ops.

A LangGraph item's value is any JSON object; a memory is ``content`` (text) and
``metadata`` (a JSON object). One store, two faces, both ways and losslessly:

* a value that is exactly ``{"content": str, "metadata": dict}`` is that memory (the
  documents' API reads it as it was written, and a memory written with the documents'
  API reads as such a value);
* any other value is stored as its JSON text in ``content`` (so keyword search finds
  its words), marked in ``metadata`` by :data:`VALUE_TAG` (``{"json": true}``).

A TTL given through the store (minutes, as LangGraph counts them) is kept under the
same tag (``{"ttl": minutes}``), so a read can refresh it. A metadata whose
:data:`VALUE_TAG` entry is not one of these is the caller's own, read back untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langgraph.store.base import InvalidNamespaceError, MatchCondition

from ..errors import ConfigError, SerializationError
from ..memory.validation import MAX_CONTENT_BYTES, same
from ..serde import decode, encode
from ..types import Memory
from ..validate import is_finite

__all__ = [
    "VALUE_TAG",
    "check_filter",
    "check_labels",
    "check_ttl_minutes",
    "matches",
    "to_memory",
    "ttl_minutes",
    "value_of",
]

VALUE_TAG = "__langgraph__"
"""The metadata key under which a memory keeps what its LangGraph face needs."""
_TAG_KEYS = {"json", "ttl"}
MAX_TTL_MINUTES = 10_000 * 525_960
"""Ten thousand years of minutes: a longer TTL reaches past the year 9999 from any
day (refused before it is made a float, which an int past a float's range is not)."""


def check_labels(namespace: object, what: str = "namespace") -> tuple[str, ...]:
    """Namespace labels as LangGraph checks them (``InvalidNamespaceError``): strings,
    not empty, without ``.`` or U+0000."""
    if isinstance(namespace, str) or not isinstance(namespace, (tuple, list)):
        raise InvalidNamespaceError(
            f"{what} must be a tuple of labels, not {type(namespace).__name__}: {namespace!r}"
        )
    for label in namespace:
        if not isinstance(label, str):
            raise InvalidNamespaceError(
                f"Invalid namespace label {label!r} found in {namespace}. Namespace labels "
                f"must be strings, but got {type(label).__name__}."
            )
        if not label:
            raise InvalidNamespaceError(
                f"Namespace labels cannot be empty strings. Got {label!r} in {namespace}"
            )
        if "." in label or "\x00" in label:
            raise InvalidNamespaceError(
                f"Invalid namespace label {label!r} found in {namespace}. Namespace labels "
                "cannot contain periods ('.') or NUL bytes."
            )
    return tuple(namespace)


def check_ttl_minutes(ttl: object, what: str = "ttl") -> float | None:
    """A TTL in minutes: a positive finite number, or None (no expiry)."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not is_finite(ttl):
        raise ConfigError(f"{what} must be minutes (a positive number) or None, not {ttl!r}")
    if ttl <= 0:
        raise ConfigError(f"{what} must be a positive number of minutes, not {ttl!r}")
    if ttl > MAX_TTL_MINUTES:
        raise ConfigError(f"{what} reaches past the year 9999: {ttl!r} minutes")
    return float(ttl)


# -- values ------------------------------------------------------------------------------


def _memory_shaped(value: Mapping[str, Any]) -> bool:
    return (
        len(value) == 2
        and isinstance(value.get("content"), str)
        and isinstance(value.get("metadata"), dict)
        and VALUE_TAG not in value["metadata"]
    )


def to_memory(
    value: object, ttl: float | None, where: str = "the value"
) -> tuple[str, dict[str, Any]]:
    """(content, metadata) of a LangGraph value put with ``ttl`` minutes.

    Raises:
        SerializationError: Not a mapping with str keys and JSON values, or over the
            2 MiB of JSON an item holds (nothing is written).
    """
    if not isinstance(value, Mapping):
        raise SerializationError(f"{where} must be a dict, not {type(value).__name__}")
    tag: dict[str, Any] = {} if ttl is None else {"ttl": ttl}
    if _memory_shaped(value):
        metadata = dict(value["metadata"])
        if tag:
            metadata[VALUE_TAG] = tag
        content = value["content"]
    else:
        content = encode(dict(value), where)
        metadata = {VALUE_TAG: {"json": True, **tag}}
    if len(content) * 4 > MAX_CONTENT_BYTES:
        size = len(content.encode("utf-8", "surrogatepass"))
        if size > MAX_CONTENT_BYTES:
            raise SerializationError(
                f"{where} is {size:,} bytes as JSON, over the {MAX_CONTENT_BYTES:,} an item "
                "holds: store a summary, or split it into several items"
            )
    return content, metadata


def _tag(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """The store's own entry of a memory's metadata; None when there is none, or when
    the entry is not one the store writes (then it is the caller's data)."""
    tag = metadata.get(VALUE_TAG)
    if not isinstance(tag, dict) or not set(tag) <= _TAG_KEYS:
        return None
    if "json" in tag and tag["json"] is not True:
        return None
    if "ttl" in tag:
        minutes = tag["ttl"]
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or minutes <= 0:
            return None
    return tag


def value_of(memory: Memory) -> dict[str, Any]:
    """A memory as its LangGraph value (see the module)."""
    tag = _tag(memory.metadata)
    if tag is not None and tag.get("json"):
        try:
            value = decode(memory.content)
        except ValueError:  # the documents' API wrote the tag over text of its own
            value = None
        if isinstance(value, dict):
            return value
    metadata = memory.metadata
    if tag is not None:
        metadata = {k: v for k, v in metadata.items() if k != VALUE_TAG}
    return {"content": memory.content, "metadata": metadata}


def ttl_minutes(memory: Memory) -> float | None:
    """The TTL a memory was put with through the store (minutes), or None."""
    tag = _tag(memory.metadata)
    if tag is None or "ttl" not in tag or memory.expires_at is None:
        return None
    return float(tag["ttl"])


# -- filters -----------------------------------------------------------------------------

Predicate = Callable[[Mapping[str, Any]], bool]
_ORDERED = {"$gt", "$gte", "$lt", "$lte"}
_OPERATORS = {"$eq", "$ne", "$in", *_ORDERED}
_ABSENT = object()


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ordered(op: str, value: Any, operand: Any) -> bool:
    """Numbers with numbers, text with text; anything else does not match."""
    comparable = (_number(value) and _number(operand)) or (
        isinstance(value, str) and isinstance(operand, str)
    )
    if not comparable:
        return False
    if op == "$gt":
        return bool(value > operand)
    if op == "$gte":
        return bool(value >= operand)
    if op == "$lt":
        return bool(value < operand)
    return bool(value <= operand)


def _matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: a dict of operators tests the value; another dict
    matches a dict holding at least its keys (recursively); a list matches an equal
    list element by element; anything else is JSON equality (``1`` is ``1.0``, not
    ``true``). An absent key matches only ``$ne``."""
    if isinstance(wanted, dict):
        if any(str(k).startswith("$") for k in wanted):
            return all(_operator(value, op, operand) for op, operand in wanted.items())
        return isinstance(value, dict) and all(
            _matches(value.get(k, _ABSENT), v) for k, v in wanted.items()
        )
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(wanted)
            and all(_matches(a, b) for a, b in zip(value, wanted, strict=True))
        )
    return value is not _ABSENT and same(value, wanted)


def _operator(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return value is not _ABSENT and same(value, operand)
    if op == "$ne":
        return value is _ABSENT or not same(value, operand)
    if op == "$in":
        return value is not _ABSENT and any(same(value, c) for c in operand)
    return value is not _ABSENT and _ordered(op, value, operand)


def _check_wanted(path: str, wanted: Any) -> None:
    if isinstance(wanted, dict):
        if any(str(k).startswith("$") for k in wanted):
            for op, operand in wanted.items():
                if op not in _OPERATORS:
                    raise ConfigError(
                        f"filter[{path}]: unsupported operator {op!r} (use "
                        f"{', '.join(sorted(_OPERATORS))})"
                    )
                if op == "$in" and not isinstance(operand, (list, tuple)):
                    raise ConfigError(f"filter[{path}]: $in takes a list, not {operand!r}")
                if op in _ORDERED and not (_number(operand) or isinstance(operand, str)):
                    raise ConfigError(
                        f"filter[{path}]: {op} compares with a number or a str, not {operand!r}"
                    )
            return
        for key, inner in wanted.items():
            _check_wanted(f"{path}.{key}", inner)
    elif isinstance(wanted, (list, tuple)):
        for i, inner in enumerate(wanted):
            _check_wanted(f"{path}[{i}]", inner)


def check_filter(filter: object) -> Predicate | None:
    """A search ``filter`` as a predicate on values (None: none), checked before any I/O.

    Raises:
        ConfigError: Not a dict of str keys, an unknown operator, ``$in`` without a
            list, an ordering against something that is neither a number nor a str.
    """
    if filter is None or filter == {}:
        return None
    if not isinstance(filter, dict) or not all(isinstance(k, str) for k in filter):
        raise ConfigError(f"filter must be a dict with str keys, not {filter!r}")
    for key, wanted in filter.items():
        _check_wanted(key, wanted)
    tests = list(filter.items())

    def predicate(value: Mapping[str, Any]) -> bool:
        return all(_matches(value.get(key, _ABSENT), wanted) for key, wanted in tests)

    return predicate


# -- namespaces ----------------------------------------------------------------------------


def matches(condition: MatchCondition, namespace: Sequence[str]) -> bool:
    """Whether a namespace meets a ``list_namespaces`` condition, as LangGraph's stores
    compare: label by label, whole, ``"*"`` standing for any one label."""
    path = condition.path
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    else:
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    return all(p == "*" or label == p for label, p in pairs)
