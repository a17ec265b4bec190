"""Stores migrated once and reused: the test suite's setup, made cheap.

Running Alembic for every test cost 0.15-0.3 s against a body of ~0.05 s. Instead a
test takes a store that is already at head — a PostgreSQL schema or a MariaDB
database from this process's pool, a copy of a migrated SQLite template file — and
gives it back emptied: every table but Alembic's and the store's own row truncated
(every model table: the memories' ``memories`` and ``memory_versions`` too, whose
PostgreSQL and MySQL full-text indexes empty with them; SQLite's FTS5 table is in the
template file, copied fresh), the sealed marker cleared. A store a test left as
anything but a fresh one at head (downgraded, other id types, a table more or less)
is dropped instead, so the next test never sees what this one did. Only
``tests/migrations`` (and tests that build
stores of their own) run the migrations from an empty database.

Each pytest process has its own pools, so parallel workers never share a store; the
pools are dropped when the process ends.
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import asyncpg

import tenxstore
from tenxstore import migrate
from tests import services

__all__ = ["MYSQL", "POSTGRESQL", "sqlite_store"]

# The tables a fresh store has; a store with any other set is not given out again.
_KEPT = ("alembic_version", "tenxstore_store")


def _tables() -> tuple[str, ...]:
    from tenxstore.models import Base

    return tuple(sorted(Base.metadata.tables))


async def _pg(url: str) -> Any:
    return await asyncpg.connect(url)


class PostgresPool:
    """Schemas of the test database at head (string ids), taken and given back."""

    def __init__(self) -> None:
        self.free: list[str] = []
        self.made: set[str] = set()

    def take(self) -> str:
        """A schema at head (one that was set up before), or a new name."""
        if self.free:
            return self.free.pop()
        schema = f"t_{uuid.uuid4().hex[:12]}"
        self.made.add(schema)
        return schema

    async def give_back(self, schema: str) -> None:
        """Empty ``schema`` for the next test, or drop it when it is not a fresh
        store at head any more."""
        conn = await _pg(services.pg_url())
        try:
            # A connection a test left open (a killed process's) may hold a lock: the
            # schema is then left for the end of the run, not waited for.
            await conn.execute("SET lock_timeout = '5s'")
            if await self._fresh(conn, schema):
                tables = ", ".join(f'"{schema}".{t}' for t in _tables() if t not in _KEPT)
                async with conn.transaction():
                    await conn.execute(f"TRUNCATE {tables} CASCADE")
                    await conn.execute(f'UPDATE "{schema}".tenxstore_store SET sealed_since = NULL')
                self.free.append(schema)
                return
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            self.made.discard(schema)
        except asyncpg.LockNotAvailableError:
            pass  # dropped with the rest when the process ends
        finally:
            await conn.close()

    @staticmethod
    async def _fresh(conn: Any, schema: str) -> bool:
        found = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
        )
        if sorted(r["table_name"] for r in found) != sorted((*_tables(), "alembic_version")):
            return False
        revision = await conn.fetchval(f'SELECT version_num FROM "{schema}".alembic_version')
        kind = await conn.fetchval(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = $1 "
            "AND table_name = 'threads' AND column_name = 'thread_id'",
            schema,
        )
        return bool(revision == migrate.head_revision() and kind == "character varying")

    def drop_all(self) -> None:
        async def drop() -> None:
            conn = await _pg(services.pg_url())
            try:
                for schema in self.made:
                    await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()

        if self.made:
            asyncio.run(drop())


class MysqlPool:
    """MariaDB databases at head (string ids), taken and given back."""

    def __init__(self) -> None:
        self.free: list[tuple[str, str]] = []
        self.made: set[str] = set()

    async def take(self) -> tuple[str, str]:
        """(URL, name) of a database at head, or of a new empty one."""
        if self.free:
            return self.free.pop()
        from tests.conftest import new_mysql_database

        url, name = await new_mysql_database()
        self.made.add(name)
        return url, name

    async def give_back(self, url: str, name: str) -> None:
        import asyncmy  # type: ignore[import-untyped]

        from tests.conftest import mysql_admin_args

        conn = await asyncmy.connect(**mysql_admin_args(url), db=name, autocommit=True)
        try:
            async with conn.cursor() as cursor:
                if await self._fresh(cursor, name):
                    await cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
                    for table in _tables():
                        if table not in _KEPT:
                            await cursor.execute(f"TRUNCATE TABLE `{table}`")
                    await cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
                    await cursor.execute("UPDATE tenxstore_store SET sealed_since = NULL")
                    self.free.append((url, name))
                    return
                await cursor.execute(f"DROP DATABASE `{name}`")
                self.made.discard(name)
        finally:
            conn.close()

    @staticmethod
    async def _fresh(cursor: Any, name: str) -> bool:
        await cursor.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (name,)
        )
        tables = sorted(r[0] for r in await cursor.fetchall())
        if tables != sorted((*_tables(), "alembic_version")):
            return False
        await cursor.execute("SELECT version_num FROM alembic_version")
        revision = await cursor.fetchone()
        await cursor.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'threads' AND column_name = 'thread_id'",
            (name,),
        )
        kind = await cursor.fetchone()
        return bool(
            revision and revision[0] == migrate.head_revision() and kind and kind[0] == "varchar"
        )

    def drop_all(self) -> None:
        async def drop() -> None:
            from tests.conftest import mysql_admin

            for name in self.made:
                await mysql_admin(services.mysql_url(), f"DROP DATABASE IF EXISTS `{name}`")

        if self.made:
            asyncio.run(drop())


POSTGRESQL = PostgresPool()
MYSQL = MysqlPool()
_TEMPLATE_DIR = Path(tempfile.mkdtemp(prefix="tenxstore-templates-"))
_TEMPLATE = _TEMPLATE_DIR / "store.db"


def sqlite_store(path: Path) -> None:
    """A migrated SQLite store at ``path`` unless one is there: a copy of this
    process's template (made by the migrations once)."""
    if path.exists():
        return
    if not _TEMPLATE.exists():
        made = _TEMPLATE_DIR / f"{uuid.uuid4().hex}.db"
        tenxstore.CheckpointRepository(f"sqlite:///{made}").setup()
        made.replace(_TEMPLATE)
    shutil.copyfile(_TEMPLATE, path)


@atexit.register
def _drop_pools() -> None:
    try:
        POSTGRESQL.drop_all()
        MYSQL.drop_all()
    finally:
        shutil.rmtree(_TEMPLATE_DIR, ignore_errors=True)
