"""What a store's values are sealed under: counted in SQL, and tried (``tenxstore doctor``).

:func:`akey_usage` counts every payload value by what it is sealed under — each key of
the repository's ring, a key the ring lacks (each named), nothing (plaintext), or an
envelope too damaged to name a key — and opens a few values of each key of the ring
in each column, which tells a key of the right id but the wrong bytes (another
environment's key, a key generated again under the same name) from the right one.
What it cannot tell: a single value damaged among many that open; that one is found
when it is read.

Every count is one statement a table, reading every row of the payload tables (and a
few more statements when keys are missing): an operator's check, not a health probe
(:meth:`~tenxstore.CheckpointRepository.acheck` stays cheap).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sqlalchemy import String, and_, bindparam, case, func, not_, select

from .crypto import KeyRing, _bytes_key_id, bytes_head, sealed_key_id, text_head
from .errors import DecryptionError
from .rotation import _TABLES, TABLES, _store_of

__all__ = ["KeyUsage", "akey_usage"]

TRIED = 3
"""Values of each key of the ring opened per column (any of them: no order is asked
for)."""
MAX_NAMED = 32
"""Keys the ring lacks named at most (the values under any further one count as
``unnamed``)."""
_LOOKED_AT = 64  # values whose key id is read per statement, looking for missing keys


def _frozen(mapping: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class KeyUsage:
    """What a store's payload values are sealed under.

    Attributes:
        plaintext: Values not sealed (written before encryption was turned on).
        by_key: Values sealed under each key of the ring, every key id of it (0s
            included), the current first; empty without a ring.
        unknown: Values sealed under each key the ring does not hold (every sealed
            value's key, without a ring): reading one raises ``DecryptionError``.
        unnamed: Sealed values whose envelope names no key (damaged), or a key beyond
            the :data:`MAX_NAMED` named in ``unknown``.
        tried: Values of each key of the ring that were opened (up to :data:`TRIED`
            per column).
        unopened: Of those, the ones that did not open (a key of the right id and the
            wrong bytes opens none; a few, tampered or moved values).
    """

    plaintext: int
    by_key: Mapping[str, int] = field(default_factory=dict)
    unknown: Mapping[str, int] = field(default_factory=dict)
    unnamed: int = 0
    tried: Mapping[str, int] = field(default_factory=dict)
    unopened: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("by_key", "unknown", "tried", "unopened"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    @property
    def sealed(self) -> int:
        """Values sealed under any key, or looking sealed."""
        return sum(self.by_key.values()) + sum(self.unknown.values()) + self.unnamed

    @property
    def unreadable(self) -> int:
        """Values no key of the ring can open, as far as counting tells: under keys it
        lacks, and damaged (each value that did not open when tried is in
        ``unopened``)."""
        return sum(self.unknown.values()) + self.unnamed


@dataclass
class _Column:
    """One payload column of a table, and what the counts found in it."""

    table: Any
    value: Any  # the text column, or a LangGraph value's bytes
    column: str  # its name in the associated data (crypto's constants)
    typed: bool
    sealed: Any = None  # the clause: looks sealed
    elsewhere: int = 0  # sealed under no key of the ring
    under_ring: dict[str, int] = field(default_factory=dict)  # values under each ring key

    def __post_init__(self) -> None:
        if self.typed:
            self.sealed = self.table.c.type.startswith("!", autoescape=True)
        else:
            self.sealed = func.substr(self.value, 1, 1) == "!"

    def under(self, key_id: str) -> Any:
        """The clause: sealed under this key (compared exactly, as rotation does)."""
        if self.typed:
            marker = bytes_head(key_id)
            return and_(
                self.sealed,
                func.substr(self.value, 1, len(marker))
                == bindparam(None, marker, type_=self.value.type),
            )
        head = text_head(key_id)
        return func.substr(self.value, 1, len(head)) == bindparam(None, head, type_=String())

    def plain(self) -> Any:
        """The clause: a value there, in clear."""
        return not_(self.sealed) if self.typed else and_(self.value.is_not(None), not_(self.sealed))


async def akey_usage(repository: Any) -> KeyUsage:
    """Count the store's payload values by what they are sealed under, and open a few
    of each key of the repository's ring (its ``keys``; without one, every sealed value
    counts as under a key it lacks).

    Args:
        repository: A :class:`~tenxstore.CheckpointRepository`, or a checkpointer
            wrapping one (``.inner``).
    """
    store = _store_of(repository)
    keys: KeyRing | None = store.keys
    ring = keys.key_ids if keys is not None else ()
    await store.ensure_ready()
    columns = [
        _Column(table, table.c[name], column, typed)
        for table, name, column, typed in _payload_columns(store)
    ]
    plaintext, by_key = 0, dict.fromkeys(ring, 0)
    for table, group in _by_table(columns):
        counts = await _counts(
            store, table, [(c.plain(), c.sealed, *map(c.under, ring)) for c in group]
        )
        for c, (plain, sealed, *under) in zip(group, counts, strict=True):
            plaintext += plain
            for key_id, n in zip(ring, under, strict=True):
                by_key[key_id] += n
            c.under_ring = dict(zip(ring, under, strict=True))
            c.elsewhere = sealed - sum(under)
    unknown = await _name_missing(store, [c for c in columns if c.elsewhere], ring)
    unnamed = sum(c.elsewhere for c in columns) - sum(unknown.values())
    tried, unopened = await _try(store, keys, columns) if keys is not None else ({}, {})
    return KeyUsage(plaintext, by_key, unknown, unnamed, tried, unopened)


def _payload_columns(store: Any) -> list[tuple[Any, str, str, bool]]:
    found = []
    for name in TABLES:
        table = getattr(store.tables, name)
        _, texts, typed = _TABLES[name]
        found += [(table, column, aad, False) for column, aad in texts]
        if typed is not None:
            found.append((table, typed[0], typed[1], True))
    return found


def _by_table(columns: list[_Column]) -> list[tuple[Any, list[_Column]]]:
    grouped: dict[str, tuple[Any, list[_Column]]] = {}
    for c in columns:
        grouped.setdefault(c.table.name, (c.table, []))[1].append(c)
    return list(grouped.values())


async def _counts(store: Any, table: Any, clauses: list[tuple[Any, ...]]) -> list[list[int]]:
    """For each column's clauses, how many rows of ``table`` match each: one statement."""
    flat = [func.coalesce(func.sum(case((c, 1), else_=0)), 0) for group in clauses for c in group]
    row = [int(n) for n in (await store.read(select(*flat).select_from(table)))[0]]
    counts, at = [], 0
    for group in clauses:
        counts.append(row[at : at + len(group)])
        at += len(group)
    return counts


