"""Ready-made checkpointers with the names and arguments of the product documents.

Each preset is a :class:`CachedCheckpointer` around a :class:`CheckpointRepository`
(``.inner``); without Redis it passes every call straight through.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine

from .backends import PoolMode, async_url
from .backends.asyncpg_pool import engine_from_asyncpg_pool
from .backends.pgoptions import several_hosts
from .cache import DEFAULT_KEY_PREFIX, CachedCheckpointer
from .crypto import KeyRing
from .errors import ConfigError
from .repository import CheckpointRepository
from .validate import IdType, masked_url

__all__ = ["InMemoryCheckpointer", "PgCheckpointer", "SqliteCheckpointer"]


class _OptionalCache(CachedCheckpointer):
    @classmethod
    def _requires_redis(cls) -> bool:
        return False


def _pg_target(
    postgres_dsn: str | None,
    pg_pool: Any,
    pool_config: dict[str, Any] | None,
    redis_sides: tuple[Any, ...],
    redis_pool_config: dict[str, Any] | None = None,
) -> Any:
    """What PgCheckpointer's repository opens (the DSN, or an engine on the pool),
    once its PostgreSQL side and the presence of a Redis side are checked."""
    if (postgres_dsn is None) == (pg_pool is None):
        raise ConfigError("PgCheckpointer needs exactly one of postgres_dsn= or pg_pool=")
    if all(side is None for side in redis_sides):
        raise ConfigError(
            "PgCheckpointer needs one of redis_url=, redis=, redis_pool= or sentinels="
        )
    if redis_pool_config and redis_sides[0] is None:
        raise ConfigError("redis_pool_config applies only to a client created from redis_url")
    if pg_pool is not None and pool_config:
        raise ConfigError("pool_config applies only to a pool created from postgres_dsn")
    target: Any = postgres_dsn
    if postgres_dsn is not None:
        if not isinstance(postgres_dsn, str):
            raise ConfigError(f"postgres_dsn must be a str, not {type(postgres_dsn).__name__}")
        try:
            backend = make_url(several_hosts(postgres_dsn)).get_backend_name()
        except (ArgumentError, ValueError):  # ValueError: a port that is not a number
            raise ConfigError(f"not a database URL: {masked_url(postgres_dsn)!r}") from None
        if backend not in ("postgresql", "postgres"):
            raise ConfigError(
                "postgres_dsn must be a PostgreSQL URL (postgresql://user@host/db); "
                "for SQLite use SqliteCheckpointer(path)"
            )
    if pg_pool is not None:
        target = pg_pool if isinstance(pg_pool, AsyncEngine) else engine_from_asyncpg_pool(pg_pool)
    return target


class PgCheckpointer(CachedCheckpointer):
    """PostgreSQL for durable history, Redis as the hot cache: the production setup.

    Args:
        postgres_dsn: A PostgreSQL DSN (``postgresql://`` works; asyncpg is chosen).
        pg_pool: Instead of a DSN: an ``AsyncEngine`` or an asyncpg ``Pool``
            (connections are borrowed per transaction and returned). Stays the caller's.
        redis_url: A Redis URL; or ``redis``, a client (``Redis`` or ``RedisCluster``);
            or ``redis_pool``, a ``redis.asyncio.ConnectionPool``. Exactly one.
        pool_config: ``create_async_engine`` options for the pool created from the DSN.
        redis_pool_config: Options for the Redis client created from ``redis_url``.
        schema: PostgreSQL schema of the tables.
        cache_ttl: Redis TTL in seconds (``None``: no expiry).
        state_history_limit: State versions retained per thread.
        enforce_user_isolation: Scope every call to ``config["user_id"]``.
        user_id_type: ``"string"``, ``"int"`` or ``"bigint"``.
        id_type: Likewise for ``thread_id``.
        tool_lease_seconds: Lease of a tool-call claim.
        key_prefix: First segment of every cache key (by default ``state_cache`` and
            the store's id; a prefix you pass is used verbatim).
        lock_timeout: Seconds a write waits for a thread's lock (``LockTimeout``).
        pool_mode: ``"transaction"`` behind a transaction-pooling PgBouncer.
        keys: The key ring that seals every payload and cache entry (``None``: read
            ``TENXSTORE_KEYS``; unset, stored in clear). See docs/encryption.md.
        redis_timeout: Bound on every Redis call, in seconds (past it the call fails
            open to the database; see ``CachedCheckpointer``).
        replica_urls: PostgreSQL standbys that serve the reads that tolerate lag, and
            ``max_replica_lag`` their bound in seconds (see ``CheckpointRepository``;
            also ``?replica=host[:port]`` in the DSN).
        sentinels: Instead of the Redis arguments above: Redis behind Sentinel, as
            ``[(host, port), ...]`` of the sentinels (see ``CachedCheckpointer``).
        sentinel_service: The name the sentinels know the master by (``"mymaster"``).
        sentinel_options: Keywords of redis-py's ``Sentinel`` (``password=`` for the
            master, ``sentinel_kwargs={"password": ...}`` for the sentinels...).

    Raises:
        ValueError: The PostgreSQL side or the Redis side is missing, or an argument
            is invalid.
    """

    def __init__(  # noqa: PLR0913 (a repository's settings and a cache's, keyword-only)
        self,
        postgres_dsn: str | None = None,
        pg_pool: Any = None,
        redis_url: str | None = None,
        redis: Any = None,
        redis_pool: Any = None,
        pool_config: dict[str, Any] | None = None,
        redis_pool_config: dict[str, Any] | None = None,
        schema: str | None = "public",
        cache_ttl: float | None = 86400,
        state_history_limit: int = 20,
        enforce_user_isolation: bool = True,
        user_id_type: IdType = "string",
        id_type: IdType = "string",
        *,
        tool_lease_seconds: float = 900,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        lock_timeout: float | None = 30.0,
        pool_mode: PoolMode = "session",
        keys: KeyRing | None = None,
        redis_timeout: float = 0.25,
        replica_urls: Sequence[str] | None = None,
        max_replica_lag: float | None = None,
        sentinels: list[tuple[str, int]] | None = None,
        sentinel_service: str | None = None,
        sentinel_options: dict[str, Any] | None = None,
    ) -> None:
        sides = (redis_url, redis, redis_pool, sentinels)
        target = _pg_target(postgres_dsn, pg_pool, pool_config, sides, redis_pool_config)
        repository = CheckpointRepository(
            target,
            schema=schema,
            state_history_limit=state_history_limit,
            enforce_user_isolation=enforce_user_isolation,
            id_type=id_type,
            user_id_type=user_id_type,
            engine_options=pool_config,
            tool_lease_seconds=tool_lease_seconds,
            lock_timeout=lock_timeout,
            pool_mode=pool_mode,
            keys=keys,
            replica_urls=replica_urls,
            max_replica_lag=max_replica_lag,
        )
        super().__init__(
            repository,
            redis=redis,
            redis_url=redis_url,
            redis_pool=redis_pool,
            cache_ttl=cache_ttl,
            key_prefix=key_prefix,
            redis_options=redis_pool_config or None,
            redis_timeout=redis_timeout,
            sentinels=sentinels,
            sentinel_service=sentinel_service,
            sentinel_options=sentinel_options,
        )


class SqliteCheckpointer(_OptionalCache):
    """Durable state and messages in one SQLite file, for single-machine agents.

    Args:
        path: The database file (created when absent), or a ``sqlite:///`` URL.
        state_history_limit: State versions retained per thread.
        enforce_user_isolation: Scope every call to ``config["user_id"]``.
        redis_url: Optional Redis cache URL; or ``redis``, a client.
        cache_ttl: Redis TTL in seconds (``None``: no expiry).
        tool_lease_seconds: Lease of a tool-call claim.
        key_prefix: First segment of every cache key (by default ``state_cache`` and
            the store's id; a prefix you pass is used verbatim).
        lock_timeout: Seconds a writer waits for the database's write lock.
        keys: The key ring that seals every payload (see ``CheckpointRepository``).
        redis_timeout: Bound on every Redis call, in seconds, with a cache (past it
            the call fails open to the database; see ``CachedCheckpointer``).
        sentinels: Instead of ``redis_url``/``redis``: a Redis cache behind Sentinel,
            as ``[(host, port), ...]`` of the sentinels (see ``CachedCheckpointer``).
        sentinel_service: The name the sentinels know the master by (``"mymaster"``).
        sentinel_options: Keywords of redis-py's ``Sentinel`` (``password=`` for the
            master, ``sentinel_kwargs={"password": ...}`` for the sentinels...).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        state_history_limit: int = 20,
        enforce_user_isolation: bool = True,
        redis_url: str | None = None,
        redis: Any = None,
        cache_ttl: float | None = 86400,
        tool_lease_seconds: float = 900,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        lock_timeout: float | None = 30.0,
        keys: KeyRing | None = None,
        redis_timeout: float = 0.25,
        sentinels: list[tuple[str, int]] | None = None,
        sentinel_service: str | None = None,
        sentinel_options: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ConfigError(f"path must be a file path or a sqlite:/// URL, not {path!r}")
        url = os.fspath(path)
        if url.startswith("sqlite:") or url.startswith("sqlite+"):
            if async_url(url).database in (None, "", ":memory:"):
                raise ConfigError("SqliteCheckpointer needs a file; use InMemoryCheckpointer")
        elif "://" in url:
            raise ConfigError(
                f"path must be a file path or a sqlite:/// URL, not {masked_url(url)!r}"
            )
        else:
            url = f"sqlite+aiosqlite:///{url}"
        repository = CheckpointRepository(
            url,
            state_history_limit=state_history_limit,
            enforce_user_isolation=enforce_user_isolation,
            tool_lease_seconds=tool_lease_seconds,
            lock_timeout=lock_timeout,
            keys=keys,
        )
        super().__init__(
            repository,
            redis=redis,
            redis_url=redis_url,
            cache_ttl=cache_ttl,
            key_prefix=key_prefix,
            redis_timeout=redis_timeout,
            sentinels=sentinels,
            sentinel_service=sentinel_service,
            sentinel_options=sentinel_options,
        )


class InMemoryCheckpointer(_OptionalCache):
    """State in process memory (an in-memory SQLite database), for tests and development.

    Not durable: everything is lost when the process ends, and nothing is shared with
    other processes or other instances. The schema is created on first use.
    ``keys`` seals payloads as ``CheckpointRepository`` does (useful to test with).
    """

    def __init__(
        self,
        *,
        state_history_limit: int = 20,
        enforce_user_isolation: bool = True,
        tool_lease_seconds: float = 900,
        keys: KeyRing | None = None,
    ) -> None:
        repository = CheckpointRepository(
            "sqlite+aiosqlite://",
            state_history_limit=state_history_limit,
            enforce_user_isolation=enforce_user_isolation,
            tool_lease_seconds=tool_lease_seconds,
            keys=keys,
        )
        super().__init__(repository)
