"""The cache on a 3-master Redis Cluster: hits, the guard, invalidation, a node killed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from tenxstore import AuthPolicy, CachedCheckpointer, CheckpointRepository, StaleStateError
from tests import services
from tests.cache.conftest import sql_statements
from tests.conftest import cfg


@pytest.fixture(scope="module")
def cluster() -> Iterator[services.RedisCluster]:
    nodes = services.RedisCluster()
    yield nodes
    nodes.close()


def cluster_client(nodes: services.RedisCluster, socket_timeout: float = 0.5) -> RedisCluster:
    return RedisCluster(host="127.0.0.1", port=nodes.ports[0], socket_timeout=socket_timeout)


@pytest.fixture
async def cached(
    cluster: services.RedisCluster, tmp_path: Path
) -> AsyncIterator[CachedCheckpointer]:
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'c.db'}")
    await repo.asetup()
    # A generous bound, on the cache's calls and on the client's socket reads alike:
    # these tests are about the cluster, not about slow Redis (the first call also
    # discovers the cluster's slots, and CI's workers load two cores: a read past
    # 0.5 s made a put fail open and the next read a miss; with two PostgreSQL servers
    # of the failover suite beside it, a put once took longer than 2 s).
    client = cluster_client(cluster, socket_timeout=10.0)
    cp = CachedCheckpointer(
        repo, redis=client, key_prefix=f"cl{tmp_path.name[-6:]}", redis_timeout=10.0
    )
    yield cp
    await cp.aclose()
    await client.aclose()


async def node_holding(cluster: services.RedisCluster, key: str) -> int:
    for port in cluster.ports:
        node = Redis(port=port)
        try:
            if await node.exists(key):
                return port
        except Exception:
            continue
        finally:
            await node.aclose()
    raise AssertionError(f"no node holds {key}")


async def test_hits_spread_over_the_cluster(
    cached: CachedCheckpointer, cluster: services.RedisCluster
) -> None:
    for i in range(24):
        await cached.aput_state(cfg(f"t{i}"), {"i": i})
    holders = {await node_holding(cluster, f"{cached.key_prefix}:t{i}:alice") for i in range(24)}
    assert len(holders) >= 2
    for i in range(24):
        config = cfg(f"t{i}")
        with sql_statements(cached) as seen:
            assert await cached.aget_state_cache(config) == {"i": i}
        assert seen == [] and config["_checkpoint_version"] == 1


async def test_the_guard_and_invalidation(cached: CachedCheckpointer) -> None:
    await cached.aput_state(cfg(), {"v": 1})
    await cached.aput_state(cfg(), {"v": 2})
    assert await cached.aput_state_cache(cfg(), {"v": "old"}, 1) is False
    assert await cached.aput_state_cache(cfg(), {"v": "same"}, 2) is True
    loser = cfg()
    await cached.aget_state_cache(loser)
    await cached.inner.aput_state(cfg(), {"v": 3})  # behind the cache's back
    with pytest.raises(StaleStateError):
        await cached.aput_state(loser, {"v": "lost"})
    assert await cached.aget_state_cache(cfg()) == {"v": 3}  # the entry was dropped
    admin = {"thread_id": "t1", "auth_policy": AuthPolicy(enforce_user_isolation=False)}
    assert await cached.aget_state_cache(dict(admin)) == {"v": 3}
    await cached.aput_state(cfg(), {"v": 4})  # its put and the "*" DEL cross slots
    assert await cached.aget_state_cache(dict(admin)) == {"v": 4}
    assert await cached.aclean_thread(cfg()) is True
    assert await cached.aget_state_cache(cfg()) is None


async def test_fail_open_when_a_node_dies(tmp_path: Path) -> None:
    nodes = services.RedisCluster()
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'c.db'}")
    await repo.asetup()
    client = cluster_client(nodes)
    cp = CachedCheckpointer(repo, redis=client, key_prefix="kill", redis_backoff=0.05)
    try:
        for i in range(12):
            await cp.aput_state(cfg(f"t{i}"), {"n": 1})
        nodes.kill(nodes.ports[1])
        for round_ in range(2, 5):  # every call succeeds, from the database when need be
            for i in range(12):
                config = cfg(f"t{i}")
                assert await cp.aget_state_cache(config) == {"n": round_ - 1}
                assert await cp.aput_state(config, {"n": round_}) == round_
    finally:
        await cp.aclose()
        await client.aclose()
        nodes.close()
