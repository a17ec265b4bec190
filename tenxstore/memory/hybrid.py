"""Search by meaning over a :class:`~tenxstore.MemoryStore`'s vectors: the vector and
hybrid rankings of ``asearch``, and ``areembed``'s batches.

Hybrid ranking takes the best candidates of the vector ranking
(:mod:`tenxstore.memory.vectors`: exact in numpy, or pgvector's HNSW index) and of the
keyword ranking (:mod:`tenxstore.memory.search`), at least :data:`CANDIDATES` of each
(more with a metadata filter, which is applied to the memories as they are read, as
keyword search does), and fuses them over their union (:func:`_fused`): the vector
score plus a small weight of a strong keyword score; a memory only one ranking finds
is kept.
All of it is read in one snapshot; the query is embedded before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, select

from ..embeddings import Embedding
from ..types import Memory, MemoryHit
from . import indexing, search
from .vectors import Vectors

if TYPE_CHECKING:
    from collections.abc import Callable

    from .store import MemoryStore

__all__ = ["CANDIDATES", "reembed", "search_by_meaning"]

CANDIDATES = 50
"""At least this many candidates of each ranking are fused (more with a filter)."""
VECTOR_MARGIN = 2
"""A vector search without a filter reads this many times ``limit`` nearest (more when
some were gone since): for the HNSW index a margin over its approximate top ``limit``,
and ``hnsw.ef_search`` at least 40 (relative recall@10 0.988 to 0.997 over runs at
10,000 memories, benchmarks/memory.py; LangGraph's AsyncPostgresStore 0.988 to 0.998);
hybrid search fuses :data:`CANDIDATES` at least."""
_MOST = 64_000  # candidates of each ranking read at most while a filter drops some


async def search_by_meaning(
    store: MemoryStore,
    users: Any,
    ns: str,
    text: str,
    limit: int,
    threshold: float,
    keep: Any,
    mode: str,
) -> list[MemoryHit]:
    """``asearch`` in ``mode`` ``"vector"`` or ``"hybrid"`` (its arguments checked)."""
    vectors = store.vectors
    assert vectors is not None
    await vectors.check_model()
    query = await vectors.query(text)  # before any transaction
    words = search.query_words(text) if mode == "hybrid" and store.keyword_index else []
    rows = store.rows
    if mode == "vector" and keep is None:  # the nearest are the answer: no fusion
        count = limit * VECTOR_MARGIN
    else:
        count = max(CANDIDATES, limit * (4 if keep is None else 10))
    while True:
        near, by_words, have = await _candidates(store, vectors, users, ns, query, words, count)
        if mode == "vector":
            scored = [(i, min(1.0, max(0.0, (1.0 + c) / 2))) for i, c in near]
        else:
            scored = _fused(near, [(r.id, r.score) for r in by_words], limit)
        hits: list[MemoryHit] = []
        for memory_id, score in scored:
            if score < threshold:
                break
            row = have.get(memory_id)
            if row is None:  # gone, or expired, since the matrix was read
                continue
            memory = rows.memory(row)
            if keep is None or keep(memory.metadata):
                hits.append(MemoryHit(memory, score))
                if len(hits) == limit:
                    return hits
        if (len(near) < count and len(by_words) < count) or count >= _MOST:
            return hits
        count *= 4


async def _candidates(
    store: MemoryStore,
    vectors: Vectors,
    users: Any,
    ns: str,
    query: Any,
    words: list[str],
    count: int,
) -> tuple[list[tuple[int, float]], list[Any], dict[int, Any]]:
    """The ``count`` nearest memories (id, cosine), closest first; the ``count`` best
    by ``words`` (rows with ``id`` and ``score``), best first; and the rows of both
    by id. Through pgvector's index in one statement where it is enabled (see
    :meth:`Vectors.search_indexed`), else exactly: the keyword ranking, the vectors
    and the rows neither read read in one snapshot."""
    base, m = store.base, store.rows.m
    now = base.now()
    scope = store.rows.scope(users, ns, now) if words or not vectors.indexed else []
    ranked = search.ranked(base.backend.keywords, m, words, scope).limit(count) if words else None
    if store.vector_index is not None:  # Qdrant's, unless the database's must answer
        indexed = await indexing.candidates(store, users, ns, query, ranked, count, now)
        if indexed is not None:
            return indexed
    if vectors.indexed:
        found = await vectors.search_indexed(users, ns, query, count, now, ranked)
        if found.right:
            have = {r.id: r for r in found.by_words}
            have.update((r.id, r) for r, _ in found.near)
            return [(r.id, c) for r, c in found.near], found.by_words, have
        scope = store.rows.scope(users, ns, now)
    async with base.snapshot() as conn:
        near = await vectors.nearest(conn, users, ns, query, count, now)
        by_words = [] if ranked is None else list((await conn.execute(ranked)).all())
        have = {r.id: r for r in by_words}
        missing = [i for i, _ in near if i not in have]
        for start in range(0, len(missing), 500):
            chunk = missing[start : start + 500]
            found_rows = await conn.execute(select(*m.c).where(m.c.id.in_(chunk), and_(*scope)))
            have.update((r.id, r) for r in found_rows)
    return near, by_words, have


KEYWORD_WEIGHT = 0.002
"""The weight of a memory's keyword score (in [0, 1]: 1 for the best match) added to
its vector score ``(1 + cosine) / 2`` (measured on benchmarks/memory_set/ with
LocalEmbedding; more lowered recall@5 there): small, so the words reorder memories of nearly
the same meaning (a name, a code, a phrase) without letting a memory that merely shares
a common word ("she") outrank the nearest in meaning."""
STRONG = 0.5
"""Only a keyword score above this counts (above 0.5: the memory holds the query's
words as a phrase, or, for a one-word query, nearly as often as the best)."""
KEYWORD_DEPTH = 3
"""The keyword candidates fused are the first ``KEYWORD_DEPTH * limit``."""


def _fused(
    near: list[tuple[int, float]], by_words: list[tuple[int, float]], limit: int
) -> list[Any]:
    """The vector candidates ``near`` (id, cosine) and the keyword ones (id, score,
    best first) over their union: each memory's vector score plus
    :data:`KEYWORD_WEIGHT` times its keyword score, over the most it can be, so scores
    are in [0, 1]; a memory only the keywords found strongly scores its keyword score
    times the best vector score (weakly: 0); ties broken by the cosine."""
    words = by_words[: max(1, KEYWORD_DEPTH * limit)]
    weight = KEYWORD_WEIGHT if words else 0.0
    scores: dict[int, float] = {}
    cosine: dict[int, float] = {}
    for memory_id, c in near:
        scores[memory_id] = min(1.0, max(0.0, (1.0 + c) / 2))
        cosine[memory_id] = c
    top = max(scores.values(), default=1.0)
    for memory_id, score in words:
        kw = float(score or 0.0)
        if kw <= STRONG:  # neither a phrase holder nor near the best
            scores.setdefault(memory_id, 0.0)
        elif memory_id in cosine:
            scores[memory_id] += weight * kw
        else:  # no vector among the nearest (none at all, say): ranked by its words
            scores[memory_id] = kw * top
    order = sorted(scores, key=lambda i: (-scores[i], -cosine.get(i, -2.0)))
    return [(i, min(1.0, scores[i] / (1.0 + weight))) for i in order]


async def reembed(
    store: MemoryStore,
    chosen: Embedding,
    batch_size: int,
    text_of: Callable[[Memory], str | None] | None,
    missing: bool = False,
) -> int:
    """``areembed`` (its arguments checked): how many vectors were written.

    The memories redone are those with a vector of another model or dims; those
    without any vector only when ``missing`` (one stored with ``embed=False`` has none
    either: nothing tells it from one never embedded). A memory whose text is None
    (or empty) has its stale vector deleted, in the batch's transaction.
    """
    vectors = Vectors(store.base, store.rows, chosen)
    await vectors.detect()  # pgvector's column written too, where it is enabled
    base, rows = store.base, store.rows
    m, vt = rows.m, rows.vt
    done, after = 0, 0
    stale = (vt.c.model_id != chosen.model_id) | (vt.c.dims != chosen.dims)
    if missing:
        stale = stale | vt.c.memory_id.is_(None)
    while True:
        pick = (
            select(*m.c)
            .select_from(m.outerjoin(vt, vt.c.memory_id == m.c.id))
            .where(stale, m.c.id > after, rows.live(base.now()))
            .order_by(m.c.id)
            .limit(batch_size)
        )
        batch = await base.read(pick)
        if not batch:
            return done
        after = batch[-1].id
        texts, empty = _texts_of(store, batch, text_of)
        blobs = await vectors.embed([t for _, t in texts.values()]) if texts else []
        if not blobs and not empty:
            continue
        done += await _write_batch(store, vectors, texts, blobs, empty)


def _texts_of(
    store: MemoryStore, batch: list[Any], text_of: Callable[[Memory], str | None] | None
) -> tuple[dict[int, tuple[int, str]], dict[int, int]]:
    """The batch's memories with a text to embed (id: version and text), and those
    without one (id: version), whose stale vector is deleted."""
    rows = store.rows
    texts: dict[int, tuple[int, str]] = {}
    empty: dict[int, int] = {}  # no text: its stale vector is deleted
    for row in batch:
        memory = rows.memory(row)
        text = memory.content if text_of is None else text_of(memory)
        if text is None or not str(text):
            empty[row.id] = row.version
        else:
            texts[row.id] = (row.version, str(text))
    return texts, empty


async def _write_batch(
    store: MemoryStore,
    vectors: Vectors,
    texts: dict[int, tuple[int, str]],
    blobs: list[bytes],
    empty: dict[int, int],
) -> int:
    """One batch's vectors written (and stale ones deleted) in its own transaction,
    skipping each memory written since it was read; how many were written."""
    base, rows = store.base, store.rows
    m, vt = rows.m, rows.vt
    done = 0
    lock = (
        select(m.c.id, m.c.version, m.c.user_id, m.c.namespace)
        .where(m.c.id.in_([*texts, *empty]))
        .order_by(m.c.id)
        .with_for_update()
    )
    async with base.write_rows(lock, {}) as (conn, _):
        locked = (await conn.execute(lock)).all()
        now_at = {r.id: r for r in locked}
        scopes = []
        for (memory_id, (version, _)), blob in zip(texts.items(), blobs, strict=True):
            held = now_at.get(memory_id)
            if held is None or held.version != version:
                continue  # deleted or written since it was read
            await vectors.write(conn, memory_id, blob)
            scopes.append((held.user_id, held.namespace))
            done += 1
        gone = [i for i, v in empty.items() if i in now_at and now_at[i].version == v]
        if gone:
            await conn.execute(vt.delete().where(vt.c.memory_id.in_(gone)))
            scopes.extend((now_at[i].user_id, now_at[i].namespace) for i in gone)
        await rows.bump(conn, scopes)
    return done
