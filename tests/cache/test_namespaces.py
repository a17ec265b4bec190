"""One Redis shared by several stores: the default key namespace is the store's own id."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from tenxstore import CachedCheckpointer, CheckpointRepository, PgCheckpointer
from tests import services
from tests.cache.conftest import sql_statements
from tests.conftest import cfg, drop_schema, new_schema, quoted


@pytest.fixture
async def made(redis_url: str) -> AsyncIterator[list[Any]]:
    """Checkpointers a test makes; closed afterwards, their stores' keys deleted."""
    checkpointers: list[Any] = []
    yield checkpointers
    client = Redis.from_url(redis_url)
    try:
        for cp in checkpointers:
            keys = [
                k async for k in client.scan_iter(match=f"state_cache:{await cp.astore_id()}:*")
            ]
            if keys:
                await client.delete(*keys)
            await cp.aclose()
    finally:
        await client.aclose()


@pytest.fixture
async def schemas(pg_url: str) -> AsyncIterator[list[str]]:
    names = [new_schema(), new_schema()]
    yield names
    for name in names:
        await drop_schema(pg_url, name)


async def test_two_postgresql_schemas_never_share_an_entry(
    made: list[Any], schemas: list[str], pg_url: str, redis_url: str
) -> None:
    a, b = (PgCheckpointer(postgres_dsn=pg_url, redis_url=redis_url, schema=s) for s in schemas)
    made += [a, b]
    for cp in (a, b):
        await cp.asetup()
    await a.aput_state(cfg(), {"tenant": "A"})
    assert await a.aget_state_cache(cfg()) == {"tenant": "A"}
    assert await b.aget_state_cache(cfg()) is None  # the same ids, another store
    await b.aput_state(cfg(), {"tenant": "B"})
    assert await a.aget_state_cache(cfg()) == {"tenant": "A"}
    assert a.key_prefix != b.key_prefix and a.key_prefix.startswith("state_cache:")


async def test_two_sqlite_files_never_share_an_entry(
    made: list[Any], tmp_path: Path, redis_url: str
) -> None:
    a, b = (
        CachedCheckpointer(CheckpointRepository(f"sqlite:///{tmp_path / n}"), redis_url=redis_url)
        for n in ("a.db", "b.db")
    )
    made += [a, b]
    for cp in (a, b):
        await cp.asetup()
    await a.aput_state(cfg(), {"file": "a"})
    assert await a.aget_state_cache(cfg()) == {"file": "a"}
    assert await b.aget_state_cache(cfg()) is None


async def test_one_store_reached_two_ways_shares_its_entries(
    made: list[Any], schemas: list[str], pg_url: str, redis_url: str
) -> None:
    schema = schemas[0]
    other_host = pg_url.replace("127.0.0.1", "localhost")
    # A generous Redis bound (the preset's 0.25 s can pass on a loaded machine, and the
    # read would fail open to the database: not the miss under test).
    slow = {"redis_url": redis_url, "schema": schema, "redis_timeout": 2.0}
    direct = PgCheckpointer(postgres_dsn=pg_url, **slow)
    by_name = PgCheckpointer(postgres_dsn=other_host, **slow)
    pooled = PgCheckpointer(postgres_dsn=services.pgbouncer_url(), pool_mode="transaction", **slow)
    made += [direct, by_name, pooled]
    await direct.asetup()
    await direct.aput_state(cfg(), {"n": 1})
    for other in (by_name, pooled):
        await other.aget_state_cache(cfg("warm"))  # the store is known: its id is read once
        with sql_statements(other) as seen:
            assert await other.aget_state_cache(cfg()) == {"n": 1}
        assert seen == [], "a hit on the entry the direct connection wrote"
    assert direct.key_prefix == by_name.key_prefix == pooled.key_prefix


