"""The writes of a :class:`~tenxstore.MemoryStore`: what a put, an update and a delete
do inside their one transaction, and what is made ready before it.

A write's values (:func:`written`) and its vector (:func:`vector`, embedded before any
transaction) come first; then, under the memory's row lock, :func:`put`,
:func:`update` or :func:`delete` write its next version (or remove it) with the
vector beside it (:func:`write_vector`). The caller has checked every argument.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import select

from ..errors import Deadlock, MemoryNotFound, StaleStateError
from ..types import Memory
from . import fast, search
from .rows import Written
from .validation import check_content, check_metadata, check_ttl, split

if TYPE_CHECKING:
    from .store import MemoryStore

T = TypeVar("T")

__all__ = [
    "DEADLOCK_TRIES",
    "delete",
    "has_vector",
    "live",
    "put",
    "retried",
    "update",
    "vector",
    "write_vector",
    "written",
]

DEADLOCK_TRIES = 3
"""Tries of a memory write the database rolls back as a deadlock's victim."""


async def retried(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run a memory write's transaction, again when the database rolled it back as a
    deadlock's victim (nothing of it was written; MariaDB's gap locks make them of an
    upsert beside a delete of one key): at most :data:`DEADLOCK_TRIES` times."""
    for n in range(DEADLOCK_TRIES):
        try:
            return await attempt()
        except Deadlock:
            if n == DEADLOCK_TRIES - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def live(row: Any, now: datetime) -> bool:
    """Whether a locked row is not expired at ``now`` (SQLite and MySQL return naive
    UTC times)."""
    expires = row.expires_at
    if expires is None:
        return True
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=timezone.utc)
    return bool(expires > now)


def written(
    store: MemoryStore, content: Any, metadata: Any, ttl: Any = None, *, keep_metadata: bool = False
) -> Written:
    """A write's values checked and encoded, its keyword terms and its times."""
    now = store.base.now()
    text = None if content is None else check_content(content)
    meta = None if metadata is None and keep_metadata else check_metadata(metadata)
    terms = None
    if text is not None and store.keyword_index:
        terms = store.base.backend.keywords.terms(search.indexed_words(content))
    return Written(text, meta, terms, now, check_ttl(ttl, now))


async def vector(store: MemoryStore, text: str | None, embed: bool | str) -> bytes | None:
    """The stored form of a write's vector (None: none to write), computed before
    its transaction: ``embed`` True embeds ``text``, a str embeds that instead."""
    vectors = store.vectors
    if vectors is None or text is None or embed is False:
        return None
    await vectors.check_model()
    return (await vectors.embed([text if embed is True else embed]))[0]


async def has_vector(store: MemoryStore, owner: Any, ns: str, name: str) -> bool:
    """Whether the memory has a vector now (read before an update's transaction,
    which embeds before it; a memory not found is the update's to report)."""
    rows = store.rows
    m, vt = rows.m, rows.vt
    clauses = rows.scope(owner, ns, store.base.now(), exact=True)
    found = await store.base.read(
        select(vt.c.memory_id)
        .select_from(m.join(vt, vt.c.memory_id == m.c.id))
        .where(*clauses, m.c.memory_key == name)
    )
    return bool(found)


async def write_vector(
    store: MemoryStore, conn: Any, memory_id: int, blob: bytes | None, *, content_written: bool
) -> None:
    """Store the write's vector; with none, a write of content drops the old one."""
    if blob is not None:
        assert store.vectors is not None
        await store.vectors.write(conn, memory_id, blob)
    elif content_written:  # the old vector is of other content: no vector now
        vt = store.rows.vt
        await conn.execute(vt.delete().where(vt.c.memory_id == memory_id))


async def put(
    store: MemoryStore, owner: Any, ns: str, name: str, new: Written, blob: bytes | None
) -> Memory:
    """``astore``: in one step where it can be (:mod:`.fast`), else its transaction
    under the memory's lock: a new memory, or the next version of the one there."""
    done = await fast.put(store, owner, ns, name, new, blob)
    if done is not None:
        return done
    rows = store.rows
    async with store.base.write_rows(rows.lock, rows.one(owner, ns, name)) as (conn, row):
        if row is not None and not live(row, new.now):
            await rows.remove(conn, [row.id])  # expired: that memory is gone
            row = None
        stored = None
        if row is None:
            row, made = await rows.create(conn, owner, ns, name, new)
            if made:
                stored = row
            # else another writer made it since our lock found nothing: its next version
        if stored is None:
            stored = await rows.replace(conn, row, new, keep_expiry=False)
        await write_vector(store, conn, stored.id, blob, content_written=True)
    return rows.memory(stored)


async def update(
    store: MemoryStore,
    owner: Any,
    ns: str,
    name: str,
    new: Written,
    blob: bytes | None,
    expected_version: int | None,
) -> Memory:
    """``aupdate``'s transaction: the memory's next version, its expiry kept.

    Raises:
        MemoryNotFound: No such memory alive.
        StaleStateError: The memory is not at ``expected_version``.
    """
    rows = store.rows
    async with store.base.write_rows(rows.lock, rows.one(owner, ns, name)) as (conn, row):
        if row is None or not live(row, new.now):
            raise MemoryNotFound(name, split(ns))
        if expected_version is not None and row.version != expected_version:
            raise _stale(name, ns, expected_version, row.version)
        stored = await rows.replace(conn, row, new, keep_expiry=True)
        await write_vector(store, conn, stored.id, blob, content_written=new.content is not None)
    return rows.memory(stored)


def _stale(name: str, ns: str, expected_version: int, version: int) -> StaleStateError:
    """The error of an update that found the memory at another version."""
    stale = StaleStateError(
        name,
        expected_version,
        version,
        message=f"memory {name!r} in namespace {split(ns)!r} is at version "
        f"{version}, not {expected_version}: another writer updated it "
        "first; read it again and retry",
    )
    vars(stale).update(key=name, namespace=split(ns))  # thread_id holds it too
    return stale


async def delete(store: MemoryStore, owner: Any, ns: str, name: str) -> bool:
    """``adelete``'s transaction: the memory and its history removed; whether it
    was there and alive."""
    rows = store.rows
    now = store.base.now()
    lock = rows.one(owner, ns, name)
    async with store.base.write_rows(rows.lock, lock, deletes_only=True) as (conn, row):
        if row is None:
            return False
        await rows.remove(conn, [row.id])
    return live(row, now)
