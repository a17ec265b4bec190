"""Keyword search on each database's full-text engine: what every engine promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tenxstore import ConfigError, MemoryStore
from tests.conftest import SQL_BACKENDS, Backend, backend_for


async def _keys(memories: MemoryStore, query: str, **options: Any) -> list[str]:
    return [hit.memory.key for hit in await memories.asearch("alice", query, **options)]


async def test_a_distinctive_word_is_found(memories: MemoryStore) -> None:
    await memories.astore("alice", "The user's dog is called Zanzibar", key="dog")
    await memories.astore("alice", "The user prefers window seats", key="seat")
    assert await _keys(memories, "zanzibar") == ["dog"]
    assert await _keys(memories, "ZANZIBAR?") == ["dog"]  # case and punctuation aside
    assert await _keys(memories, "giraffe") == []


async def test_short_codes_and_stopwords_are_found(memories: MemoryStore) -> None:
    await memories.astore("alice", "Her locker code is QX-7731", key="code")
    await memories.astore("alice", "The flight is at 9 am on A3 to the UK", key="flight")
    await memories.astore("alice", "nothing to see", key="noise")
    assert await _keys(memories, "QX-7731") == ["code"]
    assert await _keys(memories, "qx") == ["code"]
    assert await _keys(memories, "a3") == ["flight"]  # two characters
    assert await _keys(memories, "9") == ["flight"]  # one
    assert await _keys(memories, "uk") == ["flight"]
    assert set(await _keys(memories, "the")) == {"flight"}  # a stopword elsewhere


async def test_an_exact_phrase_ranks_first(memories: MemoryStore) -> None:
    await memories.astore(
        "alice", "whale songs, a blue sea and a whale that is blue, blue", key="mixed"
    )
    await memories.astore("alice", "the blue whale is the largest animal", key="phrase")
    await memories.astore("alice", "blue skies", key="blue")
    hits = await memories.asearch("alice", "blue whale")
    assert hits[0].memory.key == "phrase"
    assert hits[0].score == 1.0
    assert {h.memory.key for h in hits} == {"mixed", "phrase", "blue"}


async def test_scores_are_in_zero_to_one_best_first(memories: MemoryStore) -> None:
    for n in range(8):
        await memories.astore("alice", "tea " * (n + 1) + f"filler {n}", key=f"k{n}")
    hits = await memories.asearch("alice", "tea", limit=8)
    scores = [h.score for h in hits]
    assert len(hits) == 8 and scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores) and scores[0] == 1.0
    assert len(await memories.asearch("alice", "tea")) == 5  # the default limit
    kept = await memories.asearch("alice", "tea", limit=8, score_threshold=scores[3])
    assert [h.score for h in kept] == scores[: len(kept)] and len(kept) >= 4
    assert all(h.score >= scores[3] for h in kept)
    assert await memories.asearch("alice", "tea", score_threshold=1.0) != []


async def test_filter_on_metadata(memories: MemoryStore) -> None:
    rows = [("a", {"kind": "pref", "n": 1}), ("b", {"kind": "fact", "n": 5}), ("c", {"n": "5"})]
    for key, meta in rows:
        await memories.astore("alice", "shared word", key=key, metadata=meta)

    async def found(flt: dict[str, Any]) -> set[str]:
        return set(await _keys(memories, "word", filter=flt, limit=10))

    assert await found({"kind": "pref"}) == {"a"}
    assert await found({"kind": {"$eq": "fact"}}) == {"b"}
    assert await found({"kind": {"$ne": "pref"}}) == {"b", "c"}
    assert await found({"n": {"$gt": 1}}) == {"b"}  # "5" is text, not a number
    assert await found({"n": {"$gte": 1, "$lt": 5}}) == {"a"}
    assert await found({"n": {"$lte": 5}}) == {"a", "b"}
    assert await found({"n": {"$in": [5, "5"]}}) == {"b", "c"}
    assert await found({"kind": "pref", "n": 5}) == set()


async def test_a_filter_reads_past_the_first_page(memories: MemoryStore) -> None:
    for n in range(120):
        await memories.astore("alice", f"note {n}", key=f"n{n}", metadata={"odd": n % 2})
    await memories.astore("alice", "note rare", key="rare", metadata={"odd": 7})
    assert await _keys(memories, "note", filter={"odd": 7}) == ["rare"]


async def test_search_covers_the_namespace_and_under_it(memories: MemoryStore) -> None:
    await memories.astore("alice", "kiwi", key="top", namespace=("memories",))
    await memories.astore("alice", "kiwi", key="deep", namespace=("memories", "food"))
    await memories.astore("alice", "kiwi", key="else", namespace=("other",))
    assert set(await _keys(memories, "kiwi")) == {"top", "deep"}
    assert await _keys(memories, "kiwi", namespace=("memories", "food")) == ["deep"]
    assert set(await _keys(memories, "kiwi", namespace=())) == {"top", "deep", "else"}


async def test_unicode_words(memories: MemoryStore) -> None:
    await memories.astore("alice", "Un café crème à Zürich", key="fr")
    await memories.astore("alice", "नमस्ते दुनिया", key="hi")
    assert await _keys(memories, "CAFÉ") == ["fr"]
    assert await _keys(memories, "zürich") == ["fr"]
    assert await _keys(memories, "नमस्ते") == ["hi"]


async def test_a_query_without_words_finds_nothing(memories: MemoryStore) -> None:
    await memories.astore("alice", "anything", key="k")
    assert await memories.asearch("alice", "") == []
    assert await memories.asearch("alice", "?!% _*") == []
    assert await memories.asearch("alice", "anything", limit=0) == []


async def test_an_update_moves_the_words(memories: MemoryStore) -> None:
    await memories.astore("alice", "apples", key="k")
    await memories.aupdate("alice", "k", content="pears")
    assert await _keys(memories, "apples") == []
    assert await _keys(memories, "pears") == ["k"]
    await memories.aupdate("alice", "k", metadata={"m": 1})  # the words stay
    assert await _keys(memories, "pears") == ["k"]
    await memories.adelete("alice", "k")
    assert await _keys(memories, "pears") == []


async def test_a_store_without_a_keyword_index(backend: Backend) -> None:
    store = MemoryStore(await backend.make(), keyword_index=False)
    await store.astore("alice", "secret words", key="k")
    with pytest.raises(ConfigError, match="keeps no keyword index"):
        await store.asearch("alice", "secret")
    table = store.rows.m
    [row] = await store.base.read(table.select())
    assert row.terms is None
    with_index = MemoryStore(store.repository)
    assert await with_index.asearch("alice", "secret") == []  # nothing was indexed


@pytest.mark.parametrize("name", SQL_BACKENDS)
async def test_the_largest_memory_is_indexed_within_bounds(name: str, tmp_path: Path) -> None:
    """2 MiB of distinct words: the engines' own limits (a tsvector's 1 MB, MySQL's
    packet, the padded words) hold, as the index keeps the first 256 KiB of words."""
    async with backend_for(name, tmp_path) as backend:
        store = MemoryStore(await backend.make())
        words = [f"w{n:06d}" for n in range(300_000)]
        content = " ".join(words)[: 2 * 1024 * 1024]
        await store.astore("alice", content, key="big")
        await store.astore("alice", "a " * (1024 * 1024 - 1), key="tiny")
        assert [h.memory.key for h in await store.asearch("alice", "w000007")] == ["big"]
        assert await store.asearch("alice", words[-1]) == []  # past the indexed words
        assert [h.memory.key for h in await store.asearch("alice", "a")] == ["tiny"]
        found = await store.aget("alice", "big")
        assert found is not None and found.content == content


async def test_sqlite_runs_a_match_once_not_once_per_memory(tmp_path: Path) -> None:
    """The plan of a two-word search on a SQLite file reads FTS5's matches once and
    looks each memory up by its id. Flattened into the join, the planner walked the
    user's memories by index and ran the whole MATCH again for each (``INDEX 0:=M1``:
    a rowid and a match): 5.8 s for three words over 3,000 memories, 0.05 s now."""
    import sqlite3

    from sqlalchemy.dialects import sqlite

    from tenxstore.memory import search

    path = tmp_path / "plan.db"
    memories = MemoryStore(f"sqlite:///{path}")
    try:
        await memories.asetup()
        for n in range(20):
            await memories.astore("alice", f"green tea in the morning, cup {n}", key=f"k{n}")
        store, rows = memories.base, memories.rows
        stmt = search.ranked(
            store.backend.keywords,
            rows.m,
            search.query_words("green tea morning"),
            rows.scope("alice", "memories", store.now()),
        )
        sql = str(stmt.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
        found = await memories.asearch("alice", "green tea morning", limit=3)
        assert len(found) == 3
    finally:
        await memories.aclose()
    with sqlite3.connect(path) as conn:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql)]
    fts_scans = [step for step in plan if "memories_fts VIRTUAL TABLE" in step]
    assert fts_scans and not any(":=" in step for step in fts_scans), plan
