"""``tenxstore memories reindex``: the Qdrant collection rebuilt from the database."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tenxstore import MemoryStore
from tenxstore.memory import QdrantIndex
from tests.memory.embeddings import HashingEmbedding
from tests.test_cli import db, invoke, repo_for

__all__ = ["db"]

SPEC = "tests.memory.embeddings:HashingEmbedding"


def _seed(args: list[str], path: str) -> None:
    async def go() -> None:
        index = QdrantIndex(path)
        async with MemoryStore(
            repo_for(args), embedding=HashingEmbedding(), vector_index=index
        ) as s:
            await s.asetup()
            await s.astore_many("alice", ["Alice is a vegetarian", "Alice drinks espresso"])
            await s.astore("bob", "Bob is a vegetarian", key="diet")
            await s.astore("bob", "gone soon", key="gone")
            await s.repository.aclose()

    asyncio.run(go())


def _points(path: str) -> int:
    async def go() -> int:
        index = QdrantIndex(path)
        try:
            return (await index.client.count(index.collection, exact=True)).count
        finally:
            await index.aclose()

    return asyncio.run(go())


def test_reindex(db: list[str], tmp_path: Path) -> None:
    path = str(tmp_path / "qdrant")
    _seed(db, path)
    assert _points(path) == 4

    # a memory deleted by a process without the index: its point is left behind
    async def forget() -> None:
        async with MemoryStore(repo_for(db)) as plain:
            assert await plain.adelete("bob", "gone")
            await plain.repository.aclose()

    asyncio.run(forget())
    done = invoke("memories", "reindex", "--qdrant-path", path, "--embedding", SPEC, *db)
    assert done.exit_code == 0, done.output
    # the three points already right are kept (none written), the orphan deleted
    assert "0 point(s) written to Qdrant collection 'tenxstore_memories'" in done.output
    assert _points(path) == 3
    fresh = str(tmp_path / "fresh")
    other = invoke(
        "memories",
        "reindex",
        "--qdrant-path",
        fresh,
        "--collection",
        "c2",
        "--embedding",
        SPEC,
        "--batch-size",
        "1",
        *db,
    )
    assert other.exit_code == 0 and "3 point(s) written to Qdrant collection 'c2'" in other.output
    neither = invoke("memories", "reindex", "--embedding", SPEC, *db)
    assert neither.exit_code == 1 and "--qdrant-path" in neither.output
    both = invoke("memories", "reindex", "--qdrant-path", path, "--qdrant-url", "http://x", *db)
    assert both.exit_code == 1
