"""Where the test services are, and the rule for when they are missing.

A service that was asked for — its URL set in the environment, or ``CI=true`` —
and is unreachable FAILS the tests. One nobody asked for falls back to a
testcontainers container when Docker is available, and otherwise skips, saying why.
"""

from __future__ import annotations

import functools
import os
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 2
        ):
            return True
    except OSError:
        return False


def _asked(env: str) -> bool:
    return bool(os.environ.get(env)) or os.environ.get("CI", "").lower() == "true"


def _docker_available() -> bool:
    try:
        import docker  # type: ignore[import-not-found]  # testcontainers' dependency

        docker.from_env().ping()
        return True
    except Exception:
        return False


def _service(env: str, default: str, port: int, name: str, container: Any) -> str:
    url = os.environ.get(env, default)
    if _reachable(url, port):
        return url
    if _asked(env):
        pytest.fail(f"{name} was asked for at {url} and is unreachable", pytrace=False)
    if _docker_available():
        return str(container())
    pytest.skip(f"no {name} at {url} and no Docker; set {env}")


def _pg_container() -> str:
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]

    return str(PostgresContainer("postgres:16", driver=None).start().get_connection_url())


def _redis_container() -> str:
    from testcontainers.redis import RedisContainer  # type: ignore[import-not-found]

    started = RedisContainer("redis:7").start()
    return f"redis://{started.get_container_host_ip()}:{started.get_exposed_port(6379)}/0"


@functools.cache
def pg_url() -> str:
    """The PostgreSQL URL for this test run (fails or skips by the rule above)."""
    return _service("TENXSTORE_TEST_PG_URL", DEFAULT_PG_URL, 5432, "PostgreSQL", _pg_container)


@functools.cache
def redis_url() -> str:
    """The Redis URL for this test run (fails or skips by the rule above)."""
    return _service("TENXSTORE_TEST_REDIS_URL", DEFAULT_REDIS_URL, 6379, "Redis", _redis_container)
