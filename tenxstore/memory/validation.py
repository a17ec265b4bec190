"""Checks of a memory call's arguments, before any I/O: bad input never reaches a
database, and nothing is written.

Arguments that name or bound a call (user ids, keys, namespaces, limits, ``ttl``,
``filter``) raise :class:`~tenxstore.errors.ConfigError`; what is to be stored
(``content``, ``metadata``) raises :class:`~tenxstore.errors.SerializationError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any

from ..errors import ConfigError, SerializationError
from ..serde import encode
from ..types import AuthPolicy
from ..validate import IdType, check_count, check_id, check_text, is_finite, is_int

__all__ = [
    "DEFAULT_NAMESPACE",
    "MAX_CONTENT_BYTES",
    "MAX_LIMIT",
    "MAX_METADATA_BYTES",
    "MAX_NAMESPACE",
    "MAX_QUERY",
    "SHARED_USER",
    "check_content",
    "check_filter",
    "check_key",
    "check_metadata",
    "check_namespace",
    "check_policy",
    "check_query",
    "check_search_limit",
    "check_threshold",
    "check_ttl",
    "check_user",
    "joined",
    "shared_access",
    "shared_owner",
    "split",
]

DEFAULT_NAMESPACE: tuple[str, ...] = ("memories",)
MAX_CONTENT_BYTES = 2 * 1024 * 1024
"""The most a memory's content may hold: 2 MiB of UTF-8 (a larger one is refused)."""
MAX_METADATA_BYTES = 256 * 1024
"""The most a memory's metadata may take as JSON: 256 KiB."""
MAX_NAMESPACE = 255
"""Characters of a namespace, its labels joined with ``.``."""
MAX_LIMIT = 10_000
"""The largest ``limit`` of a search or a listing."""
MAX_QUERY = 10_000
"""Characters of a search query."""
_SEPARATOR = "."


def check_policy(auth_policy: object) -> AuthPolicy | None:
    """An ``auth_policy`` argument: an :class:`AuthPolicy` made by server code, or None."""
    if auth_policy is None or isinstance(auth_policy, AuthPolicy):
        if auth_policy is not None and not isinstance(auth_policy.enforce_user_isolation, bool):
            raise ConfigError("AuthPolicy.enforce_user_isolation must be a bool")
        return auth_policy
    raise ConfigError(
        f"auth_policy must be an AuthPolicy made by server code, not "
        f"{type(auth_policy).__name__}: a client's value never changes isolation"
    )


def check_user(user_id: object, user_id_type: IdType, *, optional: bool = False) -> Any:
    """A user id as ``config["user_id"]`` is checked; None only when ``optional`` (a
    listing or a search of every user, isolation lifted)."""
    if user_id is None:
        if optional:
            return None
        raise ConfigError(
            "user_id is missing: a memory belongs to a user; pass the authenticated user's id"
        )
    return check_id("user_id", user_id, user_id_type)


SHARED_USER = "*"
"""The owner of the items no one user owns: a LangGraph store's to which isolation does
not apply, and an agent's memories (``0`` when user ids are ints). Reserved: a call
scoped to a user may not name it, or an end user given that id would read and delete
them."""
_SHARED: ContextVar[bool] = ContextVar("tenxstore_shared_access", default=False)


def shared_owner(user_id_type: str) -> Any:
    """:data:`SHARED_USER` as an id of ``user_id_type``."""
    return SHARED_USER if user_id_type == "string" else 0


@contextmanager
def shared_access() -> Iterator[None]:
    """Calls made inside act on shared items (the LangGraph store's and an agent's own
    code, never a caller's user id): :data:`SHARED_USER` is accepted as their user."""
    token = _SHARED.set(True)
    try:
        yield
    finally:
        _SHARED.reset(token)


def check_scoped_user(user_id: object, user_id_type: IdType) -> Any:
    """The user of a call scoped to one user: :func:`check_user`, and never the reserved
    :data:`SHARED_USER` (``0`` for int ids) unless the call is :func:`shared_access`'s."""
    owner = check_user(user_id, user_id_type)
    if owner == shared_owner(user_id_type) and not _SHARED.get():
        raise ConfigError(
            f"user_id {owner!r} is reserved for the items no one user owns (a shared "
            "LangGraph store's, an agent's memories): an end user cannot have it; read "
            "them with isolation lifted (AuthPolicy(enforce_user_isolation=False))"
        )
    return owner


