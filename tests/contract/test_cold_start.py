"""Cold start on every SQL backend (issue "Cold start"): a new repository on a schema
at head checks it in ONE statement at its first call (no Alembic, no inspector),
``asetup`` there costs that one statement too, the fast check and the slow one name
the same store, and a fresh process that opens a store and writes imports only what
it uses (checked through ``sys.modules``)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import make_url

import tenxstore
from tenxstore import migrate
from tenxstore.backends import schema_facts
from tests import services
from tests.conftest import SQL_BACKENDS, Backend, backend_for, cfg
from tests.contract.test_connections import waiting_writer
from tests.procs import loaded_packages
from tests.unit.test_cold_imports import UNASKED

# The revision before head: a schema a release behind.
BEHIND = "0012_memory_vectors_written"
# What a driver itself imports, by backend: asyncmy loads cryptography (its auth).
OWN = {"mariadb": ("cryptography",)}
# The other databases' drivers, by backend.
DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg", "mariadb": "asyncmy"}
OTHER_DRIVERS = {
    name: tuple(d for b, d in DRIVERS.items() if b != name.replace("pgbouncer", "postgresql"))
    for name in SQL_BACKENDS
}


def repository(backend: Backend) -> Any:
    """A repository on the backend's database as a new process makes one: not set up."""
    assert backend.url is not None
    cp = tenxstore.CheckpointRepository(
        backend.url, schema=backend.schema, keys=backend.keys, **backend.options
    )
    backend.made.append(cp)
    return cp


@contextmanager
def statements(cp: Any) -> Iterator[list[str]]:
    """The statements ``cp`` sends meanwhile, but SQLite's own ``BEGIN``."""
    seen: list[str] = []
    remove = cp.backend.on_statement(seen.append)
    try:
        yield seen
    finally:
        remove()
    seen[:] = [s for s in seen if s != "BEGIN"]


def is_schema_check(sql: str) -> bool:
    return "alembic_version" in sql and "tenxstore_store" in sql


async def test_the_first_call_checks_the_schema_in_one_statement(sql_backend: Backend) -> None:
    await sql_backend.make()
    cp = repository(sql_backend)
    with statements(cp) as seen:
        assert await cp.aget_state(cfg("cold")) is None
    assert len(seen) == 2, seen  # the check, then the read
    assert is_schema_check(seen[0]) and not is_schema_check(seen[1])


async def test_asetup_on_a_schema_at_head_is_one_statement(sql_backend: Backend) -> None:
    await sql_backend.make()
    cp = repository(sql_backend)
    with statements(cp) as seen:
        await cp.asetup()
    assert len(seen) == 1 and is_schema_check(seen[0]), seen
    with statements(cp) as seen:  # the first call after it checks nothing again
        await cp.aput_checkpoint(cfg("cold"), {"n": 1}, [])
        assert await cp.aget_state(cfg("cold")) == {"n": 1}
    assert seen and not any(is_schema_check(s) for s in seen), seen


async def test_a_first_call_cancelled_while_its_check_waits_checks_again(
    tmp_path: Path,
) -> None:
    """Cancelled mid-check (the store's row locked by another session), the call
    leaves no half-known store: the next call checks again, and is served."""
    async with backend_for("postgresql", tmp_path) as backend:
        await backend.make()
        assert backend.url is not None and backend.schema is not None
        name = f"cold-{uuid.uuid4().hex[:8]}"
        url = make_url(backend.url).update_query_dict({"application_name": name})
        cp = tenxstore.CheckpointRepository(url, schema=backend.schema)
        backend.made.append(cp)
        admin = await asyncpg.connect(services.pg_url())  # holds the lock
        watcher = await asyncpg.connect(services.pg_url())  # sees it wait (no snapshot held)
        try:
            async with admin.transaction():
                await admin.execute(
                    f'LOCK TABLE "{backend.schema}".tenxstore_store IN ACCESS EXCLUSIVE MODE'
                )
                first = asyncio.create_task(cp.aget_state(cfg("cold")))
                await waiting_writer(watcher, name)  # its check waits on the lock
                first.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await first
            assert cp.store.store_id is None
            assert await cp.aget_state(cfg("cold")) is None
            assert cp.store.store_id is not None
        finally:
            await admin.close()
            await watcher.close()


