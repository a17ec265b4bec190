"""Shared fixtures: one contract suite, every backend, real services."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, settings

import tenxstore
from tests import pools, services

# Generated examples are checked, not timed: a CI machine busy with other tests is slow
# to generate them, which is no failure of the code under test.
settings.register_profile("tenxstore", suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tenxstore")

SQL_BACKENDS = ["sqlite", "postgresql", "pgbouncer", "mariadb"]
CACHED_BACKENDS = ["sqlite+redis", "postgresql+redis"]
BACKENDS = ["memory", *SQL_BACKENDS, *CACHED_BACKENDS]

# TENXSTORE_TEST_ENCRYPTION: plain (the default) | encrypted | both: whether the
# fixtures below run each backend with payloads in clear, sealed with a key ring, or
# both. The README's command runs them in clear; CI runs the encrypted matrix too, on
# Python 3.10 beside it (.ci/run).
TEST_KEYS = tenxstore.KeyRing([("test-k1", bytes(range(32)))])
_MODES = {"plain": ("",), "encrypted": ("+encrypted",), "both": ("", "+encrypted")}
# Importing mem0 (the Mem0 suites, the docs' Mem0 sample) writes its config under
# ~/.mem0: a directory of this run's instead.
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="tenxstore-mem0-"))
_ENCRYPTION = os.environ.get("TENXSTORE_TEST_ENCRYPTION", "plain").strip() or "plain"
if _ENCRYPTION not in _MODES:
    raise RuntimeError(
        f"TENXSTORE_TEST_ENCRYPTION must be plain, encrypted or both, not {_ENCRYPTION!r}"
    )


def _with_encryption(names: list[str]) -> list[str]:
    return [name + mode for name in names for mode in _MODES[_ENCRYPTION]]


@dataclass
class Backend:
    """One database for one test, and a factory of checkpointers on it."""

    name: str
    url: str | None = None
    schema: str | None = None
    redis_url: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # for every repository made
    admin_url: str | None = None  # PostgreSQL itself, when url goes through a pooler
    keys: tenxstore.KeyRing | None = None  # payloads sealed (the "+encrypted" params)
    database: str | None = None  # MariaDB: this test's own database
    key_prefix: str = field(default_factory=lambda: f"test-{uuid.uuid4().hex[:12]}")
    made: list[Any] = field(default_factory=list)
    fresh: bool = False  # an empty database: no migrated store from a pool or template

    async def make(self, **options: Any) -> Any:
        """A set-up checkpointer on this test's database (memory: a new database)."""
        cache = {k: options.pop(k) for k in ("cache_ttl", "redis_backoff") if k in options}
        if self.keys is not None:
            options.setdefault("keys", self.keys)
        if self.name == "memory":
            cp: Any = tenxstore.InMemoryCheckpointer(**options)
        else:
            assert self.url is not None
            options = {**self.options, **options}
            default_ids = not {"id_type", "user_id_type"} & set(options)
            if self.name.startswith("sqlite") and default_ids and not self.fresh:
                # a copy of the migrated template: no migration (once per file)
                pools.sqlite_store(Path(self.url.removeprefix("sqlite:///")))
            cp = tenxstore.CheckpointRepository(self.url, schema=self.schema, **options)
            if self.redis_url is not None:
                cp = tenxstore.CachedCheckpointer(
                    cp, redis_url=self.redis_url, key_prefix=self.key_prefix, **cache
                )
        self.made.append(cp)
        await cp.asetup()
        return cp

    async def close(self) -> None:
        for cp in self.made:
            await cp.aclose()
        if self.redis_url is not None:
            from redis.asyncio import Redis

            client = Redis.from_url(self.redis_url)
            try:
                keys = [k async for k in client.scan_iter(match=f"{self.key_prefix}:*")]
                if keys:
                    await client.delete(*keys)
            finally:
                await client.aclose()


def cfg(thread: Any = "t1", user: Any = "alice", **extra: Any) -> dict[str, Any]:
    """A run config: thread ``t1`` of ``alice`` unless told otherwise."""
    return {"thread_id": thread, "user_id": user, **extra}


def quoted(name: str) -> str:
    """A PostgreSQL identifier, quoted (any name: spaces, dots, capitals, quotes)."""
    return '"' + name.replace('"', '""') + '"'


async def drop_schema(url: str, schema: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quoted(schema)} CASCADE")
    finally:
        await conn.close()


def new_schema() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def pg_url() -> str:
    return services.pg_url()


@pytest.fixture
async def pg_schema(pg_url: str) -> AsyncIterator[str]:
    """A fresh PostgreSQL schema name, dropped after the test."""
    schema = new_schema()
    yield schema
    await drop_schema(pg_url, schema)


def mysql_admin_args(url: str) -> dict[str, Any]:
    """asyncmy connect arguments of a MariaDB URL (without its database)."""
    from sqlalchemy import make_url

    parsed = make_url(url)
    return {
        "host": parsed.host or "127.0.0.1",
        "port": parsed.port or 3306,
        "user": parsed.username or "root",
        "password": parsed.password or "",
    }


async def mysql_admin(url: str, *statements: str) -> None:
    """Run statements on the MariaDB server of ``url`` (outside any database)."""
    import asyncmy  # type: ignore[import-untyped]

    conn = await asyncmy.connect(**mysql_admin_args(url), autocommit=True)
    try:
        async with conn.cursor() as cursor:
            for statement in statements:
                await cursor.execute(statement)
    finally:
        conn.close()


