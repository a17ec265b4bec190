"""``sentinels=`` on the cache and the presets: checked before any I/O, described
without a password, and closed with the clients of its sentinels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.sentinel import SentinelConnectionPool

from tenxstore import (
    CachedCheckpointer,
    CheckpointRepository,
    ConfigError,
    PgCheckpointer,
    SqliteCheckpointer,
)

NODES = [("127.0.0.1", 1), ("sentinel-b", 26379)]  # nothing listens: no I/O happens


@pytest.fixture
def repo(tmp_path: Path) -> CheckpointRepository:
    return CheckpointRepository(f"sqlite:///{tmp_path / 's.db'}")


def test_the_client_is_sentinels_master_without_retries(repo: CheckpointRepository) -> None:
    cp = CachedCheckpointer(
        repo,
        sentinels=NODES,
        sentinel_service="mymaster",
        sentinel_options={"password": "s3cret", "sentinel_kwargs": {"password": "s3cret2"}},
    )
    pool = cp.redis.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "mymaster"
    assert pool.connection_kwargs["retry"].get_retries() == 0  # fail fast: the database answers
    described = cp._redis.describe()  # type: ignore[union-attr]
    assert "mymaster" in described and "127.0.0.1:1" in described
    assert "sentinel-b:26379" in described and "s3cret" not in described


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"sentinels": NODES, "redis_url": "redis://x"}, "exactly one of"),
        ({"sentinels": NODES}, "sentinel_service"),
        ({"sentinels": NODES, "sentinel_service": ""}, "sentinel_service"),
        ({"sentinels": NODES, "sentinel_service": 5}, "sentinel_service"),
        ({"sentinel_service": "mymaster", "redis_url": "redis://x"}, "go with sentinels"),
        ({"sentinel_options": {}, "redis_url": "redis://x"}, "go with sentinels"),
        ({"sentinels": "127.0.0.1:26379", "sentinel_service": "m"}, "list of"),
        ({"sentinels": [], "sentinel_service": "m"}, "at least one"),
        ({"sentinels": [("h",)], "sentinel_service": "m"}, "pairs"),
        ({"sentinels": [("", 1)], "sentinel_service": "m"}, "host"),
        ({"sentinels": [("h", "26379")], "sentinel_service": "m"}, "port"),
        ({"sentinels": [("h", True)], "sentinel_service": "m"}, "port"),
        ({"sentinels": [("h", 70000)], "sentinel_service": "m"}, "port"),
        ({"sentinels": NODES, "sentinel_service": "m", "sentinel_options": [1]}, "dict"),
        ({"sentinels": NODES, "sentinel_service": "m", "redis_options": {}}, "redis_url"),
        (
            {"sentinels": NODES, "sentinel_service": "m", "sentinel_options": {"nope": 1}},
            "sentinel_options",
        ),
    ],
)
def test_bad_sentinel_arguments_are_config_errors(
    repo: CheckpointRepository, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        CachedCheckpointer(repo, **arguments)


def test_the_presets_take_sentinels(tmp_path: Path) -> None:
    pg = PgCheckpointer(
        "postgresql://postgres@127.0.0.1:1/test", sentinels=NODES, sentinel_service="mymaster"
    )
    assert isinstance(pg.redis.connection_pool, SentinelConnectionPool)
    lite = SqliteCheckpointer(tmp_path / "p.db", sentinels=NODES, sentinel_service="mymaster")
    assert isinstance(lite.redis.connection_pool, SentinelConnectionPool)
    with pytest.raises(ConfigError, match="sentinels="):
        PgCheckpointer("postgresql://postgres@127.0.0.1:1/test")
    with pytest.raises(ConfigError, match="exactly one of"):
        SqliteCheckpointer(tmp_path / "q.db", redis_url="redis://x", sentinels=NODES)


async def test_closing_closes_the_sentinels_clients_too(repo: CheckpointRepository) -> None:
    cp = CachedCheckpointer(repo, sentinels=NODES, sentinel_service="mymaster")
    manager = cp.redis.connection_pool.sentinel_manager
    closed: list[Any] = []
    for watcher in manager.sentinels:
        original = watcher.aclose

        async def aclose(original: Any = original, watcher: Any = watcher) -> None:
            closed.append(watcher)
            await original()

        watcher.aclose = aclose
    await cp.aclose()
    assert closed == manager.sentinels
