"""Fixtures of the cache tests: a client on the test Redis, and a statement counter."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis.asyncio import Redis


@contextmanager
def sql_statements(cp: Any) -> Iterator[list[str]]:
    """Every statement the repository behind ``cp`` sends meanwhile (hot path included)."""
    seen: list[str] = []
    repository = getattr(cp, "inner", cp)
    remove = repository.backend.on_statement(seen.append)
    try:
        yield seen
    finally:
        remove()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Redis]:
    """A client on the test Redis; the tests' "cachetest:" keys are gone before and after."""
    client = Redis.from_url(redis_url)

    async def clear() -> None:
        keys = [k async for k in client.scan_iter(match="cachetest:*")]
        if keys:
            await client.delete(*keys)

    await clear()  # what an interrupted earlier run may have left
    yield client
    await clear()
    await client.aclose()
