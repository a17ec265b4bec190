"""The replay-safe tool ledger (every backend; processes on SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tenxstore import (
    CheckpointRepository,
    ConfigError,
    SerializationError,
    StaleStateError,
    ThreadOwnershipError,
    ToolExecution,
    ToolExecutionClaimLost,
    ToolExecutionInProgress,
    ToolExecutionMismatch,
    ToolExecutionNotFound,
)
from tests import procs
from tests.conftest import Backend, backend_for, cfg


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


async def lease_for(backend: Backend) -> float:
    """A lease long enough that the checks inside it finish before it ends, measured on
    this backend now (a busy 2-core machine is slow), and short enough to wait out."""
    probe = await backend.make()
    started = time.perf_counter()
    for i in range(3):
        await probe.abegin_tool_execution(cfg("probe"), f"p{i}", "probe", {})
    per_call = (time.perf_counter() - started) / 3
    return min(max(0.3, 40 * per_call), 5.0)


async def until_expired(record: ToolExecution) -> None:
    """Wait for a claim's lease to end (on the database's clock, this host's here)."""
    assert record.lease_expires_at is not None
    left = (record.lease_expires_at - datetime.now(timezone.utc)).total_seconds()
    await asyncio.sleep(max(0.0, left) + 0.02)  # the lease is a time: let it pass


Live = list[ToolExecution | None]


async def with_a_live_claim(
    backend: Backend, scenario: Callable[[Any, str, Live], Awaitable[None]]
) -> None:
    """Run ``scenario(cp, call, live)``, whose checks need the claim it appends to
    ``live`` to be live (``None`` appended: those checks are done). A machine so busy
    that the claim's lease ended before them proves nothing: the scenario runs again
    with a lease four times as long — only then; any other failure fails the test."""
    lease = await lease_for(backend)
    for attempt in range(3):
        cp = await backend.make(tool_lease_seconds=lease)
        live: Live = []
        try:
            await scenario(cp, f"call-{attempt}", live)
            return
        except (AssertionError, pytest.fail.Exception):
            claim = live[-1] if live else None
            if claim is None or claim.lease_expires_at is None:
                raise  # no claim to blame, or its checks were done
            if datetime.now(timezone.utc) < claim.lease_expires_at:
                raise  # the claim was still live: a real failure
            lease *= 4
    pytest.fail("the claim's lease ended before its checks three times over, at 16x")


async def test_an_expired_lease_is_taken_over(backend: Backend) -> None:
    await with_a_live_claim(backend, _take_over_scenario)


async def _take_over_scenario(cp: Any, call: str, live: Live) -> None:
    first = await cp.abegin_tool_execution(cfg(), call, "crawl", {"url": "u"})
    live.append(first)
    with pytest.raises(ToolExecutionInProgress) as err:
        await cp.abegin_tool_execution(cfg(), call, "crawl", {"url": "u"})
    live.append(None)
    assert err.value.tool_call_id == call
    assert err.value.lease_expires_at == first.lease_expires_at
    await until_expired(first)
    second = await cp.abegin_tool_execution(cfg(), call, "crawl", {"url": "u"})
    assert (second.status, second.attempts) == ("started", 2)
    done = await cp.acomplete_tool_execution(cfg(), call, "page", attempt=second.attempts)
    assert (done.attempts, done.result) == (2, "page")


async def test_a_stale_worker_never_frees_a_live_claim(backend: Backend) -> None:
    """Worker A's late outcome, naming its attempt, is refused while B's claim is live;
    once B's lease ends too, A's late success is the first success."""
    await with_a_live_claim(backend, _stale_attempt_scenario)


