"""Each entry names the Redis master that stored it: a read serves only the answering
master's entries, a put lands only on the master its caller knew before it went to the
database, and a replica refuses both (READONLY)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tenxstore import CachedCheckpointer, CheckpointRepository, ConfigError
from tests import services
from tests.cache.conftest import sql_statements
from tests.conftest import cfg
from tests.sentinel import poll

KEY = "cachetest:t1:alice"


@pytest.fixture
async def cached(tmp_path: Path, redis_url: str) -> AsyncIterator[CachedCheckpointer]:
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'm.db'}")
    await repo.asetup()
    cp = CachedCheckpointer(repo, redis_url=redis_url, key_prefix="cachetest", redis_timeout=2.0)
    yield cp
    await cp.aclose()


async def test_an_entry_of_another_master_is_a_miss_and_dropped(
    cached: CachedCheckpointer, redis_client: Redis
) -> None:
    await cached.aput_state(cfg(), {"n": 1})
    mine = await redis_client.get(KEY)
    master = (await redis_client.info("replication"))["master_replid"].encode()
    assert mine is not None and mine.startswith(b"m:" + master + b':{"__checkpoint_version__"')
    other = b"m:" + b"0" * 40 + mine[2 + len(master) :]  # another master's, same head
    await redis_client.set(KEY, other.replace(b'"n":1', b'"n":"stale"'))
    with sql_statements(cached) as seen:
        assert await cached.aget_state_cache(cfg()) == {"n": 1}  # the database's
    assert seen != []
    with sql_statements(cached) as seen:  # refilled by this master: a hit
        assert await cached.aget_state_cache(cfg()) == {"n": 1}
    assert seen == []


async def test_an_entry_that_names_no_master_is_a_miss(
    cached: CachedCheckpointer, redis_client: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await cached.aput_state(cfg(), {"n": 1})
    life = cfg()
    await cached.aget_state(life)
    legacy = (
        b'{"__checkpoint_version__":1,"__checkpoint_incarnation__":%d,"n":"old"}'
        % (life["_checkpoint_incarnation"])
    )
    await redis_client.set(KEY, legacy)  # as the release before this one wrote it
    with caplog.at_level(logging.WARNING, logger="tenxstore"):
        assert await cached.aget_state_cache(cfg()) == {"n": 1}
    assert not caplog.records  # an entry, not garbage: dropped without a warning
    assert (await redis_client.get(KEY) or b"").startswith(b"m:")  # refilled, named


async def test_a_put_prepared_under_another_master_fences(
    cached: CachedCheckpointer, redis_client: Redis
) -> None:
    await cached.aput_state(cfg(), {"n": 1})
    assert cached._redis is not None
    cached._redis.masters[""] = "f" * 40  # what it knew before a failover
    config = cfg()
    await cached.aput_state(config, {"n": 2})
    raw = await redis_client.get(KEY)
    assert raw == b'{"__checkpoint_fence__":[%d,2]}' % config["_checkpoint_incarnation"]
    assert cached._redis.masters[""] != "f" * 40  # the put's answer named this master
    with sql_statements(cached) as seen:
        assert await cached.aget_state_cache(cfg()) == {"n": 2}
    assert seen != []
    await cached.aput_state(cfg(), {"n": 3})  # a put under the master it knows lands
    with sql_statements(cached) as seen:
        assert await cached.aget_state_cache(cfg()) == {"n": 3}
    assert seen == []


async def test_a_replica_answers_readonly_and_the_cache_fails_open(tmp_path: Path) -> None:
    for name in ("master", "replica"):
        (tmp_path / name).mkdir()
    master = services.RedisServer(tmp_path / "master")
    master.start()
    follows = ("--replicaof", "127.0.0.1", str(master.port))
    replica = services.RedisServer(tmp_path / "replica", args=follows)
    replica.start()
    try:
        poll(lambda: _linked(replica.port), "the replica following the master")
        repo = CheckpointRepository(f"sqlite:///{tmp_path / 'r.db'}")
        cp = CachedCheckpointer(repo, redis_url=f"redis://127.0.0.1:{replica.port}/0")
        try:
            await cp.asetup()
            await cp.aput_state(cfg(), {"n": 1})
            assert await cp.aget_state_cache(cfg()) == {"n": 1}  # the database's
            health = await cp.acheck()
            assert cp._redis is not None
            assert "replica (READONLY)" in (cp._redis.status().last_error or "")
            assert health.cache_down_for > 0
        finally:
            await cp.aclose()
    finally:
        replica.kill()
        master.kill()


def _linked(port: int) -> bool:
    import redis

    with redis.Redis(port=port, socket_timeout=2) as node:
        return bool(node.info("replication")["master_link_status"] == "up")


async def test_an_entry_older_than_the_run_recorded_is_a_miss_and_refilled(
    cached: CachedCheckpointer, redis_client: Redis
) -> None:
    """An invalidation lost in a failover's window leaves an older entry: the run that
    wrote the newer version never reads it, and its read repairs the entry."""
    mine = cfg()
    await cached.aput_state(mine, {"n": 1})
    older = await redis_client.get(KEY)
    await cached.aput_state(mine, {"n": 2})
    assert older is not None
    await redis_client.set(KEY, older)  # the entry of version 1, as a lost fence leaves it
    with sql_statements(cached) as seen:
        assert await cached.aget_state_cache(mine) == {"n": 2}  # the database's
    assert seen != []
    with sql_statements(cached) as seen:  # refilled with version 2: a hit for anyone
        assert await cached.aget_state_cache(cfg()) == {"n": 2}
    assert seen == []


async def test_a_client_that_decodes_responses_is_refused(tmp_path: Path, redis_url: str) -> None:
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'd.db'}")
    decoding = Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigError, match="decode_responses"):
            CachedCheckpointer(repo, redis=decoding)
        with pytest.raises(ConfigError, match="decode_responses"):
            CachedCheckpointer(repo, redis_url=redis_url, redis_options={"decode_responses": True})
    finally:
        await decoding.aclose()


async def test_a_user_the_acl_denies_info_is_reported(
    tmp_path: Path, redis_url: str, redis_client: Redis
) -> None:
    """The cache's scripts read INFO: ``acheck`` runs one, so a user without ``+info``
    is a problem it names, not a healthy cache that always misses."""
    user = f"tenxstore-noinfo-{uuid.uuid4().hex[:8]}"
    await redis_client.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "+@all", "-info")
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'a.db'}")
    await repo.asetup()
    url = redis_url.replace("redis://", f"redis://{user}:pw@", 1)
    cp = CachedCheckpointer(repo, redis_url=url, key_prefix="acltest")
    try:
        health = await cp.acheck()
        assert health.cache_error is not None and "info" in health.cache_error.lower()
        assert not health.ok
    finally:
        await cp.aclose()
        await redis_client.execute_command("ACL", "DELUSER", user)
