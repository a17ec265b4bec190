"""Writers in separate OS processes on one database (PostgreSQL and a SQLite file)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tenxstore import CheckpointRepository, StaleStateError
from tests import procs
from tests.conftest import Backend

PROCESSES, CYCLES = 4, 25


def _increment_in_process(
    url: str, schema: str | None, options: dict[str, Any], barrier: Any, results: Any
) -> None:
    async def run() -> tuple[int, list[str]]:
        conflicts, errors = 0, []
        async with CheckpointRepository(url, schema=schema, **options) as repo:
            barrier.wait(timeout=60)
            for _ in range(CYCLES):
                while True:
                    config = {"thread_id": "shared", "user_id": "u"}
                    try:
                        state = await repo.aget_state(config) or {"n": 0}
                        await repo.aput_state(config, {"n": state["n"] + 1})
                        break
                    except StaleStateError:
                        conflicts += 1
                    except Exception as exc:  # reported to the parent, which fails the test
                        errors.append(f"{type(exc).__name__}: {exc}")
                        break
        return conflicts, errors

    results.put(asyncio.run(run()))


@pytest.mark.slow
async def test_processes_increment_one_thread(sql_backend: Backend) -> None:
    repo = await sql_backend.make()
    assert sql_backend.url is not None
    ctx = procs.context()
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    workers = [
        ctx.Process(
            target=_increment_in_process,
            args=(sql_backend.url, sql_backend.schema, sql_backend.options, barrier, results),
        )
        for _ in range(PROCESSES)
    ]
    for w in workers:
        w.start()
    outcomes = [await asyncio.to_thread(results.get, True, 180) for _ in workers]
    await asyncio.to_thread(lambda: [w.join(60) for w in workers])
    assert [w.exitcode for w in workers] == [0] * PROCESSES
    errors = [e for _, errs in outcomes for e in errs]
    assert errors == []  # in particular no "database is locked"
    total = PROCESSES * CYCLES
    config = {"thread_id": "shared", "user_id": "u"}
    assert await repo.aget_state(config) == {"n": total}
    assert config["_checkpoint_version"] == total
    versions = [s.version for s in await repo.alist_states(config)]
    assert versions == list(range(total, total - repo.state_history_limit, -1))
    assert sum(c for c, _ in outcomes) > 0, "the processes never actually raced"
