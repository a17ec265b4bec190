"""The replay-safe tool ledger (every backend; processes on SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from tenxstore import (
    CheckpointRepository,
    ConfigError,
    SerializationError,
    ThreadOwnershipError,
    ToolExecutionInProgress,
    ToolExecutionMismatch,
    ToolExecutionNotFound,
)
from tests.conftest import Backend, cfg


async def test_claim_complete_then_replay(cp: CheckpointRepository) -> None:
    claim = await cp.abegin_tool_execution(cfg(), "call-1", "send_email", {"to": "x@y"})
    assert (claim.status, claim.attempts, claim.result, claim.finished_at) == (
        "started",
        1,
        None,
        None,
    )
    assert claim.lease_expires_at is not None and claim.lease_expires_at > claim.started_at
    info = await cp.aget_thread(cfg())
    assert info is not None and info.version == 0  # the claim created the thread
    with pytest.raises(ToolExecutionInProgress):
        await cp.abegin_tool_execution(cfg(), "call-1", "send_email", {"to": "x@y"})
    done = await cp.acomplete_tool_execution(cfg(), "call-1", {"sent": True})
    assert (done.status, done.result, done.error) == ("succeeded", {"sent": True}, None)
    assert done.finished_at is not None
    again = await cp.abegin_tool_execution(cfg(), "call-1", "send_email", {"to": "x@y"})
    assert again == done
    assert await cp.acomplete_tool_execution(cfg(), "call-1", {"sent": "twice"}) == done
    assert await cp.afail_tool_execution(cfg(), "call-1", "late failure") == done
    assert await cp.aget_tool_execution(cfg(), "call-1") == done
    assert await cp.aget_tool_execution(cfg(), "other") is None


async def test_run_once_survives_a_restart(sql_backend: Backend) -> None:
    calls: list[int] = []

    def charge(amount: int) -> dict[str, int]:
        calls.append(amount)
        return {"charged": amount}

    first = await sql_backend.make()
    assert await first.arun_tool_once(cfg(), "pay-1", "charge", {"amount": 5}, charge) == {
        "charged": 5
    }
    await first.aclose()
    restarted = await sql_backend.make()
    assert await restarted.arun_tool_once(cfg(), "pay-1", "charge", {"amount": 5}, charge) == {
        "charged": 5
    }
    assert calls == [5]


async def test_concurrent_run_once_runs_the_body_once(cp: CheckpointRepository) -> None:
    runs, collisions = 0, 0
    release = asyncio.Event()

    async def tool(x: int) -> int:
        nonlocal runs
        runs += 1
        await release.wait()  # hold the claim until every other worker collided
        return x * 2

    async def worker() -> Any:
        nonlocal collisions
        while True:
            try:
                return await cp.arun_tool_once(cfg(), "c", "double", {"x": 21}, tool)
            except ToolExecutionInProgress:
                collisions += 1
                if collisions >= 7:
                    release.set()
                await asyncio.sleep(0)

    results = await asyncio.gather(*(worker() for _ in range(8)))
    assert results == [42] * 8
    assert runs == 1
    assert collisions >= 7


async def test_failure_is_recorded_then_retried(cp: CheckpointRepository) -> None:
    attempts: list[int] = []

    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("boom \x00")
        return "ok"

    with pytest.raises(RuntimeError, match="boom"):
        await cp.arun_tool_once(cfg(), "f", "flaky", {}, flaky)
    failed = await cp.aget_tool_execution(cfg(), "f")
    assert failed is not None
    assert (failed.status, failed.error, failed.attempts) == (
        "failed",
        "RuntimeError: boom \x00",
        1,
    )
    assert await cp.arun_tool_once(cfg(), "f", "flaky", {}, flaky) == "ok"
    record = await cp.aget_tool_execution(cfg(), "f")
    assert record is not None and (record.status, record.attempts) == ("succeeded", 2)
    assert record.error is None


async def test_an_expired_lease_is_taken_over(backend: Backend) -> None:
    cp = await backend.make(tool_lease_seconds=0.05)
    first = await cp.abegin_tool_execution(cfg(), "slow", "crawl", {"url": "u"})
    assert first.lease_expires_at is not None
    with pytest.raises(ToolExecutionInProgress) as err:
        await cp.abegin_tool_execution(cfg(), "slow", "crawl", {"url": "u"})
    assert err.value.tool_call_id == "slow"
    await asyncio.sleep(0.1)  # the lease is a time: let it pass
    second = await cp.abegin_tool_execution(cfg(), "slow", "crawl", {"url": "u"})
    assert (second.status, second.attempts) == ("started", 2)
    done = await cp.acomplete_tool_execution(cfg(), "slow", "page")
    assert (done.attempts, done.result) == (2, "page")


async def test_mismatch_not_found_and_bad_input(cp: CheckpointRepository) -> None:
    await cp.abegin_tool_execution(cfg(), "c", "search", {"q": "a", "n": 1})
    with pytest.raises(ToolExecutionMismatch):
        await cp.abegin_tool_execution(cfg(), "c", "other_tool", {"q": "a", "n": 1})
    with pytest.raises(ToolExecutionMismatch):
        await cp.abegin_tool_execution(cfg(), "c", "search", {"q": "b", "n": 1})
    with pytest.raises(ToolExecutionInProgress):  # same call, other key order: not a mismatch
        await cp.abegin_tool_execution(cfg(), "c", "search", {"n": 1, "q": "a"})
    for call in (
        cp.acomplete_tool_execution(cfg(), "never", 1),
        cp.afail_tool_execution(cfg(), "never", "x"),
        cp.acomplete_tool_execution(cfg("no-thread"), "c", 1),
    ):
        with pytest.raises(ToolExecutionNotFound):
            await call
    with pytest.raises(LookupError):
        await cp.afail_tool_execution(cfg(), "never", "x")
    for bad in ("", "x" * 256, "a\x00", 5):
        with pytest.raises(ConfigError):
            await cp.abegin_tool_execution(cfg(), bad, "t", {})  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        await cp.abegin_tool_execution(cfg(), "d", "", {})
    with pytest.raises(SerializationError):
        await cp.abegin_tool_execution(cfg(), "d", "t", {"bad": object()})
    with pytest.raises(SerializationError):
        await cp.abegin_tool_execution(cfg(), "d", "t", ["not", "a", "dict"])  # type: ignore[arg-type]
    assert await cp.aget_tool_execution(cfg(), "d") is None


async def test_unserializable_result_is_a_recorded_failure(cp: CheckpointRepository) -> None:
    with pytest.raises(SerializationError):
        await cp.arun_tool_once(cfg(), "u", "make", {}, lambda: {"obj": object()})
    record = await cp.aget_tool_execution(cfg(), "u")
    assert record is not None and record.status == "failed"
    assert record.error is not None and "unserializable" in record.error


async def test_the_ledger_obeys_isolation(cp: CheckpointRepository) -> None:
    await cp.arun_tool_once(cfg(), "c", "t", {}, lambda: "alice's")
    mallory = cfg(user="mallory")
    assert await cp.aget_tool_execution(mallory, "c") is None
    for call in (
        cp.abegin_tool_execution(mallory, "c", "t", {}),
        cp.abegin_tool_execution(mallory, "new", "t", {}),
        cp.acomplete_tool_execution(mallory, "c", "hijack"),
        cp.afail_tool_execution(mallory, "c", "hijack"),
    ):
        with pytest.raises(ThreadOwnershipError):
            await call
    with pytest.raises(ThreadOwnershipError):
        await cp.arun_tool_once(mallory, "c", "t", {}, lambda: "mallory's")
    record = await cp.aget_tool_execution(cfg(), "c")
    assert record is not None and record.result == "alice's"


async def test_clean_thread_removes_the_ledger(cp: CheckpointRepository) -> None:
    await cp.arun_tool_once(cfg(), "c", "t", {}, lambda: 1)
    assert await cp.aclean_thread(cfg()) is True
    assert await cp.aget_tool_execution(cfg(), "c") is None
    assert await cp.arun_tool_once(cfg(), "c", "t", {}, lambda: 2) == 2


def _run_once_in_process(
    url: str,
    schema: str | None,
    options: dict[str, Any],
    marks: str,
    barrier: Any,
    collided: Any,
    done: Any,
    out: Any,
) -> None:
    def tool(n: int) -> int:
        with open(marks, "a") as f:  # the side effect that must happen once
            f.write("ran\n")
        # Hold the claim until the three other processes have collided with it.
        deadline = 600
        while collided.value < 3 and deadline:
            done.wait(0.05)
            deadline -= 1
        return n + 1

    async def run() -> Any:
        async with CheckpointRepository(url, schema=schema, **options) as repo:
            barrier.wait(timeout=60)
            counted = False
            while True:
                try:
                    result = await repo.arun_tool_once(cfg(), "once", "inc", {"n": 41}, tool)
                    done.set()
                    return result
                except ToolExecutionInProgress:
                    if not counted:
                        with collided.get_lock():
                            collided.value += 1
                        counted = True
                    await asyncio.to_thread(done.wait, 30)

    out.put(asyncio.run(run()))


@pytest.mark.slow
async def test_processes_run_the_body_once(sql_backend: Backend, tmp_path: Path) -> None:
    await sql_backend.make()
    assert sql_backend.url is not None
    marks = tmp_path / "marks"
    ctx = multiprocessing.get_context("spawn")
    barrier, collided, done, out = ctx.Barrier(4), ctx.Value("i", 0), ctx.Event(), ctx.Queue()
    workers = [
        ctx.Process(
            target=_run_once_in_process,
            args=(
                sql_backend.url,
                sql_backend.schema,
                sql_backend.options,
                str(marks),
                barrier,
                collided,
                done,
                out,
            ),
        )
        for _ in range(4)
    ]
    for w in workers:
        w.start()
    results = [await asyncio.to_thread(out.get, True, 120) for _ in workers]
    await asyncio.to_thread(lambda: [w.join(60) for w in workers])
    assert [w.exitcode for w in workers] == [0] * 4
    assert results == [42] * 4
    assert marks.read_text() == "ran\n"
    assert collided.value == 3
