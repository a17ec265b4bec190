"""The ops of LangGraph's store, checked before any I/O, as TenxStore runs them.

Each LangGraph op becomes a plain value here: its namespace checked as LangGraph checks
it (``InvalidNamespaceError``) and then as memories are (``ConfigError``), its key, its
limits and filter, and a put's value turned into what the memory stores (its content
and metadata, ``SerializationError`` when it cannot be stored). Nothing is read or
written until every op of a batch passed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    SearchOp,
)

from ..errors import ConfigError
from ..memory.validation import check_content, check_key, check_metadata, check_namespace
from ..validate import check_count, is_int
from .items import Predicate, check_filter, check_labels, check_ttl_minutes, to_memory

__all__ = ["Get", "Listing", "Prepared", "Put", "Search", "prepare"]


class Put(NamedTuple):
    """A put (``content`` None: a delete)."""

    namespace: tuple[str, ...]
    key: str
    content: str | None  # None: a delete
    metadata: dict[str, Any]
    ttl: float | None  # minutes
    value: dict[str, Any] | None = None  # what the index's fields are read from
    fields: list[str] | bool | None = None  # index=: the put's own fields, or False: no vector


class Search(NamedTuple):
    """A search."""

    prefix: tuple[str, ...]
    keep: Predicate | None
    query: str | None
    limit: int
    offset: int
    refresh: bool


class Listing(NamedTuple):
    """A listing of namespaces."""

    conditions: tuple[MatchCondition, ...]
    max_depth: int | None
    limit: int
    offset: int


class Get(NamedTuple):
    """A get."""

    namespace: tuple[str, ...]
    key: str
    refresh: bool


Prepared = Get | Search | Listing | Put


def prepare(op: Op) -> Prepared:
    """An op checked, as the store runs it (before any I/O).

    Raises:
        InvalidNamespaceError: A namespace LangGraph refuses.
        ConfigError: Another invalid argument (a key, a limit, a filter, a TTL...).
        SerializationError: A value that cannot be stored.
    """
    if isinstance(op, GetOp):
        ns = check_labels(op.namespace)
        if ns:
            check_namespace(ns)
        return Get(ns, check_key(op.key), bool(op.refresh_ttl))
    if isinstance(op, SearchOp):
        prefix = check_labels(op.namespace_prefix, "namespace_prefix")
        check_namespace(prefix, "namespace_prefix", empty=True)
        if op.query is not None and not isinstance(op.query, str):
            raise ConfigError(f"query must be a str or None, not {op.query!r}")
        limit, offset = check_count("limit", op.limit), check_count("offset", op.offset)
        keep = check_filter(op.filter)
        return Search(prefix, keep, op.query or None, limit, offset, bool(op.refresh_ttl))
    if isinstance(op, ListNamespacesOp):
        conditions = tuple(op.match_conditions or ())
        for c in conditions:
            if not isinstance(c, MatchCondition) or c.match_type not in ("prefix", "suffix"):
                raise ConfigError(f"unsupported match condition {c!r}: prefix or suffix")
            check_namespace(check_labels(c.path, c.match_type), c.match_type, empty=True)
        if op.max_depth is not None and (not is_int(op.max_depth) or op.max_depth < 1):
            raise ConfigError(f"max_depth must be an int of at least 1, not {op.max_depth!r}")
        limit, offset = check_count("limit", op.limit), check_count("offset", op.offset)
        return Listing(conditions, op.max_depth, limit, offset)
    if isinstance(op, PutOp):
        ns = check_labels(op.namespace)
        if not ns:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        check_namespace(ns)
        key = check_key(op.key)
        if not (op.index is None or op.index is False or isinstance(op.index, list)):
            raise ConfigError(f"index must be None, False or a list of paths: {op.index!r}")
        if op.value is None:
            return Put(ns, key, None, {}, None)
        ttl = check_ttl_minutes(op.ttl)
        content, metadata = to_memory(op.value, ttl, f"the value of {ns!r} {key!r}")
        check_content(content)
        check_metadata(metadata)
        return Put(ns, key, content, metadata, ttl, dict(op.value), op.index)
    raise ConfigError(f"unknown store operation {type(op).__name__}")
