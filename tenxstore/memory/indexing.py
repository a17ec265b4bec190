"""A :class:`~tenxstore.MemoryStore` with a vector index (:class:`~.qdrant.QdrantIndex`):
what its writes send to the index after they commit, how a search is answered from
it, and how it is repaired from the database.

The database is the source of truth. A write commits there first (with its vector in
``memory_vectors``, as without an index); then, under the lock of each (user,
namespace)'s revision row, its memories' points are written as the database has them
then, and the marker moves to the write's revision — only when it was at the
revision the write moved from (read under that lock in the write's transaction,
:data:`~.rows.BUMPED`) and the database is still at the write's. Every copy and
repair runs under that lock, so none is overtaken by an older one, and a marker
claims every live memory's point of its scope. A search reads the revisions of its scope from the
database and the markers from Qdrant; a (user, namespace) whose marker is not its
revision (a write Qdrant missed, or one of a sweep, a refreshed TTL, a reembed, an
erasure, an import or a process without the index) is brought up to date first
(:func:`sync_scope`: only the points that differ). Qdrant's candidates are then read
from the database in the scope, alive, and compared by ``rev``: one that is not the
row's is repaired and the search asked again, so a result is never another user's,
expired, deleted or of old content. Qdrant failing makes the search the database's
own (exact, or pgvector's) and a write's copy a repair for later.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import and_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import ConfigError
from ..telemetry import traced
from .lifecycle import check_batch_size
from .matrix import epoch
from .qdrant import IndexUnavailable, Point, QdrantIndex, point_id, rev_of
from .rows import BUMPED
from .writes import retried

if TYPE_CHECKING:
    from .store import MemoryStore

__all__ = ["Reindexing", "candidates", "check_index", "reindex", "setup", "sync_scope", "written"]

T = TypeVar("T")
CHUNK = 500
"""Rows a read of the database takes by id or key."""


def check_index(index: Any, embedding: Any) -> QdrantIndex | None:
    """The store's ``vector_index``, bound to its embedding's model.

    Raises:
        ConfigError: Not a QdrantIndex, or given without an embedding.
    """
    if index is None:
        return None
    if not isinstance(index, QdrantIndex):
        raise ConfigError(f"vector_index must be a QdrantIndex, not {type(index).__name__}")
    if embedding is None:
        raise ConfigError("vector_index needs an embedding: MemoryStore(..., embedding=...)")
    index.bind(embedding.model_id, embedding.dims)
    return index


def _index(store: MemoryStore) -> QdrantIndex:
    index = store.vector_index
    assert index is not None
    return index


async def setup(store: MemoryStore) -> None:
    """``asetup``'s part: the collections made or checked (Qdrant down: said, and
    searches use the database's index until it is back).

    Raises:
        ConfigError: The collection is of another model, dims or database.
    """
    index = _index(store)
    try:
        await index.ensure(await store.base.ensure_ready())
    except IndexUnavailable as exc:
        index.failed(exc, "setup")


async def _ready(store: MemoryStore, index: QdrantIndex) -> None:
    if not index.ready:
        await index.ensure(await store.base.ensure_ready())


# -- writes ------------------------------------------------------------------------------


async def written(
    store: MemoryStore,
    owner: Any,
    keys: Sequence[tuple[str, str]],
    attempt: Callable[[], Awaitable[T]],
) -> T:
    """A write's transaction (``attempt``, retried as a deadlock's victim), and then,
    with an index, its memories (``keys``: (namespace, key) of ``owner``) copied to it."""
    index = store.vector_index
    if index is None:
        return await retried(attempt)
    noted: dict[tuple[str, str], tuple[int | None, int]] = {}

    async def once() -> T:
        noted.clear()  # a try rolled back bumped nothing
        token = BUMPED.set(noted)
        try:
            return await attempt()
        finally:
            BUMPED.reset(token)

    result = await retried(once)
    if index.available:
        try:
            await _ready(store, index)
            await _push(store, index, owner, keys, noted)
        except Exception as exc:  # committed all the same: repaired on read
            index.failed(exc, "a write")  # (a collection of another model made meanwhile too)
    return result


async def _push(
    store: MemoryStore,
    index: QdrantIndex,
    owner: Any,
    keys: Sequence[tuple[str, str]],
    noted: dict[tuple[str, str], tuple[int | None, int]],
) -> None:
    """Each namespace's memories' points as the database has them now, under its
    revision's lock (:func:`_scope_locked`), and its marker moved to the write's
    revision only when it was at the one the write moved from and the database is
    still at the write's (no other write of the scope since, whose copy may be
    pending): a marker then claims every point of the scope."""
    m = store.rows.m
    by_ns: dict[str, set[str]] = {}
    for ns, key in keys:
        by_ns.setdefault(ns, set()).add(key)
    for ns, wanted in sorted(by_ns.items()):
        user = str(owner)
        async with _scope_locked(store, owner, ns) as (conn, revision):
            found: list[Any] = []
            listed = sorted(wanted)
            for start in range(0, len(listed), CHUNK):
                chunk = listed[start : start + CHUNK]
                found += await _rows(
                    store,
                    index,
                    m.c.user_id == owner,
                    m.c.namespace == ns,
                    m.c.memory_key.in_(chunk),
                    conn=conn,
                )
            now = store.base.now().timestamp()
            live = [r for r in found if r.vector is not None and epoch(r.expires_at) > now]
            points = [_point(index, r) for r in live]
            kept = {point_id(p.user, p.namespace, p.key) for p in points}
            await index.upsert(points)
            await index.delete([i for k in listed if (i := point_id(owner, ns, k)) not in kept])
            moved = noted.get((user, ns))
            current = moved is not None and revision == moved[1]  # no write of it since
            if moved is not None and current and await index.marker(user, ns) == moved[0]:
                await index.set_marker(user, ns, moved[1])


@asynccontextmanager
async def _scope_locked(
    store: MemoryStore, user: Any, ns: str
) -> AsyncIterator[tuple[AsyncConnection, int | None]]:
    """A transaction holding (user, namespace)'s revision row under its write lock
    (SQLite: the database's), with that revision (None: the scope has none). Every
    copy to the index and every marker moved happens inside one: a write of the scope
    cannot commit meanwhile, so a copy is never overtaken by an older one, and what
    it read is what the marker it sets claims."""
    r = store.rows.r
    lock = select(r.c.revision).where(r.c.user_id == user, r.c.namespace == ns).with_for_update()
    async with store.base.write_rows(lock, {}, deletes_only=True) as (conn, found):
        yield conn, None if found is None else int(found[0])


async def _rows(
    store: MemoryStore,
    index: QdrantIndex,
    *where: Any,
    first: int | None = None,
    conn: AsyncConnection | None = None,
) -> list[Any]:
    """The memories ``where`` picks, with their vector of the index's model (or None);
    ``first``: that many, in id order; read in ``conn`` (None: a read of its own)."""
    m, vt = store.rows.m, store.rows.vt
    model = and_(vt.c.memory_id == m.c.id, vt.c.model_id == index.model_id, vt.c.dims == index.dims)
    stmt = select(
        m.c.id,
        m.c.user_id,
        m.c.namespace,
        m.c.memory_key,
        m.c.uid,
        m.c.version,
        m.c.expires_at,
        vt.c.vector,
        vt.c.written,
    ).select_from(m.outerjoin(vt, model))
    stmt = stmt.where(*where)
    if first is not None:
        stmt = stmt.order_by(m.c.id).limit(first)
    if conn is not None:
        return list((await conn.execute(stmt)).all())
    return list(await store.base.read(stmt))


def _point(index: QdrantIndex, row: Any) -> Point:
    from .matrix import numpy

    assert index.model_id is not None
    expires = epoch(row.expires_at)
    return Point(
        user=str(row.user_id),
        namespace=row.namespace,
        key=row.memory_key,
        memory_id=int(row.id),
        rev=rev_of(row.uid, row.version, index.model_id, row.written),
        expires_at=None if expires == float("inf") else expires,
        vector=numpy().frombuffer(row.vector, dtype="<f4").tolist(),
    )


# -- repair --------------------------------------------------------------------------------


async def _revisions(
    store: MemoryStore, users: Any, ns: str | None
) -> dict[tuple[str, str], tuple[Any, int]]:
    """The database's revisions of the scope: (user, namespace) to (the user as
    stored, revision)."""
    r = store.rows.r
    clauses = store.rows.revision_scope(users, ns)
    found: list[Any] = await store.base.read(
        select(r.c.user_id, r.c.namespace, r.c.revision).where(*clauses)
    )
    return {(str(x.user_id), x.namespace): (x.user_id, int(x.revision)) for x in found}


async def _in_sync(store: MemoryStore, index: QdrantIndex, users: Any, ns: str) -> None:
    """Every (user, namespace) of the scope whose marker is not its revision, repaired."""
    revisions = await _revisions(store, users, ns)
    markers = await index.markers(users, ns)
    for scope, (user, rev) in sorted(revisions.items(), key=lambda kv: kv[0]):
        if markers.get(scope) != rev:
            await sync_scope(store, index, user, scope[1])
    for user, namespace in sorted(set(markers) - set(revisions)):  # scopes emptied
        await sync_scope(store, index, _typed(store, user), namespace)


async def sync_scope(store: MemoryStore, index: QdrantIndex, user: Any, ns: str) -> int:
    """Bring one (user, namespace)'s points to the database, under its revision's lock
    (:func:`_scope_locked`): Qdrant's points listed first, then the live memories' ids
    and stamps (no vector) read; the points that differ written (their vectors read
    with their stamps), those the database no longer has deleted (only those listed:
    a point written since belongs to a write the database has), and the marker set to
    the revision. How many points were written."""
    return await _synced(store, index, user, ns, CHUNK)


async def _synced(store: MemoryStore, index: QdrantIndex, user: Any, ns: str, chunk: int) -> int:
    """:func:`sync_scope`, reading ``chunk`` vectors at a time."""
    m, vt = store.rows.m, store.rows.vt
    now = store.base.now()
    model = and_(vt.c.memory_id == m.c.id, vt.c.model_id == index.model_id, vt.c.dims == index.dims)
    assert index.model_id is not None
    written = 0
    async with _scope_locked(store, user, ns) as (conn, revision):
        have = await index.points(user, ns)
        stamps = (
            await conn.execute(
                select(m.c.id, m.c.memory_key, m.c.uid, m.c.version, m.c.expires_at, vt.c.written)
                .select_from(m.join(vt, model))
                .where(*store.rows.scope(user, ns, now, exact=True))
            )
        ).all()
        want = {
            point_id(user, ns, s.memory_key): (
                s.id,
                rev_of(s.uid, s.version, index.model_id, s.written),
                s.expires_at,
            )
            for s in stamps
        }
        redo = []
        for ident, (memory_id, rev, expires) in want.items():
            held = have.get(ident)
            at = epoch(expires)
            if held is None or held != (rev, None if at == float("inf") else at):
                redo.append(memory_id)
        for start in range(0, len(redo), chunk):
            rows = await _rows(
                store,
                index,
                m.c.id.in_(redo[start : start + chunk]),
                *store.rows.scope(user, ns, now, exact=True),
                conn=conn,
            )
            points = [_point(index, row) for row in rows if row.vector is not None]
            await index.upsert(points)
            written += len(points)
        await index.delete([i for i in have if i not in want])
        await index.set_marker(str(user), ns, revision)
    return written


class Reindexing:
    """:meth:`areindex` and its sync twin :meth:`reindex`, methods of
    :class:`~tenxstore.MemoryStore` (kept here: the store's module is long enough)."""

    @traced(write=True, prefix="memory.")
    async def areindex(self, *, batch_size: int = 500, recreate: bool = False) -> int:
        """Rebuild the vector index from the database: every live memory's point
        brought to its stored vector of the store's model (those missing or
        different written), ``batch_size`` a round, each (user,
        namespace) under its revision's lock (a write of it waits meanwhile), the
        points of memories the database no longer has deleted (an erased user's among
        them). Memories without a vector stay without one (``areembed(missing=True)``
        gives them one). Safe while the application runs.

        Args:
            batch_size: Vectors read at a time (1 to 5000).
            recreate: Make the collection anew when it holds another model's vectors
                or dims (the application searching it then falls back to the
                database's index until it is reindexed with its own model).

        Returns:
            How many points were written.

        Raises:
            ConfigError: No vector index, a bad ``batch_size``, or a collection of
                another model or dims without ``recreate``.
        """
        store: MemoryStore = self  # type: ignore[assignment]  # mixed into MemoryStore
        return await reindex(store, check_batch_size(batch_size), recreate)

    def reindex(self, *, batch_size: int = 500, recreate: bool = False) -> int:
        """Synchronous :meth:`areindex`."""
        from .sync import blocking

        return blocking(self.areindex(batch_size=batch_size, recreate=recreate), "areindex")


async def reindex(store: MemoryStore, batch_size: int, recreate: bool = False) -> int:
    """``areindex``: the collection made anew if it is of another model or dims, then
    every (user, namespace) of the database brought to it by :func:`sync_scope` (under
    its revision's lock: a write meanwhile waits, and is copied after), and the points
    listed before the database was read whose memory it no longer has deleted (an
    erased user's among them); how many points were written. ``batch_size`` bounds
    the vectors read at a time."""
    index = store.vector_index
    if index is None:
        raise ConfigError("reindex needs a vector index: MemoryStore(..., vector_index=...)")
    await index.ensure(await store.base.ensure_ready(), recreate=recreate)
    revisions = await _revisions(store, None, None)
    scopes = {scope: user for scope, (user, _) in revisions.items()}
    for user, ns in await index.scopes():  # points the database may no longer have
        scopes.setdefault((user, ns), _typed(store, user))
    done = 0
    for (_, ns), user in sorted(scopes.items(), key=lambda kv: kv[0]):
        done += await _synced(store, index, user, ns, batch_size)
    await index.drop_markers(revisions)  # a scope written meanwhile: repaired on read
    return done


# -- search ----------------------------------------------------------------------------------


async def candidates(
    store: MemoryStore,
    users: Any,
    ns: str,
    query: Any,
    ranked: Any,
    count: int,
    now: datetime,
) -> tuple[list[tuple[int, float]], list[Any], dict[int, Any]] | None:
    """What :func:`~.hybrid.search_by_meaning` fuses, from the index: the ``count``
    nearest memories (id, cosine), the keyword ranking ``ranked``'s rows, and the rows
    of both by id — or None when the database's own index must answer (Qdrant down,
    or its candidates still not the database's after a repair)."""
    index = _index(store)
    if not index.available:
        return None
    try:
        await _ready(store, index)
        await _in_sync(store, index, users, ns)
        for _ in range(2):
            found = await index.nearest(query.tolist(), users, ns, now.timestamp(), count)
            near, by_words, have, bad = await _verified(store, found, users, ns, ranked, now)
            if not bad:
                return near, by_words, have
            for user, namespace in sorted(bad):
                await sync_scope(store, index, user, namespace)
    except (IndexUnavailable, ConfigError) as exc:  # ConfigError: another model's now
        index.failed(exc, "a search")
    return None


async def _verified(
    store: MemoryStore,
    found: Iterable[tuple[int, str, float, str, str]],
    users: Any,
    ns: str,
    ranked: Any,
    now: datetime,
) -> tuple[list[tuple[int, float]], list[Any], dict[int, Any], set[tuple[Any, str]]]:
    """Qdrant's candidates read from the database in one snapshot with the keyword
    ranking: those whose row is in the scope, alive and of the point's ``rev``, the
    rows by id, and the (user, namespace) of each candidate that is not (to repair)."""
    m, vt = store.rows.m, store.rows.vt
    hits = list(found)
    ids = [hit[0] for hit in hits]
    have: dict[int, Any] = {}
    by_words: list[Any] = []
    async with store.base.snapshot() as conn:
        for start in range(0, len(ids), CHUNK):
            stmt = (
                select(*m.c, vt.c.model_id, vt.c.written)
                .select_from(m.join(vt, vt.c.memory_id == m.c.id))
                .where(m.c.id.in_(ids[start : start + CHUNK]), *store.rows.scope(users, ns, now))
            )
            have.update((r.id, r) for r in await conn.execute(stmt))
        if ranked is not None:
            by_words = list((await conn.execute(ranked)).all())
    near: list[tuple[int, float]] = []
    bad: set[tuple[Any, str]] = set()
    for memory_id, rev, cosine, user, namespace in hits:
        row = have.get(memory_id)
        if row is None or rev != rev_of(row.uid, row.version, row.model_id, row.written):
            bad.add((_typed(store, user), namespace))  # gone, expired, moved or rewritten
            continue
        near.append((memory_id, cosine))
    for row in by_words:
        have.setdefault(row.id, row)
    return near, by_words, have, bad


def _typed(store: MemoryStore, user: str) -> Any:
    """A user id of a payload (a str) as the database stores it."""
    return user if store.base.settings.user_id_type == "string" else int(user)