async def _stale_attempt_scenario(cp: Any, call: str, live: Live) -> None:
    a = await cp.abegin_tool_execution(cfg(), call, "charge", {"amount": 5})
    await until_expired(a)
    b = await cp.abegin_tool_execution(cfg(), call, "charge", {"amount": 5})
    live.append(b)
    assert b.attempts == a.attempts + 1
    # A's body fails late: refused, and B's claim stays live.
    with pytest.raises(ToolExecutionClaimLost) as lost:
        await cp.afail_tool_execution(cfg(), call, "A gave up", attempt=a.attempts)
    assert (lost.value.attempt, lost.value.current_attempt) == (1, 2)
    with pytest.raises(ToolExecutionInProgress):
        await cp.abegin_tool_execution(cfg(), call, "charge", {"amount": 5})
    # A's late success does not overwrite B's live claim either.
    with pytest.raises(ToolExecutionClaimLost):
        await cp.acomplete_tool_execution(cfg(), call, "paid by A", attempt=a.attempts)
    record = await cp.aget_tool_execution(cfg(), call)
    assert record is not None and (record.status, record.attempts) == ("started", 2)
    live.append(None)  # B's live checks passed: a failure from here on is real
    # Once B's claim has expired too, a late success is still the first success.
    await until_expired(b)
    late = await cp.acomplete_tool_execution(cfg(), call, "paid by A", attempt=a.attempts)
    assert (late.status, late.result) == ("succeeded", "paid by A")
    assert await cp.acomplete_tool_execution(cfg(), call, "paid by B", attempt=b.attempts) == late


async def test_a_stale_worker_without_attempt_never_frees_a_live_claim(backend: Backend) -> None:
    """The SPEC's three-argument calls: each worker task's outcome names the claim that
    task took, so worker A's late failure cannot free worker B's claim."""
    await with_a_live_claim(backend, _stale_worker_scenario)


async def _stale_worker_scenario(cp: Any, call: str, live: Live) -> None:
    a_claimed, a_may_fail = asyncio.Event(), asyncio.Event()

    async def worker_a() -> None:
        a = await cp.abegin_tool_execution(cfg(), call, "charge", {"amount": 1})
        a_claimed.set()
        await until_expired(a)
        await a_may_fail.wait()
        with pytest.raises(ToolExecutionClaimLost):
            await cp.afail_tool_execution(cfg(), call, "A timed out")
        with pytest.raises(ToolExecutionClaimLost):
            await cp.acomplete_tool_execution(cfg(), call, "paid by A, late")

    async def worker_b() -> None:
        await a_claimed.wait()
        while True:  # A's lease ends on the database's clock
            try:
                b = await cp.abegin_tool_execution(cfg(), call, "charge", {"amount": 1})
                break
            except ToolExecutionInProgress as busy:
                left = (busy.lease_expires_at - datetime.now(timezone.utc)).total_seconds()
                await asyncio.sleep(max(0.0, left) + 0.02)
        live.append(b)
        assert (b.status, b.attempts) == ("started", 2)
        a_may_fail.set()

    await asyncio.gather(worker_a(), worker_b())
    with pytest.raises(ToolExecutionInProgress):  # B's claim is still live
        await cp.abegin_tool_execution(cfg(), call, "charge", {"amount": 1})
    live.append(None)
    done = await cp.acomplete_tool_execution(cfg(), call, "paid by B", attempt=2)
    assert (done.status, done.result, done.attempts) == ("succeeded", "paid by B", 2)


async def test_the_claiming_task_completes_without_naming_its_attempt(
    cp: CheckpointRepository,
) -> None:
    first = await cp.abegin_tool_execution(cfg(), "c", "tool", {})
    await cp.afail_tool_execution(cfg(), "c", "flaky")  # this task's claim (attempt 1)
    second = await cp.abegin_tool_execution(cfg(), "c", "tool", {})
    assert (first.attempts, second.attempts) == (1, 2)
    done = await cp.acomplete_tool_execution(cfg(), "c", "ok")  # this task's claim: 2
    assert (done.status, done.attempts) == ("succeeded", 2)


