"""Every code sample of the README and docs/ runs, and the API reference is complete."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tenxstore
from tests import services
from tests.conftest import drop_schema

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(python|sh)\n(.*?)^```", re.M | re.S)
README_TEXT = (ROOT / "README.md").read_text()
SCHEMAS = (
    "howto_swap",
    "howto_moved",
    "deploy_sample",
    "deploy_pooled",
    "operations_sample",
    "memory_agent",
)


def samples() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for number, match in enumerate(FENCE.finditer(doc.read_text()), 1):
            found.append((f"{doc.relative_to(ROOT)}#{number}", match[1], match[2]))
    return found


@pytest.mark.slow  # a process each: run once in CI (the Python 3.11 leg)
@pytest.mark.parametrize(("where", "language", "code"), samples(), ids=[s[0] for s in samples()])
def test_sample_runs(where: str, language: str, code: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TENXSTORE_DATABASE_URL": services.pg_url(),
        "TENXSTORE_REDIS_URL": services.redis_url(),
        "TENXSTORE_MYSQL_URL": services.mysql_url(),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    if "TENXSTORE_PGBOUNCER_URL" in code:  # only these samples need a PgBouncer
        env["TENXSTORE_PGBOUNCER_URL"] = services.pgbouncer_url()
    env.pop("TENXSTORE_SCHEMA", None)
    if language == "python":
        command = [sys.executable, "-c", code]
    else:
        command = ["bash", "-euo", "pipefail", "-c", code]
    try:
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        for schema in SCHEMAS:
            asyncio.run(drop_schema(services.pg_url(), schema))
    assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"


def test_the_api_reference_names_every_public_name() -> None:
    reference = (ROOT / "docs" / "api.md").read_text()
    missing = [name for name in tenxstore.__all__ if f"`{name}" not in reference]
    assert missing == []
    methods = [
        name
        for name in dir(tenxstore.CheckpointRepository)
        if name.startswith("a") and callable(getattr(tenxstore.CheckpointRepository, name))
    ]
    assert [m for m in methods if f"{m}(" not in reference] == []


def test_the_readmes_first_errors_are_printed_as_quoted(tmp_path: Path) -> None:
    quoted = re.findall(r"^```text\n(tenxstore\.errors\.\w+: .*?)\n```", README_TEXT, re.M)
    script = """
import asyncio, tenxstore

def show(exc):
    print(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")

async def main():
    async with tenxstore.SqliteCheckpointer("agent_state.db") as cp:
        try:
            await cp.aget_state({"thread_id": "t-1", "user_id": "alice"})
        except tenxstore.SchemaNotReady as exc:
            show(exc)
        await cp.asetup()
        try:
            await cp.aget_state({"thread_id": "t-1"})
        except tenxstore.ConfigError as exc:
            show(exc)
    dsn, redis = "postgresql://postgres@localhost:5433/agents", "redis://localhost:6379/0"
    async with tenxstore.PgCheckpointer(postgres_dsn=dsn, redis_url=redis) as cp:
        try:
            await cp.aget_state({"thread_id": "t-1", "user_id": "alice"})
        except tenxstore.DatabaseUnavailable as exc:
            show(exc)

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == quoted
