"""Where the test services are, and the rule for when they are missing.

A service that was asked for — its URL set in the environment, or ``CI=true`` —
and is unreachable FAILS the tests. One nobody asked for falls back to a
testcontainers container when Docker is available, and otherwise skips, saying why.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import functools
import importlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests import servers
from tests.servers import free_port, wait_for_port

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MYSQL_URL = "mysql+asyncmy://root@127.0.0.1:3306/test"


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


def worker() -> str | None:
    """This process's pytest-xdist worker id (``gw0``, ``gw1``...), or None."""
    return os.environ.get("PYTEST_XDIST_WORKER") or None


def _worker_database(url: str, create: Any) -> str:
    """``url`` with this xdist worker's own database (``<database>_<worker>``, made by
    ``create(url, name)`` when missing), so that workers never share a server-wide view
    (``pg_stat_activity``, lock waits), a fixed schema name of a docs sample, or a
    pool. Without xdist: ``url`` itself."""
    name = worker()
    if name is None:
        return url
    parts = urlsplit(url)
    database = f"{(parts.path or '/test').lstrip('/') or 'test'}_{name}"
    create(url, database)
    return parts._replace(path=f"/{database}").geturl()


def _create_pg_database(url: str, database: str) -> None:
    import asyncio

    import asyncpg

    async def create() -> None:
        conn = await asyncpg.connect(url)
        try:
            if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database):
                with contextlib.suppress(asyncpg.DuplicateDatabaseError):  # made meanwhile
                    await conn.execute(f'CREATE DATABASE "{database}"')
        finally:
            await conn.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # whether or not a loop runs here
        pool.submit(asyncio.run, create()).result()


@functools.cache
def pg_url() -> str:
    """The PostgreSQL URL for this test run (fails or skips by the rule above): under
    pytest-xdist, a database of this worker's own on that server."""
    url = _service("TENXSTORE_TEST_PG_URL", DEFAULT_PG_URL, 5432, "PostgreSQL", _pg_container)
    return _worker_database(url, _create_pg_database)


def _mysql_container() -> str:
    from testcontainers.mysql import MySqlContainer  # type: ignore[import-not-found]

    started = MySqlContainer("mariadb:10.11", dialect="asyncmy").start()
    return str(started.get_connection_url())


@functools.cache
def mysql_url() -> str:
    """The MariaDB (or MySQL) URL for this test run (fails or skips by the rule above)."""
    return _service(
        "TENXSTORE_TEST_MYSQL_URL", DEFAULT_MYSQL_URL, 3306, "MariaDB", _mysql_container
    )


@functools.cache
@functools.cache
def redis_url() -> str:
    """The Redis URL for this test run (fails or skips by the rule above): under
    pytest-xdist, a database of this worker's own on that server (see redis_db)."""
    url = _service("TENXSTORE_TEST_REDIS_URL", DEFAULT_REDIS_URL, 6379, "Redis", _redis_container)
    name = worker()
    if name is None:
        return url
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    # Two runs may share the server on neighbouring databases (CI: 0 and 1), so a
    # worker's database steps by two: gw0 of a run on 0 gets 2, of a run on 1 gets 3...
    database = base + 2 * (int(name.removeprefix("gw")) + 1)
    mine = parts._replace(path=f"/{database}").geturl()
    import redis

    client = redis.Redis.from_url(mine)
    try:
        client.ping()
    except redis.ResponseError as error:  # "DB index is out of range"
        raise RuntimeError(
            f"xdist worker {name} needs Redis database {database} of {url!r} ({error}): "
            "run fewer workers, or give the server more databases"
        ) from error
    finally:
        client.close()
    return mine


def redis_db() -> int:
    """The Redis database index of this run's (and worker's) URL: for a URL of another
    port that reaches the same server (a proxy) on the same database."""
    return int(urlsplit(redis_url()).path.strip("/") or 0)


