"""Fixtures of the cache tests: a client on the test Redis, and a statement counter."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import event

from tenxstore import CachedCheckpointer


@contextmanager
def sql_statements(cp: CachedCheckpointer) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    engine = cp.inner.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


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