def check_key(key: object) -> str:
    """A memory's key: an id of 1-255 characters (a ``uuid.UUID`` as its text)."""
    found: str = check_id("key", key)
    return found


def check_namespace(namespace: object, what: str = "namespace", *, empty: bool = False) -> str:
    """A namespace (a tuple of labels: non-empty strings without ``.``) as it is stored:
    the labels joined with ``.``, at most 255 characters. ``empty``: ``()`` is allowed
    (a prefix matching every namespace)."""
    if isinstance(namespace, str) or not isinstance(namespace, (tuple, list)):
        raise ConfigError(
            f"{what} must be a tuple of labels such as ('memories',), not "
            f"{type(namespace).__name__}"
        )
    if not namespace and not empty:
        raise ConfigError(f"{what} must hold at least one label")
    for i, label in enumerate(namespace):
        check_text(f"{what}[{i}]", label, MAX_NAMESPACE)
        if _SEPARATOR in label:
            raise ConfigError(f"{what}[{i}] must not contain '.': {label!r}")
    text = _SEPARATOR.join(namespace)
    if len(text) > MAX_NAMESPACE:
        raise ConfigError(
            f"{what} is {len(text)} characters with its labels joined by '.', over {MAX_NAMESPACE}"
        )
    return text


def joined(namespace: tuple[str, ...]) -> str:
    """A checked namespace as it is stored."""
    return _SEPARATOR.join(namespace)


def split(text: str) -> tuple[str, ...]:
    """A stored namespace as its labels."""
    return tuple(text.split(_SEPARATOR))


def check_content(content: object) -> str:
    """A memory's content as it is stored (a JSON string), at most
    :data:`MAX_CONTENT_BYTES` of UTF-8.

    Raises:
        SerializationError: Not a str, a lone surrogate, or too large.
    """
    if not isinstance(content, str):
        raise SerializationError(f"content must be a str, not {type(content).__name__}")
    if len(content) * 4 > MAX_CONTENT_BYTES or not content.isascii():
        try:
            size = len(content.encode("utf-8"))
        except UnicodeEncodeError:
            raise SerializationError(
                "content contains a lone surrogate: not valid Unicode"
            ) from None
        if size > MAX_CONTENT_BYTES:
            raise SerializationError(
                f"content is {size:,} bytes of UTF-8, over the {MAX_CONTENT_BYTES:,} a memory "
                "holds: store a summary, or split it into several memories"
            )
    return encode(content, "content")


def check_metadata(metadata: object) -> str:
    """A memory's metadata as it is stored (a JSON object; None is ``{}``).

    Raises:
        SerializationError: Not a dict, not JSON, or over :data:`MAX_METADATA_BYTES`.
    """
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise SerializationError(f"metadata must be a dict, not {type(metadata).__name__}")
    text = encode(metadata, "metadata")
    if len(text) > MAX_METADATA_BYTES // 4 and len(text.encode("utf-8")) > MAX_METADATA_BYTES:
        raise SerializationError(
            f"metadata is over the {MAX_METADATA_BYTES:,} bytes of JSON a memory holds"
        )
    return text


def check_ttl(ttl: object, now: datetime) -> datetime | None:
    """When a memory stored ``now`` with this ``ttl`` expires (None: never).

    Raises:
        ConfigError: ``ttl`` is not a positive number of seconds or ``timedelta``, or
            reaches past the year 9999.
    """
    if ttl is None:
        return None
    if isinstance(ttl, timedelta):
        span = ttl
    elif isinstance(ttl, (int, float)) and not isinstance(ttl, bool) and is_finite(ttl):
        try:
            span = timedelta(seconds=ttl)
        except OverflowError:  # an int past a float's range too
            raise ConfigError(f"ttl reaches past the year 9999: {ttl!r}") from None
    else:
        raise ConfigError(f"ttl must be seconds (an int or float) or a timedelta, not {ttl!r}")
    if span <= timedelta(0):
        raise ConfigError(f"ttl must be positive, not {ttl!r} (None keeps it until deleted)")
    try:
        return now + span
    except OverflowError:
        raise ConfigError(f"ttl reaches past the year 9999: {ttl!r}") from None