async def new_mysql_database() -> tuple[str, str]:
    """A new, empty MariaDB database for one test: (its URL, its name)."""
    from sqlalchemy import make_url

    base = make_url(services.mysql_url())
    name = f"{base.database or 'test'}_{uuid.uuid4().hex[:12]}"
    await mysql_admin(str(base), f"CREATE DATABASE `{name}`")
    return base.set(database=name).render_as_string(hide_password=False), name


@asynccontextmanager
async def backend_for(name: str, tmp_path: Path, *, fresh: bool = False) -> AsyncIterator[Backend]:
    """A backend by name (see BACKENDS; ``+encrypted``: with a key ring) for one test,
    cleaned up afterwards. Its store is one migrated already (see :mod:`tests.pools`);
    ``fresh``: an empty database instead (a schema, a database or a file of its own,
    dropped afterwards), for tests of what setup finds there."""
    keys = None
    if name.endswith("+encrypted"):
        name, keys = name.removesuffix("+encrypted"), TEST_KEYS
    redis_url = services.redis_url() if name.endswith("+redis") else None
    if name == "memory":
        backend = Backend(name)
    elif name.startswith("sqlite"):
        backend = Backend(name, url=f"sqlite:///{tmp_path / 'store.db'}", redis_url=redis_url)
    elif name == "mariadb":
        url, database = await (new_mysql_database() if fresh else pools.MYSQL.take())
        backend = Backend(name, url=url, database=database)
    elif name == "pgbouncer":
        backend = Backend(
            name,
            url=services.pgbouncer_url(),
            schema=new_schema() if fresh else pools.POSTGRESQL.take(),
            options={"pool_mode": "transaction"},
            admin_url=services.pg_url(),
        )
    else:
        schema = new_schema() if fresh else pools.POSTGRESQL.take()
        backend = Backend(name, url=services.pg_url(), schema=schema, redis_url=redis_url)
    backend.keys = keys
    backend.fresh = fresh
    try:
        yield backend
    finally:
        await backend.close()
        if fresh and backend.schema is not None:
            await drop_schema(services.pg_url(), backend.schema)
        elif backend.schema is not None:  # back to this process's pool, emptied (or dropped)
            await pools.POSTGRESQL.give_back(backend.schema)
        if fresh and backend.database is not None:
            await mysql_admin(services.mysql_url(), f"DROP DATABASE `{backend.database}`")
        elif backend.database is not None:
            assert backend.url is not None
            await pools.MYSQL.give_back(backend.url, backend.database)


@pytest.fixture(params=_with_encryption(BACKENDS))
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """Every backend: in-memory, SQLite file, PostgreSQL."""
    async with backend_for(request.param, tmp_path) as b:
        yield b


@pytest.fixture(params=_with_encryption(SQL_BACKENDS))
async def sql_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """The backends that other processes and instances can share: SQLite file, PostgreSQL."""
    async with backend_for(request.param, tmp_path) as b:
        yield b


@pytest.fixture
async def cp(backend: Backend) -> Any:
    """A set-up checkpointer with the default options, on every backend."""
    return await backend.make()


@pytest.fixture
def redis_url() -> str:
    return services.redis_url()


Factory = Callable[..., Awaitable[tenxstore.CheckpointRepository]]


_MARKS = (
    ("memory", "memory"),
    ("sqlite", "sqlite"),
    ("postgresql", "postgresql"),
    ("pgbouncer", "pgbouncer"),
    ("mariadb", "mariadb"),
    ("redis", "redis"),
    ("encrypted", "encrypted"),
)


# Modules whose subject differs by interpreter, or by the libraries an interpreter
# gets (Python 3.10 installs SQLAlchemy 2.0 and redis-py 8.1, 3.11 SQLAlchemy 2.1 and
# redis-py 8.2), marked ``interpreter``: CI's Python 3.10 leg runs them beside the
# encrypted backend matrix (every SQL path, on SQLAlchemy 2.0) and the unit layer; mypy
# checks all the code against 3.10's standard library.
INTERPRETER_MODULES = {
    "tests/test_sqlite_errors.py": "sqlite3 gives an error's code on 3.11+ only",
    "tests/contract/test_cancellation.py": "asyncio's cancellation changed in 3.11",
    "tests/cache/test_cache.py": "Redis calls are bounded by asyncio.timeout on 3.11+, "
    "wait_for on 3.10; redis-py's retries differ between 8.1 and 8.2",
    "tests/migrations/test_migrations.py": "Alembic's autogenerate reads SQLAlchemy's "
    "DDL and reflection, which 2.0 and 2.1 spell differently",
    "tests/migrations/test_foreign_tables.py": "reflection of other tables in the "
    "store's schema, by SQLAlchemy's version",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test on a backend carries markers of it (``pytest -m sqlite``, ``-m "not
    mariadb"``): from the backend fixtures' parameters, and ``name``/``kind``
    parameters that name one; the modules of :data:`INTERPRETER_MODULES` carry
    ``interpreter``."""
    root = Path(__file__).resolve().parents[1]
    for item in items:
        if item.path.relative_to(root).as_posix() in INTERPRETER_MODULES:
            item.add_marker(pytest.mark.interpreter)
        params = getattr(getattr(item, "callspec", None), "params", {})
        named = [
            str(value)
            for key, value in params.items()
            if key in ("backend", "sql_backend", "store_backend", "name", "kind", "db", "every_db")
        ]
        for value in named:
            for needle, mark in _MARKS:
                if needle in value:
                    item.add_marker(getattr(pytest.mark, mark))
            if value.startswith("pgbouncer"):
                item.add_marker(pytest.mark.postgresql)
    # The slow ones first: under pytest-xdist a long test that starts last is the tail
    # of the whole run, one that starts first runs beside everything else.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
