"""Memories as JSON Lines beside threads (``tenxstore export``/``import``/``copy``).

One line holds one memory (``"format": "tenxstore.memory/1"``): its owner, namespace,
key, when it was made, and its retained versions, newest first, opened (plaintext, as
a thread's export is; ``--sealed`` keeps the line sealed). An expired memory is not
exported. Importing writes a memory with every version it holds, sealed under the
importing store's key ring, with the keyword index the importing database keeps (a
memory is a new one there: a new ``uid``). A memory that is there already with the
same versions is unchanged; with others, ``on_conflict`` says: ``fail``, ``skip``, or
``replace`` (the one there is deleted first).
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import msgspec
import msgspec.structs
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ..crypto import MEMORY_CONTENT, MEMORY_METADATA
from ..errors import ConfigError, ImportConflict, SerializationError
from ..types import Memory, OnConflict
from . import search
from .validation import (
    check_content,
    check_key,
    check_metadata,
    check_namespace,
    check_user,
    split,
)

__all__ = [
    "MEMORY_FORMAT",
    "MemoryExport",
    "export_memories",
    "import_memories",
    "is_memory_line",
    "memory_from_json",
    "memory_to_json",
]

MEMORY_FORMAT = "tenxstore.memory/1"
_BATCH = 200


@dataclass(frozen=True)
class MemoryExport:
    """One memory with its retained versions, newest first (``versions[0]`` is the
    current one): what an export line holds."""

    versions: tuple[Memory, ...]

    @property
    def current(self) -> Memory:
        """The current version."""
        return self.versions[0]

    @property
    def identity(self) -> tuple[Any, tuple[str, ...], str]:
        """(owner, namespace, key)."""
        m = self.versions[0]
        return (m.user_id, m.namespace, m.key)


class _Version(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    content: str
    metadata: dict[str, Any]
    updated_at: datetime
    expires_at: datetime | None


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    format: str
    user_id: str | int
    namespace: list[str]
    key: str
    created_at: datetime
    versions: list[_Version]


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def memory_to_json(export: MemoryExport) -> dict[str, Any]:
    """The JSON object of one exported memory."""
    m = export.current
    return {
        "format": MEMORY_FORMAT,
        "user_id": m.user_id,
        "namespace": list(m.namespace),
        "key": m.key,
        "created_at": _time(m.created_at),
        "versions": [
            {
                "version": v.version,
                "content": v.content,
                "metadata": v.metadata,
                "updated_at": _time(v.updated_at),
                "expires_at": _time(v.expires_at),
            }
            for v in export.versions
        ],
    }


def is_memory_line(data: Any) -> bool:
    """Whether a decoded export line is a memory's (not a thread's)."""
    return isinstance(data, dict) and data.get("format") == MEMORY_FORMAT


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def memory_from_json(data: Any) -> MemoryExport:
    """An exported memory from its JSON object, every field typed.

    Raises:
        ConfigError: Not a memory record; the message names the field.
    """
    try:
        line = msgspec.convert(data, _Line)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"not a {MEMORY_FORMAT} record: {exc}") from None
    if line.format != MEMORY_FORMAT:
        raise ConfigError(f"not a {MEMORY_FORMAT} record: format {line.format!r}")
    if not line.versions:
        raise ConfigError("a memory record holds at least one version")
    numbers = [v.version for v in line.versions]
    if numbers != sorted(set(numbers), reverse=True) or numbers[-1] < 1:
        raise ConfigError("a memory's versions are distinct, at least 1, newest first")
    return MemoryExport(
        tuple(
            Memory(
                key=line.key,
                namespace=tuple(line.namespace),
                user_id=line.user_id,
                content=v.content,
                metadata=v.metadata,
                version=v.version,
                created_at=_utc(line.created_at),
                updated_at=_utc(v.updated_at),
                expires_at=None if v.expires_at is None else _utc(v.expires_at),
            )
            for v in line.versions
        )
    )


async def export_memories(memory_store: Any, user_id: Any = None) -> AsyncIterator[MemoryExport]:
    """Every memory not expired (of ``user_id`` only, when given) with its retained
    versions, in id order, read a batch at a time (each batch in one snapshot)."""
    store, rows = memory_store.base, memory_store.rows
    m, v = rows.m, rows.v
    if user_id is not None:
        user_id = check_user(user_id, store.settings.user_id_type)
    after = 0
    while True:
        async with store.snapshot() as conn:
            stmt = select(*m.c).where(*rows.scope(user_id, None, store.now()), m.c.id > after)
            heads = (await conn.execute(stmt.order_by(m.c.id).limit(_BATCH))).all()
            pasts: dict[int, list[Any]] = collections.defaultdict(list)
            if heads:
                found = await conn.execute(
                    select(*v.c)
                    .where(v.c.memory_id.in_([h.id for h in heads]))
                    .order_by(v.c.memory_id, v.c.version.desc())
                )
                for row in found:
                    pasts[row.memory_id].append(row)
        for head in heads:
            older = [rows.memory(r, created_at=head.created_at, key=head) for r in pasts[head.id]]
            yield MemoryExport((rows.memory(head), *older))
        if len(heads) < _BATCH:
            return
        after = heads[-1].id


def _checked(memory_store: Any, export: MemoryExport, label: str | None) -> dict[str, Any]:
    """The rows of one export, every field checked (errors prefixed with ``label``)."""
    store = memory_store.base
    try:
        if not isinstance(export, MemoryExport) or not export.versions:
            raise ConfigError("expected a MemoryExport with at least one version")
        m = export.current
        identity = (
            check_user(m.user_id, store.settings.user_id_type),
            check_namespace(m.namespace),
            check_key(m.key),
        )
        versions = []
        for v in export.versions:
            if (v.user_id, tuple(v.namespace), v.key) != export.identity:
                raise ConfigError("every version of a memory names its owner, namespace and key")
            versions.append((v, check_content(v.content), check_metadata(v.metadata)))
    except (ConfigError, SerializationError) as exc:
        if label is None:
            raise
        raise type(exc)(f"{label}: {exc}") from None
    return {"identity": identity, "versions": versions}


def _same(found: Sequence[Memory], export: MemoryExport) -> bool:
    def key(m: Memory) -> tuple[Any, ...]:
        return (m.version, m.content, m.metadata, m.updated_at, m.expires_at)

    return [key(m) for m in found] == [key(m) for m in export.versions]


async def _write_one(
    memory_store: Any, conn: AsyncConnection, checked: dict[str, Any], on_conflict: OnConflict
) -> str:
    """One memory, under its row's lock: ``created``, ``unchanged``, ``skipped`` or
    ``replaced``."""
    rows = memory_store.rows
    user_id, namespace, key = checked["identity"]
    versions = checked["versions"]
    found = (await conn.execute(rows.lock, rows.one(user_id, namespace, key))).first()
    outcome = "created"
    if found is not None:
        outcome = await _over(memory_store, conn, found, checked, on_conflict)
        if outcome in ("unchanged", "skipped"):
            return outcome
    uid = uuid.uuid4().hex
    made = await _insert_head(memory_store, conn, checked, uid)
    await rows.bump(conn, [(user_id, namespace)])  # no vector: `reembed` makes it
    past = [
        {
            "memory_id": made.id,
            "version": v.version,
            "uid": uid,
            "content": rows.seal(t, uid, MEMORY_CONTENT),
            "metadata": rows.seal(md, uid, MEMORY_METADATA),
            "updated_at": v.updated_at,
            "expires_at": v.expires_at,
        }
        for v, t, md in versions[1:]
    ]
    if past:
        await conn.execute(insert(rows.v), past)
    return outcome


async def _over(
    memory_store: Any,
    conn: AsyncConnection,
    found: Any,
    checked: dict[str, Any],
    on_conflict: OnConflict,
) -> str:
    """What an import does where a memory's row is there (``found``): ``unchanged`` or
    ``skipped`` (nothing written), or ``replaced``/``created`` (the row removed).

    Raises:
        ImportConflict: The memory is there with other versions (``"fail"``).
    """
    store, rows = memory_store.base, memory_store.rows
    user_id, namespace, key = checked["identity"]
    versions = checked["versions"]
    now = store.now()
    there = await rows.history(conn, user_id, namespace, key, now)
    if there and _same(there, MemoryExport(tuple(v for v, _, _ in versions))):
        return "unchanged"
    if there and on_conflict == "skip":
        return "skipped"
    if there and on_conflict == "fail":
        raise ImportConflict(
            f"memory {key!r} of user {user_id!r} in namespace {split(namespace)!r} exists "
            "with other content; import with on_conflict='replace' or 'skip'"
        )
    await rows.remove(conn, [found.id])
    return "replaced" if there else "created"


async def _insert_head(
    memory_store: Any, conn: AsyncConnection, checked: dict[str, Any], uid: str
) -> Any:
    """The memory's row, holding its current version; the row as locked.

    Raises:
        ImportConflict: Another writer stored the memory meanwhile.
    """
    store, rows = memory_store.base, memory_store.rows
    user_id, namespace, key = checked["identity"]
    head, text, meta = checked["versions"][0]
    terms = None
    if memory_store.keyword_index:
        terms = store.backend.keywords.terms(search.indexed_words(head.content))
    await conn.execute(
        rows.insert_new,
        {
            "uid": uid,
            "user_id": user_id,
            "namespace": namespace,
            "memory_key": key,
            "content": rows.seal(text, uid, MEMORY_CONTENT),
            "metadata": rows.seal(meta, uid, MEMORY_METADATA),
            "terms": terms,
            "version": head.version,
            "created_at": head.created_at,
            "updated_at": head.updated_at,
            "expires_at": head.expires_at,
        },
    )
    made = (await conn.execute(rows.lock, rows.one(user_id, namespace, key))).one()
    if made.uid != uid:
        raise ImportConflict(f"memory {key!r} was stored by another writer while it was imported")
    return made


async def import_memories(
    memory_store: Any,
    source: Iterable[tuple[str | None, MemoryExport]],
    *,
    on_conflict: OnConflict = "fail",
) -> collections.Counter[str]:
    """Import memories in ONE transaction (every one checked first; any error writes
    nothing); the outcomes counted.

    Raises:
        ImportConflict: A memory is there with other versions (``"fail"``).
        ConfigError: A bad field, a memory given twice, or ``on_conflict``.
        SerializationError: A value that cannot be stored.
    """
    if on_conflict not in ("fail", "skip", "replace"):
        raise ConfigError(f"on_conflict must be fail, skip or replace, not {on_conflict!r}")
    checked, seen = [], set()
    for label, export in source:
        one = _checked(memory_store, export, label)
        if one["identity"] in seen:
            raise ConfigError(f"{label or 'an import'}: names memory {export.identity!r} twice")
        seen.add(one["identity"])
        checked.append(one)
    counted: collections.Counter[str] = collections.Counter()
    if not checked:
        return counted
    store, rows = memory_store.base, memory_store.rows
    ordered = sorted(checked, key=lambda c: tuple(map(str, c["identity"])))
    first = ordered[0]["identity"]
    async with store.write_rows(rows.lock, rows.one(*first)) as (conn, _):
        for one in ordered:  # locked in one order: two imports cannot deadlock
            counted[await _write_one(memory_store, conn, one, on_conflict)] += 1
    return counted