async def test_a_cancellation_propagates_when_the_claim_is_refused(
    cp: CheckpointRepository,
) -> None:
    await cp.abegin_tool_execution(cfg(), "held", "tool", {})  # another worker's live claim
    call = asyncio.ensure_future(cp.arun_tool_once(cfg(), "held", "tool", {}, lambda: 1))
    await asyncio.sleep(0)  # the claim is on its way
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert call.cancelled()


async def test_a_cancelled_call_gives_its_claim_back(cp: CheckpointRepository) -> None:
    running = asyncio.Event()

    async def hangs() -> str:
        running.set()
        await asyncio.Event().wait()  # until cancelled
        return "never"

    call = asyncio.ensure_future(cp.arun_tool_once(cfg(), "c", "crawl", {}, hangs))
    await running.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    record = await cp.aget_tool_execution(cfg(), "c")
    assert record is not None and record.status == "failed"
    assert record.error is not None and "cancelled" in record.error
    # The next call claims at once (lease 900 s): it does not wait the lease out.
    assert await cp.arun_tool_once(cfg(), "c", "crawl", {}, lambda: "page") == "page"
    with pytest.raises(asyncio.TimeoutError):  # the builtin TimeoutError only from 3.11
        await asyncio.wait_for(cp.arun_tool_once(cfg(), "d", "crawl", {}, hangs), 0.2)
    again = await cp.aget_tool_execution(cfg(), "d")
    assert again is not None and again.status == "failed"


async def test_a_cancellation_after_the_body_returned_records_its_result(
    cp: CheckpointRepository,
) -> None:
    ran: list[int] = []

    async def pays() -> str:
        ran.append(1)
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # arrives at the next await: recording the result
        return "paid"

    with pytest.raises(asyncio.CancelledError):
        await cp.arun_tool_once(cfg(), "pay", "charge", {}, pays)
    record = await cp.aget_tool_execution(cfg(), "pay")
    assert record is not None and (record.status, record.result) == ("succeeded", "paid")
    assert await cp.arun_tool_once(cfg(), "pay", "charge", {}, pays) == "paid"
    assert ran == [1]


async def test_arguments_are_compared_as_typed_json(cp: CheckpointRepository) -> None:
    assert await cp.arun_tool_once(cfg(), "pay", "charge", {"amount": 1}, lambda amount: amount)
    for other in ({"amount": True}, {"amount": 1.0}, {"amount": "1"}, {"amount": [1]}):
        with pytest.raises(ToolExecutionMismatch):
            await cp.arun_tool_once(cfg(), "pay", "charge", other, lambda amount: amount)
    nested = {"a": {"x": 1, "y": [1, 2]}, "b": 2}
    await cp.arun_tool_once(cfg(), "n", "t", nested, lambda a, b: b)
    same = {"b": 2, "a": {"y": [1, 2], "x": 1}}  # key order is not part of a call
    assert await cp.arun_tool_once(cfg(), "n", "t", same, lambda a, b: -1) == 2


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


async def test_a_result_that_cannot_be_stored_is_not_run_again(cp: CheckpointRepository) -> None:
    ran: list[int] = []

    def make() -> dict[str, Any]:
        ran.append(1)
        return {"when": datetime.now(timezone.utc)}  # the side effect happened

    for _ in range(3):
        with pytest.raises(SerializationError, match="cannot be stored"):
            await cp.arun_tool_once(cfg(), "u", "make", {}, make)
    assert ran == [1]
    record = await cp.aget_tool_execution(cfg(), "u")
    assert record is not None and (record.status, record.result) == ("succeeded", None)
    assert record.error is not None and "cannot be stored" in record.error


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
    ctx = procs.context()
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


