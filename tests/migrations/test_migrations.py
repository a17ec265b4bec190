"""Migrations: up, down, up again; no drift; setup() is idempotent and concurrent-safe."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy import create_engine, inspect

import tenxstore
from alembic import command
from tenxstore import migrate
from tests import procs, services

ROOT = Path(__file__).resolve().parents[2]
TABLES = {
    "threads",
    "states",
    "messages",
    "tool_executions",
    "lg_checkpoints",
    "lg_writes",
    "lg_blobs",
    "lg_heads",
    "memories",
    "memory_versions",
    "memory_vectors",
    "memory_revisions",
    "tenxstore_store",
}
# SQLite's FTS5 keyword index of the memories (0010): a virtual table and its shadows.
FTS_TABLES = {
    "memories_fts",
    "memories_fts_config",
    "memories_fts_content",
    "memories_fts_data",
    "memories_fts_docsize",
    "memories_fts_idx",
}


async def _tables(url: str, schema: str | None) -> set[str]:
    if url.startswith("sqlite"):
        engine = create_engine(url)
        try:
            names = set(inspect(engine).get_table_names())
        finally:
            engine.dispose()
        fts = names & FTS_TABLES
        assert fts in (set(), FTS_TABLES)  # all of the index, or none of it
        return names - FTS_TABLES
    if url.startswith("mysql"):
        import asyncmy  # type: ignore[import-untyped]

        from tests.conftest import mysql_admin_args

        con = await asyncmy.connect(**mysql_admin_args(url), db=sa.make_url(url).database)
        try:
            async with con.cursor() as cursor:
                await cursor.execute("SHOW TABLES")
                return {row[0] for row in await cursor.fetchall()}
        finally:
            con.close()
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema or "public"
        )
        return {r["tablename"] for r in rows}
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}", None
        return
    if request.param == "mariadb":
        from tests.conftest import mysql_admin, new_mysql_database

        url, name = await new_mysql_database()
        yield url, None
        await mysql_admin(services.mysql_url(), f"DROP DATABASE `{name}`")
        return
    from tests.conftest import drop_schema, new_schema

    url, schema = services.pg_url(), new_schema()
    yield url, schema
    await drop_schema(url, schema)


def _alembic(url: str, schema: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    x = ["-x", f"url={url}"] + (["-x", f"schema={schema}"] if schema else [])
    return subprocess.run(
        [sys.executable, "-m", "alembic", *x, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("TENXSTORE_")},
        timeout=120,
    )


async def test_upgrade_downgrade_upgrade_from_the_command_line_then_no_drift(
    database: Any,
) -> None:
    """Alembic's own command takes the store down to nothing and up again; at head,
    ``alembic check`` finds the models and the migrations agree."""
    url, schema = database
    for step, expected in (("upgrade", TABLES), ("downgrade", set()), ("upgrade", TABLES)):
        done = _alembic(url, schema, step, "head" if step == "upgrade" else "base")
        assert done.returncode == 0, done.stderr
        assert await _tables(url, schema) - {"alembic_version"} == expected
    current = _alembic(url, schema, "current")
    assert f"{migrate.head_revision()} (head)" in current.stdout, current.stdout + current.stderr
    done = _alembic(url, schema, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No new upgrade operations detected" in done.stdout + done.stderr


def test_database_url_from_the_environment(tmp_path: Path) -> None:
    db = tmp_path / "env.db"
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "TENXSTORE_DATABASE_URL": f"sqlite:///{db}"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    engine = create_engine(f"sqlite:///{db}")
    assert set(inspect(engine).get_table_names()) >= TABLES
    engine.dispose()


async def test_programmatic_downgrade_and_upgrade(database: Any) -> None:
    url, schema = database
    repo = tenxstore.CheckpointRepository(url, schema=schema)
    try:
        await repo.asetup()
        await repo.asetup()  # idempotent
        assert await _tables(url, schema) >= TABLES
        await migrate.upgrade(repo.backend, schema=schema, revision="head")
        config = migrate.alembic_config(url=url, schema=schema)
        await asyncio.to_thread(command.downgrade, config, "base")
        assert await _tables(url, schema) - {"alembic_version"} == set()
        await repo.asetup()
        assert await _tables(url, schema) >= TABLES
    finally:
        await repo.aclose()


async def test_setup_creates_the_postgresql_schema(pg_url: str, pg_schema: str) -> None:
    async with tenxstore.CheckpointRepository(pg_url, schema=pg_schema) as repo:
        await repo.asetup()
    assert await _tables(pg_url, pg_schema) == TABLES | {"alembic_version"}


def _setup_in_process(url: str, schema: str | None, barrier: Any) -> None:
    barrier.wait(timeout=60)
    repo = tenxstore.CheckpointRepository(url, schema=schema)
    repo.setup()


@pytest.mark.slow
@pytest.mark.parametrize("processes", [6])
async def test_many_processes_set_up_at_once(database: Any, processes: int) -> None:
    url, schema = database
    ctx = procs.context()
    barrier = ctx.Barrier(processes)
    workers = [
        ctx.Process(target=_setup_in_process, args=(url, schema, barrier)) for _ in range(processes)
    ]
    for w in workers:
        w.start()
    await asyncio.to_thread(lambda: [w.join(120) for w in workers])
    assert [w.exitcode for w in workers] == [0] * processes
    assert await _tables(url, schema) >= TABLES
    async with tenxstore.CheckpointRepository(url, schema=schema) as repo:
        config = {"thread_id": "t", "user_id": "u"}
        assert await repo.aput_state(config, {"ok": True}) == 1


async def test_id_types_are_fixed_when_the_schema_is_created(database: Any) -> None:
    url, schema = database
    async with tenxstore.CheckpointRepository(
        url, schema=schema, id_type="bigint", user_id_type="int"
    ) as repo:
        await repo.asetup()
        config = {"thread_id": 2**40, "user_id": 7}
        assert await repo.aput_state(config, {"n": 1}) == 1
        assert await repo.aget_state({"thread_id": 2**40, "user_id": 7}) == {"n": 1}
        [info] = await repo.alist_threads({"user_id": 7})
        assert (info.thread_id, info.user_id) == (2**40, 7)
        with pytest.raises(tenxstore.ConfigError):
            await repo.aget_state({"thread_id": "not-an-int", "user_id": 7})
    async with tenxstore.CheckpointRepository(url, schema=schema) as other:
        with pytest.raises(tenxstore.ConfigError, match="id_type='bigint'"):
            await other.asetup()


def test_setup_without_a_running_loop_then_use_from_another_loop(tmp_path: Path) -> None:
    repo = tenxstore.SqliteCheckpointer(tmp_path / "sync.db")
    repo.setup()
    repo.setup()

    async def use() -> dict[str, Any] | None:
        config = {"thread_id": "t", "user_id": "u"}
        await repo.aput_state(config, {"x": 1})
        state = await repo.aget_state(config)
        await repo.aclose()
        return state

    assert asyncio.run(use()) == {"x": 1}


async def test_setup_inside_a_running_loop(pg_url: str, pg_schema: str) -> None:
    repo = tenxstore.CheckpointRepository(pg_url, schema=pg_schema)
    try:
        repo.setup()  # a sync call from async code: runs on a private loop
        assert await repo.aput_state({"thread_id": "t", "user_id": "u"}, {"x": 1}) == 1
    finally:
        await repo.aclose()


@pytest.mark.slow
def test_wheel_ships_the_migrations(tmp_path: Path) -> None:
    """A wheel built from this checkout, in a fresh venv, migrates a new SQLite file."""
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = dist.glob("tenxstore-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    script = (
        "import asyncio, pathlib, sys, tenxstore, tenxstore.migrate as m\n"
        "assert 'site-packages' in str(m.script_location()), m.script_location()\n"
        "cp = tenxstore.SqliteCheckpointer(sys.argv[1]); cp.setup()\n"
        "async def go():\n"
        "    c = {'thread_id': 't', 'user_id': 'u'}\n"
        "    v = await cp.aput_state(c, {'from': 'wheel'})\n"
        "    print(v, await cp.aget_state(c)); await cp.aclose()\n"
        "asyncio.run(go())\n"
    )
    done = subprocess.run(
        [str(python), "-c", script, str(tmp_path / "wheel.db")],
        cwd=tmp_path,  # not the checkout: nothing may come from it
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1 {'from': 'wheel'}"


async def test_a_database_never_set_up_says_how_to_set_it_up(database: Any) -> None:
    url, schema = database
    repo = tenxstore.CheckpointRepository(url, schema=schema)
    try:
        for call in (
            repo.aget_state({"thread_id": "t", "user_id": "u"}),
            repo.aput_state({"thread_id": "t", "user_id": "u"}, {"x": 1}),
            repo.alist_threads({"user_id": "u"}),
        ):
            with pytest.raises(tenxstore.SchemaNotReady, match="asetup") as err:
                await call
            assert "no tenxstore schema" in str(err.value)
        health = await repo.acheck()
        assert health.revision is None and not health.ok
        await repo.asetup()
        assert await repo.aput_state({"thread_id": "t", "user_id": "u"}, {"x": 1}) == 1
    finally:
        await repo.aclose()


async def test_a_schema_behind_head_names_both_revisions(database: Any) -> None:
    url, schema = database
    old = tenxstore.CheckpointRepository(url, schema=schema)
    await migrate.upgrade(old.backend, schema=schema, revision="0002_langgraph")
    await old.aclose()
    repo = tenxstore.CheckpointRepository(url, schema=schema)
    try:
        with pytest.raises(tenxstore.SchemaNotReady) as err:
            await repo.aget_state({"thread_id": "t", "user_id": "u"})
        assert "0002_langgraph" in str(err.value) and str(migrate.head_revision()) in str(err.value)
        await repo.asetup()  # the fix the message names
        assert await repo.aget_state({"thread_id": "t", "user_id": "u"}) is None
    finally:
        await repo.aclose()


async def test_a_schema_from_a_newer_release_says_so(database: Any) -> None:
    url, schema = database
    repo = tenxstore.CheckpointRepository(url, schema=schema)
    try:
        await repo.asetup()
        table = f'"{schema}".alembic_version' if schema else "alembic_version"
        if url.startswith("mysql"):
            from tests.conftest import mysql_admin

            name = sa.make_url(url).database
            await mysql_admin(
                url, f"UPDATE `{name}`.alembic_version SET version_num = '0099_future'"
            )
        elif url.startswith("sqlite"):
            engine = create_engine(url)
            with engine.begin() as conn:
                conn.exec_driver_sql(f"UPDATE {table} SET version_num = '0099_future'")
            engine.dispose()
        else:
            conn = await asyncpg.connect(url)
            await conn.execute(f"UPDATE {table} SET version_num = '0099_future'")
            await conn.close()
        newer = tenxstore.CheckpointRepository(url, schema=schema)
        with pytest.raises(tenxstore.SchemaNotReady, match="newer tenxstore"):
            await newer.aget_state({"thread_id": "t", "user_id": "u"})
        await newer.aclose()
    finally:
        await repo.aclose()


async def test_other_id_types_without_setup_are_a_config_error(database: Any) -> None:
    """A worker that never migrates still learns of the mismatch, as a typed error."""
    url, schema = database
    async with tenxstore.CheckpointRepository(url, schema=schema) as repo:
        await repo.asetup()
    async with tenxstore.CheckpointRepository(url, schema=schema, id_type="int") as other:
        with pytest.raises(tenxstore.ConfigError, match="id_type='string'"):
            await other.aget_state({"thread_id": 5, "user_id": "a"})


async def test_langgraph_checkpoints_from_before_0005_read_as_they_did(database: Any) -> None:
    """Checkpoints stored with their values inline (before 0005) read as they did,
    and 0005 fills their ``run_id`` from the metadata, so adelete_for_runs finds them
    by the index; a run goes on from them in the new layout."""
    from langgraph.checkpoint.base import empty_checkpoint

    from tenxstore.langgraph import TenxCheckpointSaver

    url, schema = database
    repo = tenxstore.CheckpointRepository(url, schema=schema, enforce_user_isolation=False)
    try:
        await repo.asetup()
        await repo.aput_thread({"thread_id": "t"})
        alembic = migrate.alembic_config(url=url, schema=schema)
        await asyncio.to_thread(command.downgrade, alembic, "0004_hot_updates")
        saver = TenxCheckpointSaver(repo)
        old = sa.table(  # lg_checkpoints as 0002-0004 made it
            "lg_checkpoints",
            *(sa.column(name) for name in ("thread_id", "checkpoint_ns", "checkpoint_id")),
            *(sa.column(name) for name in ("parent_checkpoint_id", "type", "checkpoint")),
            sa.column("metadata"),
            sa.column("created_at"),
            schema=schema,
        )
        rows, parent = [], None
        for n, run in enumerate(("run-a", "run-b", "run-a")):
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"n": n, "items": [n] * 3}
            checkpoint["channel_versions"] = {"n": str(n), "items": str(n)}
            kind, data = saver.serde.dumps_typed(checkpoint)
            rows.append(
                {
                    "thread_id": "t",
                    "checkpoint_ns": "",
                    "checkpoint_id": checkpoint["id"],
                    "parent_checkpoint_id": parent,
                    "type": kind,
                    "checkpoint": data,
                    "metadata": json.dumps({"run_id": run, "step": n}),
                    "created_at": datetime.now(timezone.utc),
                }
            )
            parent = checkpoint["id"]
        async with repo.engine.begin() as conn:
            await conn.execute(sa.insert(old), rows)
        await asyncio.to_thread(command.upgrade, alembic, "head")
        listed = [t async for t in saver.alist(None)]
        assert [t.checkpoint["channel_values"]["n"] for t in listed] == [2, 1, 0]
        assert listed[0].checkpoint["channel_values"]["items"] == [2, 2, 2]
        head = listed[0]
        checkpoint = empty_checkpoint()  # a run goes on: values from here are in lg_blobs
        checkpoint["channel_values"] = {**head.checkpoint["channel_values"], "n": 3}
        checkpoint["channel_versions"] = {"n": "3", "items": "2"}
        await saver.aput(head.config, checkpoint, {"run_id": "run-c"}, {"n": "3"})
        latest = await saver.aget_tuple({"configurable": {"thread_id": "t"}})
        assert latest is not None
        assert latest.checkpoint["channel_values"] == {"n": 3, "items": [2, 2, 2]}
        await saver.adelete_for_runs(["run-a"])
        runs = [t.metadata["run_id"] async for t in saver.alist(None)]
        assert runs == ["run-c", "run-b"]
    finally:
        await repo.aclose()


async def test_0009_marks_a_store_that_holds_sealed_values(
    database: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0009 records in the store's row whether it holds sealed values: a store in clear
    is not marked by it; one whose newest rows are sealed is, upgraded again after a
    downgrade dropped the mark; a checkpointer without keys then refuses to write."""
    monkeypatch.delenv("TENXSTORE_KEYS", raising=False)
    url, schema = database
    config = {"thread_id": "t", "user_id": "u"}
    plain = tenxstore.CheckpointRepository(url, schema=schema)
    keyed = tenxstore.CheckpointRepository(
        url, schema=schema, keys=tenxstore.KeyRing([("k1", bytes(32))])
    )
    try:
        await plain.asetup()
        await plain.aput_state(config, {"n": 1})
        await migrate.downgrade(plain.backend, schema=schema, revision="0008_langgraph_heads")
        await plain.asetup()
        assert (await plain.acheck()).sealed_since is None
        assert await plain.aput_state(config, {"n": 2}) == 2
        await keyed.aput_state(config, {"n": 3})
        assert (await keyed.acheck()).sealed_since is not None
        await migrate.downgrade(keyed.backend, schema=schema, revision="0008_langgraph_heads")
        assert await migrate.current_revision(keyed.engine, schema) == "0008_langgraph_heads"
        await keyed.asetup()
        assert (await keyed.acheck()).sealed_since is not None
        fresh = tenxstore.CheckpointRepository(url, schema=schema)
        try:
            with pytest.raises(tenxstore.ConfigError, match="TENXSTORE_KEYS"):
                await fresh.aput_state(config, {"n": 4})
        finally:
            await fresh.aclose()
        assert await keyed.aget_state(config) == {"n": 3}
    finally:
        await plain.aclose()
        await keyed.aclose()
