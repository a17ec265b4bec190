"""Keyword search over a :class:`~tenxstore.MemoryStore`: ``asearch`` in mode
``"keyword"``, the database's full-text ranking (:mod:`tenxstore.memory.search`) read
a page at a time in one snapshot while a metadata filter drops some."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..types import MemoryHit
from . import search

if TYPE_CHECKING:
    from .store import MemoryStore

__all__ = ["search_by_words"]

_PAGE = 100  # candidates read at a time while a metadata filter drops some


async def search_by_words(
    store: MemoryStore, users: Any, ns: str, text: str, limit: int, threshold: float, keep: Any
) -> list[MemoryHit]:
    """``asearch`` in ``mode`` ``"keyword"`` (its arguments checked)."""
    found = search.query_words(text)
    if not found or not limit:
        return []
    base, rows = store.base, store.rows
    stmt = search.ranked(base.backend.keywords, rows.m, found, rows.scope(users, ns, base.now()))
    hits: list[MemoryHit] = []
    page = limit if keep is None else max(limit, _PAGE)
    async with base.snapshot() as conn:
        for start in range(0, 2**62, page):
            batch = (await conn.execute(stmt.limit(page).offset(start))).all()
            for row in batch:
                score = min(1.0, max(0.0, float(row.score)))
                if score < threshold:
                    return hits  # best first: every later one is lower
                memory = rows.memory(row)
                if keep is None or keep(memory.metadata):
                    hits.append(MemoryHit(memory, score))
                    if len(hits) == limit:
                        return hits
            if len(batch) < page:
                return hits
    return hits
