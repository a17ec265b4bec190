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

The store also records that it holds sealed values (migration 0009, the store's row):
:func:`amark_sealed` says so (an instance with a key ring marks it at its first
write), and an instance without a key ring then refuses to write;
:func:`aclear_sealed` takes it back once no value is sealed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from sqlalchemy import String, and_, bindparam, case, func, not_, or_, select

from .crypto import (
    OLD_BYTES_HEAD,
    OLD_HEAD,
    KeyRing,
    bytes_heads,
    bytes_key_id,
    life_of,
    sealed_key_id,
    text_heads,
)
from .errors import ConfigError, DecryptionError
from .rotation import SEALED_COLUMNS, TABLES, binding, store_of

__all__ = ["KeyUsage", "aclear_sealed", "akey_usage", "amark_sealed"]

TRIED = 3
"""Values of each key of the ring opened per column (any of them: no order is asked
for)."""
MAX_NAMED = 32
"""Keys the ring lacks named at most (the values under any further one count as
``unnamed``)."""
_LOOKED_AT = 64  # values whose key id is read per statement, looking for missing keys
# When a table's rows were made, set once: a value in clear in a row made after the
# mark was written in clear after it. (Not tool_executions.started_at: a claim taken
# again moves it and keeps the arguments.)
_CREATED = {
    "threads": "created_at",
    "states": "created_at",
    "messages": "created_at",
    "lg_checkpoints": "created_at",
    "memories": "updated_at",  # each version's write (created_at is its first one's)
    "memory_versions": "updated_at",
}


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
        plaintext_by_table: ``plaintext`` by table (only the tables that have any).
        sealed_since: When the store was marked as holding sealed values (None: not
            marked).
        plaintext_since_sealed: Of ``plaintext``, the values in rows created after
            ``sealed_since``, by table (the tables whose rows record when they were
            made: threads, states, messages, LangGraph checkpoints).
            Every instance with a key ring seals what it writes, so these were written
            by one without (a process that first used the store before it was marked).
        previous_format: Of the sealed values (each counted in ``by_key`` or
            ``unknown`` too), those in the ``tx1`` envelope, whose associated data
            names no life of the thread (sealed before ``tx2``): they open in any life
            of their thread; ``rotate-keys`` seals them again as ``tx2``.
    """

    plaintext: int
    by_key: Mapping[str, int] = field(default_factory=dict)
    unknown: Mapping[str, int] = field(default_factory=dict)
    unnamed: int = 0
    tried: Mapping[str, int] = field(default_factory=dict)
    unopened: Mapping[str, int] = field(default_factory=dict)
    plaintext_by_table: Mapping[str, int] = field(default_factory=dict)
    sealed_since: datetime | None = None
    plaintext_since_sealed: Mapping[str, int] = field(default_factory=dict)
    previous_format: int = 0

    def __post_init__(self) -> None:
        for name in (
            "by_key",
            "unknown",
            "tried",
            "unopened",
            "plaintext_by_table",
            "plaintext_since_sealed",
        ):
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
        """The clause: sealed under this key, in either envelope format (compared
        exactly, as rotation does; both heads are as long)."""
        if self.typed:
            markers = bytes_heads(key_id)
            start = func.substr(self.value, 1, len(markers[0]))
            return and_(
                self.sealed,
                or_(*(start == bindparam(None, m, type_=self.value.type) for m in markers)),
            )
        heads = text_heads(key_id)
        start = func.substr(self.value, 1, len(heads[0]))
        return or_(*(start == bindparam(None, h, type_=String()) for h in heads))

    def previous(self) -> Any:
        """The clause: sealed in the previous envelope format (``tx1``), under any key."""
        if self.typed:
            start = func.substr(self.value, 1, len(OLD_BYTES_HEAD))
            return and_(
                self.sealed, start == bindparam(None, OLD_BYTES_HEAD, type_=self.value.type)
            )
        start = func.substr(self.value, 1, len(OLD_HEAD))
        return start == bindparam(None, OLD_HEAD, type_=String())

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
    store = store_of(repository)
    keys: KeyRing | None = store.keys
    ring = keys.key_ids if keys is not None else ()
    await store.ensure_ready()
    columns = [
        _Column(table, table.c[name], column, typed)
        for table, name, column, typed in _payload_columns(store)
    ]
    plaintext, by_key, previous = 0, dict.fromkeys(ring, 0), 0
    by_table: dict[str, int] = {}
    late: dict[str, int] = {}
    since = store.sealed_since
    for table, group in _by_table(columns):
        created = _CREATED.get(table.name)
        marked = since is not None and created is not None
        clauses = [(c.plain(), c.sealed, c.previous(), *map(c.under, ring)) for c in group]
        if marked:  # values in clear in rows made after the mark: a keyless writer's
            clauses = [(*cs, and_(cs[0], table.c[created] >= since)) for cs in clauses]
        counts = await _counts(store, table, clauses)
        for c, (plain, sealed, old, *rest) in zip(group, counts, strict=True):
            under = rest[: len(ring)]
            previous += old
            if marked and rest[-1]:
                late[table.name] = late.get(table.name, 0) + rest[-1]
            plaintext += plain
            if plain:
                by_table[table.name] = by_table.get(table.name, 0) + plain
            for key_id, n in zip(ring, under, strict=True):
                by_key[key_id] += n
            c.under_ring = dict(zip(ring, under, strict=True))
            c.elsewhere = sealed - sum(under)
    unknown = await _name_missing(store, [c for c in columns if c.elsewhere], ring)
    unnamed = sum(c.elsewhere for c in columns) - sum(unknown.values())
    tried, unopened = await _try(store, keys, columns) if keys is not None else ({}, {})
    return KeyUsage(
        plaintext, by_key, unknown, unnamed, tried, unopened, by_table, since, late, previous
    )


async def amark_sealed(repository: Any) -> datetime:
    """Record in the store that it holds sealed values, so that a checkpointer
    without a key ring refuses to write to it (``ConfigError`` naming
    ``TENXSTORE_KEYS``) and ``tenxstore doctor`` without keys fails. An instance with
    a key ring does this at its first write, and ``rotate-keys`` when it starts; say
    so yourself to stop keyless writers before any keyed one has written. Kept when
    set already. Processes without a key ring that were already running read the mark
    at their first use: restart them.

    Args:
        repository: A :class:`~tenxstore.CheckpointRepository`, or a checkpointer
            wrapping one (``.inner``); it needs no key ring.

    Returns:
        When the store was first marked.
    """
    return await store_of(repository).mark_sealed()  # type: ignore[no-any-return]


async def aclear_sealed(repository: Any) -> None:
    """Take back :func:`amark_sealed`, once no value of the store is sealed (a store
    copied from an encrypted one and emptied of its sealed values, or encryption
    turned off by exporting and importing every thread in clear).

    Args:
        repository: A :class:`~tenxstore.CheckpointRepository`, or a checkpointer
            wrapping one (``.inner``).

    Raises:
        ConfigError: Values are still sealed (counted as :func:`akey_usage` does);
            nothing was changed.
    """
    usage = await akey_usage(repository)
    if usage.sealed:
        raise ConfigError(
            f"{usage.sealed:,} value(s) of the store are sealed: it stays marked as holding "
            "sealed values (nothing was changed); a checkpointer without a key ring could "
            "not read them"
        )
    await store_of(repository).unmark_sealed()


def _payload_columns(store: Any) -> list[tuple[Any, str, str, bool]]:
    found = []
    for name in TABLES:
        table = getattr(store.tables, name)
        _, texts, typed = SEALED_COLUMNS[name]
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
    return bytes_key_id(bytes(head)) if typed else sealed_key_id(head)


async def _try(
    store: Any, keys: KeyRing, columns: list[_Column]
) -> tuple[dict[str, int], dict[str, int]]:
    """Open up to :data:`TRIED` values of each key of the ring in each column (each for
    the life of its thread, joined in): how many were tried, and how many did not open,
    by key."""
    tried = dict.fromkeys(keys.key_ids, 0)
    unopened = dict.fromkeys(keys.key_ids, 0)
    t = store.tables.threads
    for c in columns:
        memory = binding(c.table.name) != "thread_id"  # bound to a memory's uid: no life
        bound = c.table.c[binding(c.table.name)]
        wanted = [bound, c.value]
        wanted += [] if memory else [t.c.incarnation, t.c.user_id]
        wanted += [c.table.c.type] if c.typed else []
        for key_id in keys.key_ids:
            if not c.under_ring.get(key_id):
                continue  # none there: no scan for it
            stmt = select(*wanted).where(c.under(key_id)).limit(TRIED)
            if c.table is not t and not memory:
                stmt = stmt.join(t, t.c.thread_id == c.table.c.thread_id)
            for row in await store.read(stmt):
                tried[key_id] += 1
                life = None if memory else life_of(row)
                try:
                    if c.typed:
                        keys.open_typed(row.type, bytes(row[1]), row[0], c.column, life)
                    else:
                        keys.open(row[1], row[0], c.column, life)
                except DecryptionError:
                    unopened[key_id] += 1
    return tried, unopened