async def _name_missing(
    store: Any, columns: list[_Column], ring: tuple[str, ...]
) -> dict[str, int]:
    """The keys the ring lacks that values are sealed under, and how many each: their
    ids read off up to 64 values at a time, each key found then left out of the next
    look, until a look finds no new one (or :data:`MAX_NAMED` are named; a key whose
    values all lie beyond 64 damaged envelopes of one column is counted ``unnamed``)."""
    named: dict[str, int] = {}
    for c in columns:
        while len(named) < MAX_NAMED:
            excluded = [*ring, *named]
            looked = (
                select(func.substr(c.value, 1, 80))
                .select_from(c.table)
                .where(c.sealed, *(not_(c.under(k)) for k in excluded))
                .limit(_LOOKED_AT)
            )
            ids = {_key_id(row[0], c.typed) for row in await store.read(looked)}
            new = sorted(i for i in ids if i is not None)
            if not new:
                break  # none left, or only envelopes that name no key
            named.update(dict.fromkeys(new[: MAX_NAMED - len(named)], 0))
    for c in columns:  # each named key counted in every column that has any
        missing = list(named)
        if missing:
            counts = await _counts(store, c.table, [tuple(map(c.under, missing))])
            for key_id, n in zip(missing, counts[0], strict=True):
                named[key_id] += n
    return {key_id: n for key_id, n in named.items() if n}


def _key_id(head: Any, typed: bool) -> str | None:
    return _bytes_key_id(bytes(head)) if typed else sealed_key_id(head)


async def _try(
    store: Any, keys: KeyRing, columns: list[_Column]
) -> tuple[dict[str, int], dict[str, int]]:
    """Open up to :data:`TRIED` values of each key of the ring in each column: how many
    were tried, and how many did not open, by key."""
    tried = dict.fromkeys(keys.key_ids, 0)
    unopened = dict.fromkeys(keys.key_ids, 0)
    for c in columns:
        wanted = [c.table.c.thread_id, c.value] + ([c.table.c.type] if c.typed else [])
        for key_id in keys.key_ids:
            if not c.under_ring.get(key_id):
                continue  # none there: no scan for it
            rows = await store.read(select(*wanted).where(c.under(key_id)).limit(TRIED))
            for row in rows:
                tried[key_id] += 1
                try:
                    if c.typed:
                        keys.open_typed(row[2], bytes(row[1]), row[0], c.column)
                    else:
                        keys.open(row[1], row[0], c.column)
                except DecryptionError:
                    unopened[key_id] += 1
    return tried, unopened
