"""A delete's fence holds against everything that could bring the deleted data back:
a stale writer, a second delete, a refill in flight, a read racing the replay of
invalidations after an outage, a cache-only put once the fence is gone, an import that
gives the thread to another user, and a copy of the database."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from tenxstore import CachedCheckpointer, CheckpointRepository, SqliteCheckpointer, StaleStateError
from tenxstore.cache import cache_key
from tests import services
from tests.conftest import cfg, drop_schema, new_schema
from tests.servers import TcpProxy


@pytest.fixture
async def cached(pg_url: str, redis_url: str) -> AsyncIterator[CachedCheckpointer]:
    """A cached PostgreSQL store of its own (schema and key prefix)."""
    schema = new_schema()
    cp = CachedCheckpointer(
        CheckpointRepository(pg_url, schema=schema),
        redis_url=redis_url,
        key_prefix=f"cachetest-{schema}",
        redis_timeout=2.0,
    )
    await cp.asetup()
    yield cp
    await cp.aclose()
    await drop_schema(pg_url, schema)
    async with Redis.from_url(redis_url) as client:
        keys = [k async for k in client.scan_iter(match=f"cachetest-{schema}:*")]
        if keys:
            await client.delete(*keys)


async def read_before(cp: CachedCheckpointer, thread: str = "t") -> dict[str, Any]:
    """A run's config after it read the thread through the cache."""
    config = cfg(thread)
    await cp.aget_state_cache(config)
    return config


async def test_a_stale_writer_refused_after_a_delete_leaves_the_fence(
    cached: CachedCheckpointer,
) -> None:
    await cached.aput_state(cfg("t"), {"secret": "v1"})
    run_a, run_b = await read_before(cached), await read_before(cached)
    assert await cached.aclean_thread(cfg("t"))
    with pytest.raises(StaleStateError):
        await cached.aput_state(run_a, {"secret": "v2"})  # its entry is dropped, not the fence
    assert not await cached.aput_state_cache(run_b, {"secret": "read before the delete"}, 2)
    assert await cached.aget_state_cache(cfg("t")) is None


async def test_a_second_delete_leaves_the_fence(cached: CachedCheckpointer) -> None:
    await cached.aput_state(cfg("t"), {"secret": "v1"})
    run = await read_before(cached)
    assert await cached.aclean_thread(cfg("t"))
    assert not await cached.aclean_thread(cfg("t"))  # a retried delete, a double click
    assert not await cached.aput_state_cache(run, {"secret": "v2"}, 2)
    assert await cached.aget_state_cache(cfg("t")) is None


async def delete_then_write_stale(
    cp: CachedCheckpointer, thread: str, stale: dict[str, Any], yields: int
) -> None:
    for _ in range(yields):  # let a read in flight get that far first
        await asyncio.sleep(0)
    assert await cp.aclean_thread(cfg(thread))
    with pytest.raises(StaleStateError):
        await cp.aput_state(stale, {"secret": "y"})


async def test_no_refill_lands_after_a_delete_and_a_stale_write(
    cached: CachedCheckpointer,
) -> None:
    """A cold read in flight across a delete and a refused stale write, at many offsets."""
    big = {"secret": ["x" * 100] * 10_000}  # a read that takes a while
    served = 0
    for i in range(40):
        thread = f"t{i}"
        await cached.inner.aput_state(cfg(thread), big)
        stale = cfg(thread)
        await cached.inner.aget_state(stale)
        await asyncio.gather(
            cached.aget_state_cache(cfg(thread)),
            delete_then_write_stale(cached, thread, stale, i % 8),
        )
        served += await cached.aget_state_cache(cfg(thread)) is not None
    assert served == 0


async def test_a_cache_only_put_never_recreates_a_deleted_thread(
    cached: CachedCheckpointer, redis_url: str
) -> None:
    await cached.aput_state(cfg("t"), {"secret": "v1"})
    stale = await read_before(cached)
    assert await cached.aclean_thread(cfg("t"))
    # The fence is gone (expired after 60 s, or evicted under allkeys-lru):
    prefix = cached.key_prefix
    async with Redis.from_url(redis_url) as client:
        await client.delete(cache_key(prefix, "t", "alice", True))
    assert not await cached.aput_state_cache(stale, {"secret": "v2"}, 2)
    assert await cached.aget_state_cache(cfg("t")) is None
    # ...nor one of a new life written meanwhile:
    await cached.aput_state(cfg("t"), {"new": 1})
    async with Redis.from_url(redis_url) as client:
        await client.delete(cache_key(prefix, "t", "alice", True))
    assert not await cached.aput_state_cache(stale, {"secret": "v2"}, 2)
    assert await cached.aget_state_cache(cfg("t")) == {"new": 1}
    # A run of the live thread may still put into an empty key.
    current = cfg("t")
    await cached.aget_state(current)
    async with Redis.from_url(redis_url) as client:
        await client.delete(cache_key(prefix, "t", "alice", True))
    assert await cached.aput_state_cache(current, {"new": 2}, 5)
    assert await cached.aget_state_cache(cfg("t")) == {"new": 2}