def _required(what: str) -> None:
    """A tool the tests need: fail under CI (where .ci/run installs it), skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is required in CI (.ci/run installs it)", pytrace=False)
    pytest.skip(f"{what} is not installed")


def require_path(what: str, path: str | Path) -> None:
    """A file the tests need (a server binary): fail under CI, skip elsewhere."""
    if not Path(path).exists():
        _required(f"{what} ({path})")


def require_modules(extra: str, *modules: str) -> None:
    """Modules of an optional extra that a test needs: fail under CI (where .ci/run
    installs the extra), skip elsewhere, naming the extra that brings them."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        _required(f"the {extra} extra ({', '.join(missing)}: pip install -e '.[{extra}]')")


@functools.cache
def pgbouncer_url() -> str:
    """A PgBouncer in transaction-pooling mode in front of the test PostgreSQL."""
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if binary is None:
        _required("pgbouncer")
    target = urlsplit(pg_url())
    directory = Path(tempfile.mkdtemp(prefix="tenxstore-pgbouncer-"))
    directory.chmod(0o755)
    port = free_port()
    user = target.username or "postgres"
    (directory / "userlist.txt").write_text(f'"{user}" ""\n')
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={target.hostname or '127.0.0.1'} port={target.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {directory / 'userlist.txt'}\n"
        "pool_mode = transaction\nmax_client_conn = 1000\ndefault_pool_size = 20\n"
        # idle server connections go soon: every test worker runs a PgBouncer of its own
        "server_idle_timeout = 10\n"
        f"logfile = {directory / 'pgbouncer.log'}\npidfile = {directory / 'pgbouncer.pid'}\n"
    )
    for f in directory.iterdir():
        f.chmod(0o644)
    command = [binary, str(directory / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        command[1:1] = ["-u", "postgres"]
        shutil.chown(directory, "postgres")  # its log and pid file
    # Its log goes to the logfile; stderr (a copy of it) to nowhere: a pipe nobody
    # reads fills after ~250 logins and PgBouncer then blocks on it, answering no one.
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(process.kill)
    wait_for_port(port, process, "pgbouncer")
    return f"postgresql://{user}@127.0.0.1:{port}{target.path or '/test'}"


class RedisCluster:
    """Three redis-server masters on loopback ports, joined into one cluster."""

    def __init__(self, masters: int = 3) -> None:
        self.binary = shutil.which("redis-server")
        self.cli = shutil.which("redis-cli")
        if self.binary is None or self.cli is None:
            _required("redis-server and redis-cli")
        self.directory = Path(tempfile.mkdtemp(prefix="tenxstore-cluster-"))
        self.ports = self.free_ports(masters)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        for port in self.ports:
            self.start_node(port)
        subprocess.run(
            [
                str(self.cli),
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = subprocess.run(
                [str(self.cli), "-p", str(self.ports[0]), "cluster", "info"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            if "cluster_state:ok" in info:
                return
            time.sleep(0.05)  # waiting for the cluster to agree on its slots
        raise RuntimeError("the Redis cluster did not become ready")

    @staticmethod
    def free_ports(count: int) -> list[int]:
        """Ports whose cluster bus port (port + 10000) is free and valid too."""
        rng, ports = random.Random(), []
        while len(ports) < count:
            port = rng.randrange(20000, 30000)
            if port in ports:
                continue
            try:
                for p in (port, port + 10000):
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", p))
            except OSError:
                continue
            ports.append(port)
        return ports

    def start_node(self, port: int) -> None:
        node = self.directory / str(port)
        node.mkdir(exist_ok=True)
        process = subprocess.Popen(
            [
                str(self.binary),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(node / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(node),
            ],
            stdout=subprocess.DEVNULL,
        )
        self.processes[port] = process
        atexit.register(process.kill)
        wait_for_port(port, process, "redis-server")

    def kill(self, port: int) -> None:
        self.processes[port].kill()
        self.processes[port].wait(10)

    def close(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


class RedisServer(servers.RedisServer):
    """A redis-server owned by a test; a missing binary follows the rule above."""

    def start(self) -> None:
        if shutil.which("redis-server") is None:
            _required("redis-server")
        super().start()