async def test_an_outcome_of_a_claim_from_a_deleted_life_changes_nothing(
    cp: CheckpointRepository,
) -> None:
    first = await cp.abegin_tool_execution(cfg(), "call", "send", {"to": "x"})  # worker A

    async def new_life() -> None:  # another task: its own context
        await cp.aclean_thread(cfg())
        claim = await cp.abegin_tool_execution(cfg(), "call", "send", {"to": "x"})
        assert (claim.status, claim.attempts) == ("started", first.attempts)

    await asyncio.ensure_future(new_life())
    with pytest.raises(ToolExecutionClaimLost) as lost:
        await cp.afail_tool_execution(cfg(), "call", "A gave up")  # A's claim: a life gone
    assert lost.value.replaced and "deleted or replaced" in str(lost.value)
    with pytest.raises(ToolExecutionInProgress):
        await cp.abegin_tool_execution(cfg(), "call", "send", {"to": "x"})  # worker C


ERASURES: dict[str, Callable[[Any], Awaitable[Any]]] = {
    "aclean_thread": lambda cp: cp.aclean_thread(cfg()),
    "adelete_user": lambda cp: cp.adelete_user("alice"),
    "aprune_idle": lambda cp: cp.aprune_idle(timedelta(microseconds=1)),
}


@pytest.mark.parametrize("erase", list(ERASURES))
async def test_a_run_from_before_an_erasure_never_writes_through_the_ledger(
    cp: CheckpointRepository, erase: str
) -> None:
    """A run read alice's thread; then she was erased. Its tool call must not bring her
    thread back (owned by her, holding the tool's arguments and result): the claim is
    StaleStateError, as the run's state write is, and the body never runs."""
    await cp.aput_checkpoint(cfg(), {"step": 1}, [{"id": "m1", "content": "hi"}])
    run = cfg()
    assert await cp.aget_state_cache(run) == {"step": 1}  # the run records what it read
    replica = cfg(**{"_checkpoint_version": run["_checkpoint_version"]})  # no life known
    await ERASURES[erase](cp)
    assert await cp.alist_threads({"user_id": "alice"}) == []
    ran: list[str] = []
    for config in (run, replica):
        with pytest.raises(StaleStateError) as stale:
            await cp.abegin_tool_execution(config, "call", "charge", {"amount": 5})
        assert stale.value.replaced
        with pytest.raises(StaleStateError):
            await cp.arun_tool_once(config, "call", "charge", {"amount": 5}, ran.append)
        with pytest.raises(StaleStateError):
            await cp.aput_state(config, {"step": 2})
    assert ran == [] and await cp.alist_threads({"user_id": "alice"}) == []
    assert await cp.aget_tool_execution(cfg(), "call") is None
    # a thread written again since is another life: the old run still may not claim
    await cp.aput_state(cfg(user="alice"), {"new": "life"})
    with pytest.raises(StaleStateError):
        await cp.abegin_tool_execution(run, "call", "charge", {"amount": 5})
    assert await cp.alist_tool_executions(cfg()) == []
    # a run that never read (or read the thread absent) claims as before
    fresh = cfg("t2")
    assert await cp.aget_state(fresh) is None
    claim = await cp.abegin_tool_execution(fresh, "call", "charge", {"amount": 5})
    assert claim.status == "started"


async def test_a_result_too_large_for_the_server_is_not_run_again(tmp_path: Path) -> None:
    """MariaDB refuses a statement over max_allowed_packet (16 MB by default): the body
    has run, so the call is recorded as succeeded without its result, and no later
    call — even once the lease is long over — runs it again."""
    async with backend_for("mariadb", tmp_path) as backend:
        cp = await backend.make(tool_lease_seconds=0.05)
        ran: list[int] = []

        def fetch() -> str:
            ran.append(1)
            return "x" * (17 * 2**20)  # the side effect happened; its result is 17 MB

        for _ in range(3):
            with pytest.raises(SerializationError, match="too large"):
                await cp.arun_tool_once(cfg(), "big", "fetch", {}, fetch)
            assert await cp.aget_tool_execution(cfg(), "big") is not None
        assert ran == [1]
        record = await cp.aget_tool_execution(cfg(), "big")
        assert record is not None and (record.status, record.result) == ("succeeded", None)
        assert record.error is not None and "max_allowed_packet" in record.error