async def test_an_import_to_another_owner_fences_the_previous_owners_entry(
    cached: CachedCheckpointer,
) -> None:
    await cached.aput_state(cfg("t", "alice"), {"secret": "alice's"})
    assert await cached.aget_state_cache(cfg("t", "alice")) == {"secret": "alice's"}
    await cached.aput_state(cfg("tb", "bob"), {"bob": 1})
    export = await cached.aexport_thread(cfg("tb", "bob"))
    assert export is not None
    export = dataclasses.replace(export, thread=dataclasses.replace(export.thread, thread_id="t"))
    assert await cached.aimport_thread(export, on_conflict="replace") == "replaced"
    assert await cached.aget_state(cfg("t", "alice")) is None
    assert await cached.aget_state_cache(cfg("t", "alice")) is None
    assert await cached.aget_state_cache(cfg("t", "bob")) == {"bob": 1}


async def test_a_read_never_gets_ahead_of_the_replay_after_an_outage(
    pg_url: str, redis_url: str, pg_schema: str
) -> None:
    link = await TcpProxy(urlsplit(redis_url).port or 6379).start()
    prefix = f"cachetest-{pg_schema}"
    cp = CachedCheckpointer(
        CheckpointRepository(pg_url, schema=pg_schema),
        redis_url=f"redis://127.0.0.1:{link.port}/{services.redis_db()}",
        key_prefix=prefix,
        redis_timeout=2.0,
        redis_backoff=0.05,
    )
    try:
        await cp.asetup()
        n = 50
        for i in range(n):
            await cp.aput_state(cfg(f"t{i}"), {"secret": i})
        link.cut()  # Redis unreachable: the deletes' fences are remembered
        for i in range(n):
            assert await cp.aclean_thread(cfg(f"t{i}"))
        assert cp.pending_invalidations == 2 * n
        link.restore()
        await asyncio.sleep((await cp.acheck()).cache_down_for)  # the back-off window ends
        # Redis answers again and requests arrive together: the first starts the replay,
        # the others must not read a key whose fence has not been confirmed.
        reads = await asyncio.gather(*(cp.aget_state_cache(cfg(f"t{i}")) for i in range(n)))
        assert reads == [None] * n
        assert cp.pending_invalidations == 0
    finally:
        await cp.aclose()
        await link.close()
        async with Redis.from_url(redis_url) as client:
            keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
            if keys:
                await client.delete(*keys)


async def test_a_copied_database_file_is_another_store(tmp_path: Path, redis_url: str) -> None:
    a_path, b_path = tmp_path / "a.db", tmp_path / "b.db"
    a = SqliteCheckpointer(a_path, redis_url=redis_url)
    await a.asetup()
    await a.aclose()
    shutil.copy(a_path, b_path)
    a = SqliteCheckpointer(a_path, redis_url=redis_url)
    b = SqliteCheckpointer(b_path, redis_url=redis_url)
    same = SqliteCheckpointer(f"sqlite:///{tmp_path / '.' / 'a.db'}", redis_url=redis_url)
    try:
        await a.aput_state(cfg(), {"tenant": "A"})
        assert await b.aget_state(cfg()) is None
        assert await b.aget_state_cache(cfg()) is None
        assert await a.astore_id() != await b.astore_id()
        assert await same.astore_id() == await a.astore_id()  # another path, one file
    finally:
        for cp in (a, b, same):
            await cp.aclose()
        async with Redis.from_url(redis_url) as client:
            for cp in (a, b):
                keys = [k async for k in client.scan_iter(match=f"{cp.key_prefix}:*")]
                if keys:
                    await client.delete(*keys)


async def test_a_database_made_from_another_as_a_template_is_another_store(
    pg_url: str, redis_url: str
) -> None:
    import asyncpg

    admin = await asyncpg.connect(pg_url)
    source, copy = f"tx_src_{new_schema()}", f"tx_copy_{new_schema()}"
    base = pg_url.rsplit("/", 1)[0]
    try:
        await admin.execute(f'CREATE DATABASE "{source}"')
        first = CheckpointRepository(f"{base}/{source}")
        await first.asetup()
        await first.aclose()
        await admin.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{source}"')
        a, b = CheckpointRepository(f"{base}/{source}"), CheckpointRepository(f"{base}/{copy}")
        try:
            assert await a.astore_id() != await b.astore_id()
        finally:
            await a.aclose()
            await b.aclose()
    finally:
        for name in (copy, source):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
