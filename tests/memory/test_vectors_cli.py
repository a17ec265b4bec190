"""The operator's commands of search by meaning: ``memories reembed`` (resumable, on a
live database), ``memories enable-pgvector`` (idempotent) and ``doctor``'s pgvector
line."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tenxstore import MemoryStore
from tests import services
from tests.memory.embeddings import HashingEmbedding, SmallHashing
from tests.memory.test_pgvector import _vector_database
from tests.test_cli import db, invoke, repo_for

__all__ = ["db"]


def _seed(args: list[str]) -> None:
    async def go() -> None:
        async with MemoryStore(repo_for(args), embedding=HashingEmbedding()) as store:
            await store.asetup()
            for n, text in enumerate(["Alice is a vegetarian", "Alice drinks espresso"] * 3):
                await store.astore("alice" if n < 3 else "bob", text, key=f"k{n}")
            await store.repository.aclose()

    asyncio.run(go())


def _top(args: list[str], query: str) -> str:
    async def go() -> str:
        async with MemoryStore(repo_for(args), embedding=SmallHashing()) as store:
            hits = await store.asearch("alice", query, mode="vector")
            await store.repository.aclose()
            return hits[0].memory.content

    return asyncio.run(go())


def test_reembed_and_doctor(db: list[str]) -> None:
    _seed(db)
    spec = "tests.memory.embeddings:SmallHashing"
    done = invoke("memories", "reembed", "--embedding", spec, "--batch-size", "4", *db)
    assert done.exit_code == 0, done.output
    assert "6 vector(s) written with 'small-hashing' (32 dims)" in done.output
    again = invoke("memories", "reembed", "--embedding", spec, *db)
    assert again.exit_code == 0 and "0 vector(s) written" in again.output
    missing = invoke("memories", "reembed", "--embedding", spec, "--missing", *db)
    assert missing.exit_code == 0 and "0 vector(s) written" in missing.output
    assert _top(db, "vegetarians") == "Alice is a vegetarian"
    spec_args = ["--embedding", spec, "--user", "alice"]
    meaning = invoke("memories", "search", "vegetarians", *spec_args, "--mode", "vector", *db)
    assert meaning.exit_code == 0, meaning.output
    assert "Alice is a vegetarian" in meaning.output.splitlines()[3]  # the first row
    words = invoke("memories", "search", "vegetarians", *db)
    assert "no memory matches" in words.output  # keywords: no such word
    wrong = invoke("memories", "search", "x", *spec_args, "--mode", "fuzzy", *db)
    assert wrong.exit_code == 1 and "mode must be" in wrong.output
    bad = invoke("memories", "reembed", "--embedding", "no_such_module:Model", *db)
    assert bad.exit_code == 1 and "cannot import the embedding" in bad.output
    shape = invoke("memories", "reembed", "--embedding", "nocolon", *db)
    assert shape.exit_code == 1 and "module:attribute" in shape.output
    doctor = invoke("doctor", *db)
    if db[1].startswith("sqlite"):
        assert "pgvector" not in doctor.output
        refused = invoke("memories", "enable-pgvector", *db)
        assert refused.exit_code == 1 and "PostgreSQL extension" in refused.output
    else:  # the suite's databases have pgvector on the server, not created in them
        assert "pgvector  0.8" in doctor.output and "not created" in doctor.output


def test_enable_pgvector_twice() -> None:
    url = _vector_database()
    asyncio.run(_extension(url))
    schema = f"v_{uuid.uuid4().hex[:12]}"
    args = ["--url", url, "--schema", schema]
    try:
        assert invoke("upgrade", *args).exit_code == 0
        for _ in range(2):
            done = invoke("memories", "enable-pgvector", *args)
            assert done.exit_code == 0, done.output
            assert "pgvector 0.8" in done.output and "enabled" in done.output
        doctor = invoke("doctor", *args)
        assert "enabled (HNSW search)" in doctor.output, doctor.output
    finally:
        asyncio.run(_drop(url, schema))


async def _extension(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    finally:
        await conn.close()


async def _drop(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture(autouse=True)
def _pg() -> None:
    services.pg_url()  # fails the run when PostgreSQL was asked for and is not there
