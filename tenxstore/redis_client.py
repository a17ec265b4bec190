"""The Redis client: made from the caller's argument, bounded, described and diagnosed.

One of ``redis=``, ``redis_url=``, ``redis_pool=`` or ``sentinels=`` gives the client
(:func:`make_client`); a client made from a URL or from sentinels (redis-py's
``Sentinel(...).master_for(service)``) fails fast (no retries: the database answers
instead) and is bounded as a whole by :func:`within`, never by socket timeouts of its
own. :func:`problem` names what an operator should check after a
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
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ConnectionError,
    ReadOnlyError,
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
    *,
    sentinels: Any = None,
    sentinel_service: Any = None,
    sentinel_options: Any = None,
) -> tuple[Any, Callable[[], Any] | None, bool]:
    """(client, a maker of another for a second loop or None, whether we own it)."""
    given = [x for x in (redis, redis_url, redis_pool, sentinels) if x is not None]
    if len(given) != 1:
        raise ConfigError("pass exactly one of redis=, redis_url=, redis_pool= or sentinels=")
    if options is not None and (redis_url is None or not isinstance(options, dict)):
        raise ConfigError("redis_options is a dict, for the client created from redis_url")
    if sentinels is not None or sentinel_service is not None or sentinel_options is not None:
        if sentinels is None:
            raise ConfigError("sentinel_service= and sentinel_options= go with sentinels=")
        watched = _sentinel_maker(sentinels, sentinel_service, sentinel_options)
        try:
            return watched(), watched, True
        except (ValueError, TypeError) as exc:  # an option redis-py does not take
            raise ConfigError(f"sentinel_options: {masked_url(exc)}") from None
    if redis is not None:
        return _of_bytes(redis), None, False
    if redis_pool is not None:
        if not isinstance(redis_pool, ConnectionPool):
            raise ConfigError("redis_pool must be a redis.asyncio.ConnectionPool")
        # the pool stays the caller's
        return _of_bytes(Redis(connection_pool=redis_pool)), None, False
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
        client = _of_bytes(make())
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # a URL redis-py cannot read, a bad option
        raise ConfigError(
            f"not a Redis URL: {masked_url(redis_url)!r} ({masked_url(exc)})"
        ) from None
    return client, make, True


def _of_bytes(client: Any) -> Any:
    """``client``, checked to answer bytes: the cache reads entries as bytes, and a
    client that decodes them (``decode_responses=True``) would turn every read into a
    miss and every put into a fence, silently."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None and hasattr(client, "get_connection_kwargs"):  # RedisCluster
        kwargs = client.get_connection_kwargs()
    if isinstance(kwargs, dict) and kwargs.get("decode_responses"):
        raise ConfigError(
            "the Redis client decodes responses (decode_responses=True): the cache needs "
            "one that answers bytes; make another client without it for tenxstore"
        )
    return client


def _sentinel_nodes(sentinels: Any) -> list[tuple[str, int]]:
    """The sentinels as redis-py takes them, checked: (host, port) pairs."""
    if isinstance(sentinels, (str, bytes)) or not isinstance(sentinels, (list, tuple)):
        raise ConfigError("sentinels must be a list of (host, port) pairs")
    nodes = []
    for node in sentinels:
        if not (isinstance(node, (list, tuple)) and len(node) == 2):
            raise ConfigError(f"sentinels must be (host, port) pairs, not {node!r}")
        host, port = node
        if not isinstance(host, str) or not host:
            raise ConfigError(f"a sentinel's host must be a non-empty str, not {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ConfigError(f"a sentinel's port must be an int from 1 to 65535, not {port!r}")
        nodes.append((host, port))
    if not nodes:
        raise ConfigError("sentinels must name at least one sentinel")
    return nodes


def _sentinel_maker(sentinels: Any, service: Any, options: Any) -> Callable[[], Redis]:
    """A maker of clients of ``service``'s master, found through ``sentinels``."""
    nodes = _sentinel_nodes(sentinels)
    if not isinstance(service, str) or not service:
        raise ConfigError(
            "sentinels= needs sentinel_service=, the name the sentinels know the master "
            f"by (a non-empty str such as 'mymaster'), not {service!r}"
        )
    if options is not None and not isinstance(options, dict):
        raise ConfigError("sentinel_options is a dict of redis-py Sentinel(...) keywords")

    def make() -> Redis:
        # As for a URL: no retries. redis-py's Sentinel asks the sentinels for the
        # master at each new connection, and drops a connection whose server answers
        # READONLY (a demoted master): the next call asks again. Its own clients of the
        # sentinels retry nothing either (redis-py's default when sentinel_kwargs names
        # no retry). Keywords other than Sentinel's own go to the master's connections.
        settings: dict[str, Any] = {"retry": Retry(NoBackoff(), 0), **(options or {})}
        client: Redis = Sentinel(nodes, **settings).master_for(service)
        # a keyword it does not take fails here, not at the first call (no I/O)
        client.connection_pool.make_connection()  # type: ignore[no-untyped-call]  # redis-py
        return client

    return make


def replace_client(client: Any, make: Callable[[], Any]) -> Any:
    """A new client in place of one whose loop closed without closing it: its
    connections (and those of its sentinels) are ended (best effort) and forgotten,
    never reused."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        manager = getattr(pool, "sentinel_manager", None)
        for sentinel in [] if manager is None else manager.sentinels:
            _forget(sentinel.connection_pool)
        _forget(pool)
    return make()


def _forget(pool: Any) -> None:
    conns = [*pool._get_free_connections(), *pool._get_in_use_connections()]
    writers = (getattr(conn, "_writer", None) for conn in conns)
    shut_down(None if w is None else w.transport for w in writers)
    pool.reset()


async def close_client(client: Any) -> None:
    """Close a client (and the clients of its sentinels), best effort (a failure is
    logged at debug)."""
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for closing in (client, manager):
        try:
            if closing is not None:
                await closing.aclose()
        except Exception as exc:  # closing is best effort too
            log.debug("closing a redis client failed: %r", exc)


def describe(client: Any, cluster: bool) -> str:
    """The Redis server(s), without a password, for messages."""
    if cluster:
        nodes = client.get_nodes() if hasattr(client, "get_nodes") else []
        return "redis cluster " + ", ".join(f"{n.host}:{n.port}" for n in nodes)
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        watchers = ", ".join(
            f"{s.connection_pool.connection_kwargs.get('host', '?')}:"
            f"{s.connection_pool.connection_kwargs.get('port', '?')}"
            for s in pool.sentinel_manager.sentinels
        )
        found = pool.master_address
        at = "" if found is None else f", master at {found[0]}:{found[1]}"
        db = pool.connection_kwargs.get("db", 0)
        return f"redis sentinel service {pool.service_name!r} via {watchers}{at}, db {db}"
    kwargs = pool.connection_kwargs
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
        return (
            "the Redis user may not run these commands (GET, GETRANGE, SET, DEL, EVALSHA, "
            "SCRIPT LOAD, and INFO from a script: grant +info)"
        )
    if isinstance(exc, MasterNotFoundError):
        return f"no sentinel named a master ({exc}): are the sentinels up, and is the name right?"
    if isinstance(exc, ReadOnlyError):
        return "Redis answered as a replica (READONLY): the cache needs the master"
    if isinstance(exc, ResponseError) and (
        "NOPERM" in str(exc) or "can't run this command" in str(exc)
    ):
        return (
            f"the Redis user may not run a command the cache needs ({exc}): grant it GET, "
            "GETRANGE, SET, DEL, EVALSHA, SCRIPT LOAD and INFO (which its scripts call)"
        )
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