async def test_the_fast_check_and_the_slow_one_name_the_same_store(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store id (with the database's identity) and the sealed marker read in one
    statement are those the inspector and Alembic read: a store keeps its id."""
    first = await sql_backend.make()
    await first.aput_checkpoint(cfg("sealed?"), {"n": 1}, [])  # marks it, with keys
    fast = repository(sql_backend)
    await fast.aget_state(cfg("cold"))

    async def unreadable(*_args: Any) -> None:
        return None

    monkeypatch.setattr(tenxstore.store, "read_facts", unreadable)  # the slow way only
    slow = repository(sql_backend)
    with statements(slow) as seen:
        await slow.aget_state(cfg("cold"))
    assert not any(is_schema_check(s) for s in seen)
    assert fast.store.store_id == slow.store.store_id == first.store.store_id
    assert fast.store.sealed_since == slow.store.sealed_since
    assert (fast.store.sealed_since is None) == (sql_backend.keys is None)


async def test_a_schema_of_other_id_types_is_refused_as_before(sql_backend: Backend) -> None:
    """The one statement sees the id columns' types: other ones send the check the
    slow way, which names them (nothing is written)."""
    await sql_backend.make()
    assert sql_backend.url is not None
    cp = tenxstore.CheckpointRepository(
        sql_backend.url,
        schema=sql_backend.schema,
        keys=sql_backend.keys,
        id_type="bigint",
        **sql_backend.options,
    )
    sql_backend.made.append(cp)
    with pytest.raises(tenxstore.ConfigError, match="id_type='string'"):
        await cp.aget_state(cfg(7))


def test_facts_read_id_kinds_as_the_inspector_names_them() -> None:
    kinds = {
        "bigint": "bigint",
        "BIGINT": "bigint",
        "integer": "int",
        "INTEGER": "int",
        "int": "int",
        "character varying(255)": "string",
        "VARCHAR(255)": "string",
        "varchar": "string",
        None: None,
    }
    assert {name: schema_facts.id_kind(name) for name in kinds} == kinds


# -- fresh processes -------------------------------------------------------------------

WRITER = """
import asyncio, json, sys, uuid
from tenxstore import CheckpointRepository

async def main(url, schema, options):
    async with CheckpointRepository(url, schema=schema, **options) as cp:
        config = {"thread_id": uuid.uuid4().hex, "user_id": "alice"}
        assert await cp.aget_state(config) is None
        await cp.aput_checkpoint(config, {"n": 1}, [{"role": "user", "content": "hi"}])
        assert await cp.aget_state(config) == {"n": 1}

asyncio.run(main(*json.loads(sys.argv[1])))
"""

SAVER = """
import asyncio, json, sys, uuid
from tenxstore import CheckpointRepository
from tenxstore.langgraph import TenxCheckpointSaver
from langgraph.checkpoint.base import empty_checkpoint

async def main(url, schema, options):
    async with CheckpointRepository(url, schema=schema, **options) as cp:
        saver = TenxCheckpointSaver(cp)
        thread = uuid.uuid4().hex
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": "", "user_id": "u"}}
        assert await saver.aget_tuple(config) is None
        await saver.aput(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
        assert await saver.aget_tuple(config) is not None

asyncio.run(main(*json.loads(sys.argv[1])))
"""


def loaded_by(program: str, backend: Backend, packages: tuple[str, ...]) -> list[str]:
    """The packages among ``packages`` a fresh interpreter loaded to run ``program``
    on the backend's database (which must succeed), with no key ring and no
    OpenTelemetry provider in its environment."""
    args = json.dumps([backend.url, backend.schema, backend.options])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENXSTORE_KEYS", "OTEL_"))}
    return loaded_packages(program, packages, args, env=env)


@pytest.mark.parametrize("name", SQL_BACKENDS)
async def test_a_process_that_writes_loads_only_its_own_driver(name: str, tmp_path: Path) -> None:
    async with backend_for(name, tmp_path) as backend:
        await backend.make()  # the schema at head: the deployment set it up
        unasked = tuple(p for p in UNASKED if p not in OWN.get(name, ()))
        assert loaded_by(WRITER, backend, (*unasked, *OTHER_DRIVERS[name])) == []
        assert loaded_by(WRITER, backend, (DRIVERS[name.replace("pgbouncer", "postgresql")],))


@pytest.mark.parametrize("name", ["sqlite", "postgresql"])
async def test_a_langgraph_process_loads_no_cache_migrations_or_cli(
    name: str, tmp_path: Path
) -> None:
    async with backend_for(name, tmp_path) as backend:
        await backend.make()
        packages = tuple(p for p in UNASKED if p not in ("langgraph", "langchain_core"))
        assert loaded_by(SAVER, backend, (*packages, *OTHER_DRIVERS[name])) == []


# Not MariaDB here: two sync setups from async code there leave one asyncmy socket
# unclosed until the interpreter exits, as the release before this one did (noted in
# the closing note; each setup runs on a private loop in a worker thread).
@pytest.mark.parametrize("name", ["sqlite", "postgresql"])
async def test_sync_setup_migrates_a_schema_behind_head_after_its_one_statement_check(
    name: str, tmp_path: Path
) -> None:
    """``setup()`` reads the facts on its private connection first: a schema behind
    head is then migrated on that same connection (the check's read transaction
    ended), and a schema at head is left as it is."""
    async with backend_for(name, tmp_path, fresh=True) as backend:
        old = repository(backend)
        await migrate.upgrade(old.backend, schema=backend.schema, revision=BEHIND)
        behind = repository(backend)
        behind.setup()  # from a worker thread, on a loop of its own (a running loop here)
        assert await migrate.current_revision(behind.engine, backend.schema) == migrate.HEAD
        at_head = repository(backend)
        at_head.setup()
        await at_head.aput_checkpoint(cfg("sync"), {"n": 1}, [])
        assert await behind.aget_state(cfg("sync")) == {"n": 1}
        assert at_head.store.store_id == behind.store.store_id