async def test_keys_of_the_previous_release_are_never_served(
    made: list[Any], schemas: list[str], pg_url: str, redis_url: str, redis_client: Redis
) -> None:
    cp = PgCheckpointer(postgres_dsn=pg_url, redis_url=redis_url, schema=schemas[0])
    made.append(cp)
    await cp.asetup()
    await cp.aput_state(cfg("legacy-1"), {"n": 2})
    # What 0.1 wrote under its key format, for another store's thread of the same id:
    stale = b'{"__checkpoint_version__":9,"n":"from another store, before the upgrade"}'
    await redis_client.set("state_cache:legacy-1:alice", stale, px=60_000)
    try:
        config = cfg("legacy-1")
        assert await cp.aget_state_cache(config) == {"n": 2}
        assert config["_checkpoint_version"] == 1
    finally:
        await redis_client.delete("state_cache:legacy-1:alice")


async def test_an_explicit_prefix_is_used_verbatim(
    made: list[Any], tmp_path: Path, redis_url: str, redis_client: Redis
) -> None:
    cp = CachedCheckpointer(
        CheckpointRepository(f"sqlite:///{tmp_path / 'p.db'}"),
        redis_url=redis_url,
        key_prefix="cachetest",
    )
    made.append(cp)
    await cp.asetup()
    await cp.aput_state(cfg(), {"x": 1})
    assert await redis_client.exists("cachetest:t1:alice")
    assert cp.key_prefix == "cachetest"


async def test_the_namespace_holds_no_secret(
    made: list[Any], schemas: list[str], pg_url: str, redis_url: str
) -> None:
    with_password = pg_url.replace("postgres@", "postgres:hunter2@")
    cp = PgCheckpointer(postgres_dsn=with_password, redis_url=redis_url, schema=schemas[0])
    made.append(cp)
    await cp.asetup()
    await cp.aget_state_cache(cfg("nothing"))
    assert "hunter2" not in cp.key_prefix and "127.0.0.1" not in cp.key_prefix


@pytest.fixture
async def case_schemas(pg_url: str) -> AsyncIterator[tuple[str, str]]:
    """Two schema names that differ only by case, dropped after the test."""
    tag = uuid.uuid4().hex[:8]
    names = (f"acme_{tag}", f"Acme_{tag}")
    yield names
    for name in names:
        await drop_schema(pg_url, name)


async def test_schemas_whose_names_differ_by_case_never_share_an_entry(
    case_schemas: tuple[str, str], made: list[Any], pg_url: str, redis_url: str
) -> None:
    """``Acme`` is not ``acme``: here ``Acme`` is restored from a copy of ``acme`` (the
    same store id row), on one Redis. The store's identity used to find its schema by
    the name parsed as SQL, which folds ``Acme`` to ``acme``: the copy took the
    original's namespace and was served its entries."""
    lower, upper = case_schemas
    original = PgCheckpointer(postgres_dsn=pg_url, redis_url=redis_url, schema=lower)
    made.append(original)
    await original.asetup()
    async with PgCheckpointer(postgres_dsn=pg_url, redis_url=redis_url, schema=upper) as fresh:
        await fresh.asetup()
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute(
            f"UPDATE {quoted(upper)}.tenxstore_store SET store_id = "
            f"(SELECT store_id FROM {quoted(lower)}.tenxstore_store)"
        )
    finally:
        await admin.close()
    copy = PgCheckpointer(postgres_dsn=pg_url, redis_url=redis_url, schema=upper)
    made.append(copy)
    await original.aput_state(cfg(), {"tenant": "acme"})
    assert await original.aget_state_cache(cfg()) == {"tenant": "acme"}
    assert await copy.aget_state_cache(cfg()) is None  # the same ids, another store
    await copy.aput_state(cfg(), {"tenant": "Acme"})
    assert await original.aget_state_cache(cfg()) == {"tenant": "acme"}
    assert await copy.aget_state_cache(cfg()) == {"tenant": "Acme"}
    assert original.key_prefix != copy.key_prefix
