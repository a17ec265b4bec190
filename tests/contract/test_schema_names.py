"""PostgreSQL schema names are taken exactly as written: quoted wherever tenxstore uses
them (creation, migrations and their version table, the store's identity), so a name
with spaces, dots, quotes, capitals or any Unicode is one schema, end to end; a name
PostgreSQL cannot hold is refused at construction, before any I/O."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from tenxstore import CheckpointRepository, ConfigError, PgCheckpointer
from tenxstore.backends.schema_facts import read_identity
from tenxstore.langgraph import TenxCheckpointSaver
from tests import services
from tests.conftest import cfg, drop_schema
from tests.langgraph.test_saver import put, root

ROOT = Path(__file__).resolve().parents[2]
NOWHERE = "postgresql://postgres@127.0.0.1:1/nowhere"  # never reached: nothing connects


def named(kind: str) -> str:
    """A schema name of the kind, unique to this test (the server is shared)."""
    tag = uuid.uuid4().hex[:8]
    return {
        "space": f"a b {tag}",
        "dots": f"dot.ted.{tag}",
        "capitals": f"Acme_{tag}",
        "quotes": f"qu\"o'te {tag}",
        "colon and percent": f"a :b 50% {tag}",  # a bind parameter and a format, to SQL text
        "unicode": f"Ünï cödé 🙂 {tag}",
        "63 bytes": "é" * 27 + "_" + tag,  # 54 + 1 + 8 bytes in UTF-8
    }[kind]


@pytest.mark.parametrize("mode", ["postgresql", "pgbouncer"])
@pytest.mark.parametrize(
    "kind", ["space", "dots", "capitals", "quotes", "colon and percent", "unicode", "63 bytes"]
)
async def test_a_schema_name_is_taken_exactly_as_written(kind: str, mode: str) -> None:
    schema = named(kind)
    if mode == "pgbouncer":
        url, options = services.pgbouncer_url(), {"pool_mode": "transaction"}
    else:
        url, options = services.pg_url(), {}
    repo = CheckpointRepository(url, schema=schema, enforce_user_isolation=False, **options)
    admin = await asyncpg.connect(services.pg_url())
    try:
        await repo.asetup()
        message = {"id": "m1", "role": "user", "content": "hi"}
        assert await repo.aput_checkpoint(cfg("t", "u"), {"n": 1}, [message]) == 1
        assert await repo.aget_state(cfg("t", "u")) == {"n": 1}
        assert [m["id"] for m in await repo.aget_messages(cfg("t", "u"))] == ["m1"]
        saver = TenxCheckpointSaver(repo)
        written = await put(saver, root("lg"), 0)
        found = await saver.aget_tuple(root("lg"))
        assert found is not None
        assert found.checkpoint["id"] == written["configurable"]["checkpoint_id"]
        # Another process, never set up: its first use reads the schema and its identity.
        other = CheckpointRepository(url, schema=schema, enforce_user_isolation=False, **options)
        try:
            assert await other.aget_state(cfg("t", "u")) == {"n": 1}
            assert await other.astore_id() == await repo.astore_id()
        finally:
            await other.aclose()
        # Every table in the schema of exactly that name; the identity names its oid.
        tables = {
            row[0]
            for row in await admin.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema
            )
        }
        assert {"alembic_version", "threads", "states", "lg_checkpoints"} <= tables
        oid = await admin.fetchval("SELECT oid FROM pg_namespace WHERE nspname = $1", schema)
        async with repo.backend.connect() as conn:
            identity = await read_identity(repo.backend, conn, schema)
        assert identity.endswith(f"/{oid}"), identity
    finally:
        await admin.close()
        await repo.aclose()
        await drop_schema(services.pg_url(), schema)


@pytest.mark.parametrize(
    "bad",
    ["", "x" * 64, "é" * 32, "a\x00b", "a\ud800b", "pg_tenx", 5, b"tenx"],
    ids=[
        "empty",
        "64 bytes",
        "64 bytes of 32 characters",
        "NUL",
        "surrogate",
        "pg_",
        "int",
        "bytes",
    ],
)
def test_a_schema_name_postgresql_cannot_hold_is_refused_at_construction(bad: object) -> None:
    for make in (
        lambda: CheckpointRepository(NOWHERE, schema=bad),  # type: ignore[arg-type]
        lambda: PgCheckpointer(postgres_dsn=NOWHERE, redis_url="redis://127.0.0.1:1", schema=bad),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigError, match="schema"):
            make()


def test_63_bytes_is_the_longest_schema_name() -> None:
    longest = "é" * 31 + "x"  # 63 bytes, 32 characters
    assert CheckpointRepository(NOWHERE, schema=longest).schema == longest
    with pytest.raises(ConfigError, match="63 bytes"):
        CheckpointRepository(NOWHERE, schema=longest + "x")


def test_alembic_refuses_a_schema_name_postgresql_cannot_hold() -> None:
    x = ["-x", f"url={NOWHERE}", "-x", "schema=" + "x" * 64]
    done = subprocess.run(
        [sys.executable, "-m", "alembic", *x, "upgrade", "head"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("TENXSTORE_")},
        timeout=120,
    )
    assert done.returncode != 0
    assert "ConfigError" in done.stderr and "63 bytes" in done.stderr, done.stderr
