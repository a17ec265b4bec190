"""LangGraph's own conformance suite against TenxCheckpointSaver, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks

import tenxstore
from tenxstore.langgraph import TenxCheckpointSaver
from tests import services
from tests.conftest import drop_schema, new_schema

REQUIRED = {"put", "put_writes", "get_tuple", "list", "delete_thread"}


def registered(backend: str, tmp_path: Path) -> Any:
    schemas: list[str] = []

    @checkpointer_test(name=f"TenxCheckpointSaver[{backend}]")
    async def saver() -> AsyncIterator[TenxCheckpointSaver]:
        if backend == "memory":
            cp: Any = tenxstore.InMemoryCheckpointer(enforce_user_isolation=False)
            schemas.append("")
        elif backend == "sqlite":
            cp = tenxstore.SqliteCheckpointer(
                tmp_path / f"lg{len(schemas)}.db", enforce_user_isolation=False
            )
            schemas.append("")
        else:
            schema = new_schema()
            schemas.append(schema)
            cp = tenxstore.CheckpointRepository(
                services.pg_url(), schema=schema, enforce_user_isolation=False
            )
            if backend == "postgresql+redis":
                cp = tenxstore.CachedCheckpointer(
                    cp, redis_url=services.redis_url(), key_prefix=schema
                )
        await cp.asetup()
        try:
            yield TenxCheckpointSaver(cp)
        finally:
            await cp.aclose()

    saver.schemas = schemas  # type: ignore[attr-defined]
    return saver


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgresql", "postgresql+redis"])
async def test_conformance(backend: str, tmp_path: Path) -> None:
    suite = registered(backend, tmp_path)
    failures: list[str] = []

    def record(capability: str, test: str, passed: bool, error: str | None) -> None:
        if not passed:
            failures.append(f"{capability}/{test}: {error}")

    try:
        report = await validate(suite, progress=ProgressCallbacks(on_test_result=record))
    finally:
        for schema in suite.schemas:
            if schema:
                await drop_schema(services.pg_url(), schema)
    report.print_report()
    results = report.to_dict()
    print(results)
    required_failures = [f for f in failures if f.split("/")[0] in REQUIRED]
    assert required_failures == []
    assert report.passed_all_base()
    for capability in ("copy_thread", "prune", "delete_for_runs"):  # the optional ones
        assert results["results"][capability]["passed"], capability
