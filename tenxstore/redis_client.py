"""The Redis client: made from the caller's argument, bounded, described and diagnosed.

One of ``redis=``, ``redis_url=`` or ``redis_pool=`` gives the client
(:func:`make_client`); a client made from a URL fails fast (no retries: the database
answers instead) and is bounded as a whole by :func:`within`, never by socket
timeouts of its own. :func:`problem` names what an operator should check after a
failure; :func:`describe` names the server(s) without a password.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ConnectionError,
    ResponseError,
)

from .backends.driver import causes
from .errors import ConfigError
from .loops import shut_down
from .validate import masked_url

__all__ = ["close_client", "describe", "make_client", "problem", "replace_client", "within"]

log = logging.getLogger("tenxstore.redis_cache")  # the cache's log lines keep their logger


def make_client(
    redis: Any,
    redis_url: str | None,
    redis_pool: Any,
    timeout: float,
    options: dict[str, Any] | None,
) -> tuple[Any, Callable[[], Any] | None, bool]:
    """(client, a maker of another for a second loop or None, whether we own it)."""
    given = [x for x in (redis, redis_url, redis_pool) if x is not None]
    if len(given) != 1:
        raise ConfigError("pass exactly one of redis=, redis_url= or redis_pool=")
    if options is not None and (redis_url is None or not isinstance(options, dict)):
        raise ConfigError("redis_options is a dict, for the client created from redis_url")
    if redis is not None:
        return redis, None, False
    if redis_pool is not None:
        if not isinstance(redis_pool, ConnectionPool):
            raise ConfigError("redis_pool must be a redis.asyncio.ConnectionPool")
        return Redis(connection_pool=redis_pool), None, False  # the pool stays the caller's
    if not isinstance(redis_url, str):
        raise ConfigError(f"redis_url must be a str, not {type(redis_url).__name__}")

    def make() -> Redis:
        # redis-py's retries with back-off suit a database, not a best-effort cache:
        # fail fast and let the database answer. Every call is bounded as a whole by
        # RedisCache (connecting included), so the client sets no socket timeouts of
        # its own (each would wrap every read in one more timer).
        defaults: dict[str, Any] = {"retry": Retry(NoBackoff(), 0)}
        return Redis.from_url(redis_url, **{**defaults, **(options or {})})

    try:
        client = make()
    except (ValueError, TypeError) as exc:  # a URL redis-py cannot read, a bad option
        raise ConfigError(
            f"not a Redis URL: {masked_url(redis_url)!r} ({masked_url(exc)})"
        ) from None
    return client, make, True


def replace_client(client: Any, make: Callable[[], Any]) -> Any:
    """A new client in place of one whose loop closed without closing it: its
    connections are ended (best effort) and forgotten, never reused."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        conns = [*pool._get_free_connections(), *pool._get_in_use_connections()]
        writers = (getattr(conn, "_writer", None) for conn in conns)
        shut_down(None if w is None else w.transport for w in writers)
        pool.reset()
    return make()


async def close_client(client: Any) -> None:
    """Close a client, best effort (a failure is logged at debug)."""
    try:
        await client.aclose()
    except Exception as exc:  # closing is best effort too
        log.debug("closing a redis client failed: %r", exc)


def describe(client: Any, cluster: bool) -> str:
    """The Redis server(s), without a password, for messages."""
    if cluster:
        nodes = client.get_nodes() if hasattr(client, "get_nodes") else []
        return "redis cluster " + ", ".join(f"{n.host}:{n.port}" for n in nodes)
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


async def within(work: Awaitable[Any], seconds: float) -> Any:
    """``work``, bounded: in the calling task where asyncio allows it (3.11), which
    spares a task per call."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await work
    return await asyncio.wait_for(work, seconds)  # pragma: no cover - Python 3.10


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    return any(isinstance(seen, kind) for seen in causes(exc))


def problem(exc: BaseException) -> str:
    """What an operator should check, by the class of a Redis failure."""
    if isinstance(exc, AuthenticationError):
        return "Redis refused the credentials: check the password (or user) in the Redis URL"
    if isinstance(exc, AuthorizationError):
        return "the Redis user may not run these commands (GET, SET, EVALSHA, DEL)"
    if isinstance(exc, ResponseError):
        return f"Redis refused a command ({exc}); a wrong database index or a server setting"
    if _caused_by(exc, ssl.SSLError):
        return "the TLS handshake with Redis failed: use rediss:// only if Redis serves TLS"
    if isinstance(exc, (ConnectionError, OSError)):
        detail = str(exc) or type(exc).__name__
        return f"Redis is unreachable ({detail}); is it running, and does it need TLS (rediss://)?"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "Redis did not answer in time"
    return f"Redis failed unexpectedly: {type(exc).__name__}: {exc}"
