"""The labelled memory set (benchmarks/memory_set/) loads and is well-formed: the
numbers in docs/embedding-models.md are computed on what these checks hold."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quality() -> ModuleType:
    """benchmarks/memory_quality.py (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location(
        "memory_quality", ROOT / "benchmarks" / "memory_quality.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_counts_and_keys(quality: ModuleType) -> None:
    data = quality.load()
    assert len(data.memories) >= 300
    assert len(data.queries) >= 150
    keys = [m.key for m in data.memories]
    assert len(set(keys)) == len(keys), "memory keys are unique"
    ids = [q.id for q in data.queries]
    assert len(set(ids)) == len(ids), "query ids are unique"
    assert len(data.users()) >= 5
    contents = [(m.user_id, m.content) for m in data.memories]
    assert len(set(contents)) == len(contents), "no memory is written twice"
    counts = Counter(q.category for q in data.queries)
    assert set(counts) == set(quality.CATEGORIES)
    assert all(n >= 15 for n in counts.values()), counts


def test_labels_point_at_memories_of_the_same_user(quality: ModuleType) -> None:
    data = quality.load()
    by_key = data.by_key()
    for q in data.queries:
        assert q.query.strip(), q.id
        assert q.relevant, q.id
        for key in (*q.relevant, *q.distractors):
            assert key in by_key, (q.id, key)
            assert by_key[key].user_id == q.user_id, (q.id, key)
        assert not set(q.relevant) & set(q.distractors), q.id
        assert bool(q.distractors) == (q.category == "near_miss"), q.id


def test_categories_hold_what_they_say(quality: ModuleType) -> None:
    """A paraphrase shares no content word with its memories; a near-miss shares one
    with each distractor; a keyword-only query's rarest token is in its memories."""
    data = quality.load()
    by_key = data.by_key()
    words = quality.content_words
    for q in data.queries:
        asked = words(q.query)
        if q.category == "paraphrase":
            for key in q.relevant:
                shared = asked & words(by_key[key].content)
                assert not shared, (q.id, key, shared)
        elif q.category == "near_miss":
            for key in q.distractors:
                assert asked & words(by_key[key].content), (q.id, key)
        elif q.category == "keyword_only":
            text = " ".join(by_key[key].content.lower() for key in q.relevant)
            tokens = [t.strip("?.,!").lower() for t in q.query.split()]
            assert any(t in text for t in tokens if len(t) > 3), q.id


def test_scorer(quality: ModuleType) -> None:
    """Recall@k and MRR on a ranking whose answers are known."""
    data = quality.load()
    first = next(q for q in data.queries if len(q.relevant) == 1)

    async def perfect(user_id: str, query: str) -> list[str]:
        return [next(q for q in data.queries if q.query == query).relevant[0]]

    async def second(user_id: str, query: str) -> list[str]:
        return ["nothing", *(await perfect(user_id, query))]

    top = asyncio.run(quality.score(data, perfect, [first]))["all"].row()
    assert (top["recall@1"], top["recall@5"], top["mrr"]) == (1.0, 1.0, 1.0)
    low = asyncio.run(quality.score(data, second, [first]))["all"].row()
    assert (low["recall@1"], low["recall@5"], low["mrr"]) == (0.0, 1.0, 0.5)


class _Hit:
    def __init__(self, key: str) -> None:
        self.memory = type("M", (), {"key": key})()
        self.score = 1.0


class _OracleStore:
    """A stand-in with the store's ``astore`` / ``asearch(..., mode=)``: it answers every
    query with its labels, so the scorer must read back perfect scores."""

    def __init__(self, answers: dict[str, tuple[str, ...]]) -> None:
        self.answers = answers
        self.stored: list[tuple[str, str, str | None]] = []
        self.modes: set[str] = set()

    async def astore(
        self, user_id: str, content: str, *, key: str | None = None, namespace: tuple[str, ...]
    ) -> None:
        self.stored.append((user_id, content, key))

    async def asearch(
        self, user_id: str, query: str, *, namespace: tuple[str, ...], limit: int, mode: str
    ) -> list[_Hit]:
        self.modes.add(mode)
        return [_Hit(key) for key in self.answers[query]][:limit]


def test_store_ranking_asks_the_mode(quality: ModuleType) -> None:
    data = quality.load()
    store = _OracleStore({q.query: q.relevant for q in data.queries})
    asyncio.run(quality.load_store(data, store))
    assert [key for _, _, key in store.stored] == [m.key for m in data.memories]
    results = asyncio.run(quality.score(data, quality.store_ranker(store, "hybrid")))
    assert store.modes == {"hybrid"}
    assert results["all"].row()["mrr"] == 1.0
    assert results["all"].row()["recall@5"] == 1.0


def test_a_store_without_modes_ranks_by_keyword_only(quality: ModuleType) -> None:
    class KeywordStore:
        async def asearch(
            self, user_id: str, query: str, *, namespace: tuple[str, ...], limit: int
        ) -> list[_Hit]:
            return []

    quality.store_ranker(KeywordStore(), "keyword")
    with pytest.raises(SystemExit, match="no mode="):
        quality.store_ranker(KeywordStore(), "vector")
