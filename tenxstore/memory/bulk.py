"""Many memories stored in one transaction (:meth:`MemoryStore.astore_many`).

A load (a migration from another store, a batch of a LangGraph ``abatch``) is the same
writes as many ``astore`` calls, in the same order — a key given twice is stored
twice, the second its next version — but all or nothing, and in bulk: every value
checked and every vector embedded before the transaction; in it, a few hundred
memories a round trip. Each round locks the memories of its keys that exist (in key
order: two loads cannot deadlock), replaces an expired one, writes the next version of
a live one as ``astore`` does, and inserts the rest in one ``executemany`` with their
vectors in another; each (user, namespace) it touched gets one new revision.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from ..crypto import MEMORY_CONTENT, MEMORY_METADATA
from ..errors import ConfigError
from ..types import Memory
from . import writes
from .rows import Written
from .validation import DEFAULT_NAMESPACE, check_key, check_namespace

if TYPE_CHECKING:
    from .store import MemoryStore

__all__ = [
    "MAX_BATCH",
    "NewMemory",
    "as_new_memory",
    "check_batch",
    "prepared",
    "rounds",
    "store_many",
]

MAX_BATCH = 5000
"""The most memories a round of :func:`store_many` sends at once."""


@dataclass(frozen=True)
class NewMemory:
    """One memory of :meth:`~tenxstore.MemoryStore.astore_many`: the arguments of
    :meth:`~tenxstore.MemoryStore.astore` but the user (a plain ``str`` is its content,
    a mapping its fields)."""

    content: str
    metadata: dict[str, Any] | None = None
    namespace: tuple[str, ...] = DEFAULT_NAMESPACE
    key: str | None = None
    ttl: float | timedelta | None = None
    embed: bool | str = field(default=True)


@dataclass
class _Item:
    """A memory checked and encoded, with its vector, waiting for its round."""

    at: int
    ns: str
    key: str
    new: Written
    blob: bytes | None


def as_new_memory(item: Any, at: int) -> NewMemory:
    """``item`` (a ``NewMemory``, a ``str`` or a mapping of its fields) as a
    ``NewMemory``; ConfigError naming its position otherwise."""
    if isinstance(item, NewMemory):
        return item
    if isinstance(item, str):
        return NewMemory(item)
    if isinstance(item, Mapping):
        unknown = set(item) - set(NewMemory.__dataclass_fields__)
        if unknown or "content" not in item:
            what = f"unknown fields {sorted(map(str, unknown))}" if unknown else "no content"
            raise ConfigError(f"memory {at} has {what}")
        return NewMemory(**item)
    raise ConfigError(
        f"memory {at} must be a NewMemory, a str or a mapping, not {type(item).__name__}"
    )


async def prepared(store: MemoryStore, items: Iterable[Any], embed_batch: int) -> list[_Item]:
    """Every memory checked and encoded, and the vectors embedded ``embed_batch`` texts
    a call: all before any transaction (a bad one: its error, nothing written)."""
    if isinstance(items, (str, bytes, Mapping)):
        raise ConfigError("memories must be an iterable of memories, not one")
    out: list[_Item] = []
    texts: list[tuple[int, str]] = []
    for at, raw in enumerate(items):
        one = as_new_memory(raw, at)
        if not isinstance(one.embed, (bool, str)):
            raise ConfigError(f"embed must be True, False or a text, not {one.embed!r}")
        ns = check_namespace(one.namespace)
        name = uuid.uuid4().hex if one.key is None else check_key(one.key)
        out.append(
            _Item(at, ns, name, writes.written(store, one.content, one.metadata, one.ttl), None)
        )
        if store.vectors is not None and one.embed is not False:
            texts.append((at, one.content if one.embed is True else one.embed))
    vectors = store.vectors
    if vectors is not None and texts:
        await vectors.check_model()
        for start in range(0, len(texts), embed_batch):
            chunk = texts[start : start + embed_batch]
            for (at, _), blob in zip(
                chunk, await vectors.embed([t for _, t in chunk]), strict=True
            ):
                out[at].blob = blob
    return out


def rounds(items: Sequence[_Item], size: int) -> list[list[list[_Item]]]:
    """The memories' keys in (namespace, key) order, ``size`` keys a round, each key with
    its writes in the caller's order: every lock of a load is taken in one global order
    (two loads, or a load and an ``astore``, cannot deadlock on them)."""
    by_key: dict[tuple[str, str], list[_Item]] = {}
    for item in items:
        by_key.setdefault((item.ns, item.key), []).append(item)
    keys = sorted(by_key)
    return [[by_key[k] for k in keys[i : i + size]] for i in range(0, len(keys), size)]


async def store_many(
    store: MemoryStore, owner: Any, items: list[_Item], batch_size: int
) -> list[Memory]:
    """``astore_many``'s transaction: each memory written as ``astore`` writes one (a
    key's later writes its next versions); the memories as stored, in the caller's
    order. The scopes' revisions are bumped last, once: a load never holds a
    revision's lock while it waits for a row's."""
    rows = store.rows
    plan = rounds(items, batch_size)
    first = plan[0][0][0]
    stored: list[Any] = [None] * len(items)
    async with store.base.write_rows(rows.lock, rows.one(owner, first.ns, first.key)) as (
        conn,
        _,
    ):
        for group in plan:
            heads = await _round(store, conn, owner, [writes_[0] for writes_ in group])
            for writes_, row in zip(group, heads, strict=True):
                stored[writes_[0].at] = row
                for item in writes_[1:]:
                    row = await rows.replace(conn, row, item.new, keep_expiry=False, bump=False)
                    await writes.write_vector(store, conn, row.id, item.blob, content_written=True)
                    stored[item.at] = row
        await rows.bump(conn, [(owner, ns) for ns in {item.ns for item in items}])
    return [rows.memory(row) for row in stored]


async def _round(
    store: MemoryStore, conn: AsyncConnection, owner: Any, batch: list[_Item]
) -> list[Any]:
    """One round: the first write of each of its keys (in key order), the rows as
    written in that order."""
    rows, m = store.rows, store.rows.m
    wanted = sorted({(i.ns, i.key) for i in batch})
    locked = await conn.execute(
        select(*m.c)
        .where(m.c.user_id == owner, tuple_(m.c.namespace, m.c.memory_key).in_(wanted))
        .order_by(m.c.namespace, m.c.memory_key)
        .with_for_update()
    )
    found = {(r.namespace, r.memory_key): r for r in locked}
    now = batch[0].new.now
    expired = [r.id for r in found.values() if not writes.live(r, now)]
    if expired:
        await rows.remove(conn, expired, bump=False)  # expired: gone (bumped last)
        found = {k: r for k, r in found.items() if writes.live(r, now)}
    fresh = [i for i in batch if (i.ns, i.key) not in found]
    made = await _insert(store, conn, owner, fresh)
    # The rest, in key order: there already, or made by another writer since the
    # lock (locked now)
    for item in batch:
        if (item.ns, item.key) in made:
            continue
        held = found.get((item.ns, item.key))
        if held is None:  # made by another writer since the lock (or gone again)
            held, here = await rows.create(conn, owner, item.ns, item.key, item.new, bump=False)
            if here:
                made[(item.ns, item.key)] = held
                await writes.write_vector(store, conn, held.id, item.blob, content_written=True)
                continue
        row = await rows.replace(conn, held, item.new, keep_expiry=False, bump=False)
        await writes.write_vector(store, conn, row.id, item.blob, content_written=True)
        made[(item.ns, item.key)] = row
    return [made[(i.ns, i.key)] for i in batch]


async def _insert(
    store: MemoryStore, conn: AsyncConnection, owner: Any, fresh: list[_Item]
) -> dict[tuple[str, str], Any]:
    """Version 1 of each new memory in one ``executemany`` (a key another writer made
    since the lock is left out), their vectors in another; the rows made, by key."""
    if not fresh:
        return {}
    rows, m = store.rows, store.rows.m
    uids = {}
    params = []
    for item in fresh:  # in key order, as the locks
        w = item.new
        assert w.content is not None and w.metadata is not None
        uid = uids[(item.ns, item.key)] = uuid.uuid4().hex
        params.append(
            {
                "uid": uid,
                "user_id": owner,
                "namespace": item.ns,
                "memory_key": item.key,
                "content": rows.seal(w.content, uid, MEMORY_CONTENT),
                "metadata": rows.seal(w.metadata, uid, MEMORY_METADATA),
                "terms": w.terms,
                "version": 1,
                "created_at": w.now,
                "updated_at": w.now,
                "expires_at": w.expires_at,
            }
        )
    await conn.execute(rows.insert_new, params)
    made = {
        (r.namespace, r.memory_key): r
        for r in await conn.execute(select(*m.c).where(m.c.uid.in_(list(uids.values()))))
    }
    vectors = store.vectors
    pairs = [(made[(i.ns, i.key)].id, i.blob) for i in fresh if (i.ns, i.key) in made and i.blob]
    if vectors is not None and pairs:
        await vectors.write_new(conn, pairs)
    return made


def check_batch(batch_size: Any) -> int:
    """``batch_size`` of ``astore_many``: 1 to :data:`MAX_BATCH`."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ConfigError(f"batch_size must be an int, not {batch_size!r}")
    if not 1 <= batch_size <= MAX_BATCH:
        raise ConfigError(f"batch_size must be 1 to {MAX_BATCH}, not {batch_size}")
    return batch_size
