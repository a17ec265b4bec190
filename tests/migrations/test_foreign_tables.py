"""Tables named like tenxstore's that another application made, in the place tenxstore
is told to use: setup refuses them by name, says what to do, and changes nothing."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import make_url

import tenxstore
from tests import services
from tests.conftest import Backend, backend_for

REMEDY = {
    "sqlite": "another database file",
    "postgresql": "another schema",
    "pgbouncer": "another schema",
    "mariadb": "another database",
}


async def run(backend: Backend, *statements: Callable[[Callable[[str], str]], str]) -> list[Any]:
    """Run statements in the backend's place (its file, schema or database), each
    written with a function that names a table there; the rows of the last one."""
    if backend.name.startswith("sqlite"):
        assert backend.url is not None
        with sqlite3.connect(make_url(backend.url).database or "") as conn:
            rows: list[Any] = []
            for statement in statements:
                rows = conn.execute(statement(lambda name: name)).fetchall()
            return rows
    if backend.name == "mariadb":

        def qualified(name: str) -> str:
            return f"`{backend.database}`.{name}"

        import asyncmy  # type: ignore[import-untyped]

        from tests.conftest import mysql_admin_args

        conn = await asyncmy.connect(**mysql_admin_args(services.mysql_url()), autocommit=True)
        try:
            async with conn.cursor() as cursor:
                for statement in statements:
                    await cursor.execute(statement(qualified))
                return list(await cursor.fetchall())
        finally:
            conn.close()
    pg = await asyncpg.connect(backend.admin_url or services.pg_url())
    try:
        await pg.execute(f'CREATE SCHEMA IF NOT EXISTS "{backend.schema}"')
        found: list[Any] = []
        for statement in statements:
            found = [
                tuple(r) for r in await pg.fetch(statement(lambda n: f'"{backend.schema}".{n}'))
            ]
        return found
    finally:
        await pg.close()


async def tables(backend: Backend) -> set[str]:
    """The tables in the backend's place."""
    if backend.name.startswith("sqlite"):
        sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
    elif backend.name == "mariadb":
        sql = (
            "SELECT TABLE_NAME FROM information_schema.TABLES "
            f"WHERE TABLE_SCHEMA = '{backend.database}'"
        )
    else:
        sql = f"SELECT tablename FROM pg_tables WHERE schemaname = '{backend.schema}'"
    return {row[0] for row in await run(backend, lambda _: sql)}


@pytest.mark.parametrize("name", list(REMEDY))
async def test_a_foreign_threads_table_is_named_and_left_alone(name: str, tmp_path: Path) -> None:
    async with backend_for(name, tmp_path, fresh=True) as backend:
        await run(
            backend,
            lambda t: f"CREATE TABLE {t('threads')} (id INTEGER PRIMARY KEY, note TEXT)",
            lambda t: f"INSERT INTO {t('threads')} VALUES (1, 'theirs')",
        )
        repo = tenxstore.CheckpointRepository(backend.url, schema=backend.schema, **backend.options)
        try:
            with pytest.raises(tenxstore.ConfigError) as err:
                await repo.asetup()
            message = str(err.value)
            assert "'threads'" in message and REMEDY[name] in message, message
            assert "Nothing was changed" in message
            assert not isinstance(err.value, tenxstore.SchemaNotReady)
        finally:
            await repo.aclose()
        assert await tables(backend) == {"threads"}  # nothing of tenxstore's was made
        rows = await run(backend, lambda t: f"SELECT id, note FROM {t('threads')}")
        assert [tuple(r) for r in rows] == [(1, "theirs")]


@pytest.mark.parametrize("name", list(REMEDY))
async def test_another_applications_alembic_history_is_named_and_left_alone(
    name: str, tmp_path: Path
) -> None:
    async with backend_for(name, tmp_path, fresh=True) as backend:
        await run(
            backend,
            lambda t: (
                f"CREATE TABLE {t('alembic_version')} (version_num VARCHAR(32) NOT NULL, "
                "PRIMARY KEY (version_num))"
            ),
            lambda t: f"INSERT INTO {t('alembic_version')} VALUES ('ae1027a6acf')",
        )
        repo = tenxstore.CheckpointRepository(backend.url, schema=backend.schema, **backend.options)
        try:
            with pytest.raises(tenxstore.ConfigError) as err:
                await repo.asetup()
            message = str(err.value)
            assert "'alembic_version'" in message and "'ae1027a6acf'" in message, message
            assert REMEDY[name] in message
            with pytest.raises(tenxstore.ConfigError, match="alembic_version"):
                await repo.aget_state({"thread_id": "t", "user_id": "u"})  # at first use too
        finally:
            await repo.aclose()
        assert await tables(backend) == {"alembic_version"}
        rows = await run(backend, lambda t: f"SELECT version_num FROM {t('alembic_version')}")
        assert [tuple(r) for r in rows] == [("ae1027a6acf",)]


@pytest.mark.parametrize("name", list(REMEDY))
async def test_setup_of_a_schema_a_newer_release_migrated_says_so(
    name: str, tmp_path: Path
) -> None:
    async with backend_for(name, tmp_path, fresh=True) as backend:
        cp = await backend.make()
        await cp.aput_state({"thread_id": "t", "user_id": "u"}, {"n": 1})
        await run(backend, lambda t: f"UPDATE {t('alembic_version')} SET version_num = '0099_x'")
        repo = tenxstore.CheckpointRepository(backend.url, schema=backend.schema, **backend.options)
        try:
            with pytest.raises(tenxstore.SchemaNotReady, match="newer tenxstore"):
                await repo.asetup()
        finally:
            await repo.aclose()


async def test_mysql_tables_an_unfinished_setup_left_are_still_finished(tmp_path: Path) -> None:
    """MySQL's DDL commits as it goes: a setup that died halfway left tenxstore's own
    tables and an empty version table; those are not foreign, the next setup ends it."""
    async with backend_for("mariadb", tmp_path, fresh=True) as backend:
        cp = await backend.make()
        await cp.aclose()
        await run(
            backend,
            lambda t: f"DELETE FROM {t('alembic_version')}",
            *(lambda t, n=n: f"DROP TABLE {t(n)}" for n in ("lg_heads", "lg_blobs")),
        )
        again = await backend.make()
        assert await again.aput_state({"thread_id": "t", "user_id": "u"}, {"n": 1}) == 1