def check_query(query: object) -> str:
    """A search query: a str of at most :data:`MAX_QUERY` characters."""
    return check_text("query", query, MAX_QUERY, empty=True)


def check_search_limit(limit: object, what: str = "limit") -> int:
    """A ``limit``: 0 to :data:`MAX_LIMIT`."""
    if not is_int(limit) or not 0 <= limit <= MAX_LIMIT:
        raise ConfigError(f"{what} must be an int from 0 to {MAX_LIMIT}, not {limit!r}")
    return limit


def check_offset(offset: object) -> int:
    """An ``offset``: 0 or more."""
    return check_count("offset", offset)


def check_threshold(score_threshold: object) -> float:
    """A ``score_threshold``: a number from 0 to 1."""
    if (
        isinstance(score_threshold, bool)
        or not isinstance(score_threshold, (int, float))
        or not 0 <= score_threshold <= 1
    ):
        raise ConfigError(f"score_threshold must be a number from 0 to 1, not {score_threshold!r}")
    return float(score_threshold)


_ORDERED = ("$gt", "$gte", "$lt", "$lte")
_OPERATORS = ("$eq", "$ne", "$in", *_ORDERED)
Predicate = Callable[[Mapping[str, Any]], bool]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def same(a: Any, b: Any) -> bool:
    """JSON equality: a bool is not a number, 1 and 1.0 are one number, containers
    compare element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if _number(a) and _number(b):
        return bool(a == b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


_ABSENT = object()


def _test(op: str, operand: Any) -> Callable[[Any], bool]:
    if op == "$eq":
        return lambda v: v is not _ABSENT and same(v, operand)
    if op == "$ne":
        return lambda v: v is _ABSENT or not same(v, operand)
    if op == "$in":
        choices = list(operand)
        return lambda v: v is not _ABSENT and any(same(v, c) for c in choices)
    kind = str if isinstance(operand, str) else float

    def ordered(v: Any) -> bool:
        if not (isinstance(v, str) if kind is str else _number(v)):
            return False
        if op == "$gt":
            return bool(v > operand)
        if op == "$gte":
            return bool(v >= operand)
        if op == "$lt":
            return bool(v < operand)
        return bool(v <= operand)

    return ordered


def check_filter(filter: object) -> Predicate | None:
    """A metadata ``filter`` as a predicate (None: no filter). Each entry tests one
    top-level key of the metadata: a plain value is equality; a dict of operators
    (``$eq $ne $gt $gte $lt $lte $in``) must hold for each. A key the metadata lacks
    matches only ``$ne``. Ordering compares numbers with numbers and text with text
    (anything else does not match).

    Raises:
        ConfigError: Not a dict, a key that is not a str, an unknown operator, ``$in``
            without a list, an ordering against something that is neither a number
            nor a str, or a value that is not JSON.
    """
    if filter is None:
        return None
    if not isinstance(filter, dict):
        raise ConfigError(f"filter must be a dict, not {type(filter).__name__}")
    try:
        encode(filter, "filter")
    except SerializationError as exc:
        raise ConfigError(str(exc)) from None
    tests: list[tuple[str, Callable[[Any], bool]]] = []
    for key, wanted in filter.items():
        operators = isinstance(wanted, dict) and any(str(k).startswith("$") for k in wanted)
        if not operators:
            tests.append((key, _test("$eq", wanted)))
            continue
        for op, operand in wanted.items():
            if op not in _OPERATORS:
                raise ConfigError(
                    f"filter[{key!r}]: unknown operator {op!r} (use {', '.join(_OPERATORS)})"
                )
            if op == "$in" and not isinstance(operand, (list, tuple)):
                raise ConfigError(f"filter[{key!r}]: $in takes a list, not {operand!r}")
            if op in _ORDERED and not (isinstance(operand, str) or _number(operand)):
                raise ConfigError(
                    f"filter[{key!r}]: {op} compares with a number or a str, not {operand!r}"
                )
            if op in _ORDERED and _number(operand) and not is_finite(operand):
                raise ConfigError(f"filter[{key!r}]: {op} compares with a finite number")
            tests.append((key, _test(op, operand)))

    def matches(metadata: Mapping[str, Any]) -> bool:
        return all(test(metadata.get(key, _ABSENT)) for key, test in tests)

    return matches
