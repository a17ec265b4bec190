"""Soak: worker processes hammer one PostgreSQL + Redis store, then every invariant is checked.

N worker processes share a few threads of two users and, until the deadline, mix
reads (cached), read-increment-write cycles that retry on ``StaleStateError`` (each
write appends one message), replay-safe tool calls, thread listings, reads of the
other user's threads (which must come back empty) and create-then-delete cycles.
Halfway through, the soak kills its own ``redis-server`` and starts it again.

At the end it checks, per thread: the head version equals the number of writes the
workers saw succeed, the state's counter equals the head version, the retained
versions are contiguous, message ids are unique, every write's message is there and
each worker's messages are in the order it wrote them; every tool call ran at most
once and its ledger row succeeded; every deleted thread is gone; the cache agrees
with the database. It prints a summary and exits 1 if anything is off.

    python benchmarks/soak.py --seconds 600 --workers 4
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' server runner

from tenxstore import (
    CheckpointRepository,
    PgCheckpointer,
    StaleStateError,
    ToolExecutionInProgress,
)
from tests.servers import RedisServer

PG_URL = os.environ.get("TENXSTORE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
USERS = ("alice", "bob")
TOOLS_PER_THREAD = 12


def owner(thread: str) -> str:
    return USERS[int(thread.rsplit("-", 1)[1]) % len(USERS)]


async def work(index: int, args: dict[str, Any], deadline: float) -> dict[str, Any]:
    """One worker's loop; returns what it saw succeed and what went wrong."""
    rng = random.Random(index)
    counts: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    writes: list[tuple[str, int, str]] = []  # thread, version, message id
    ran: list[tuple[str, int]] = []  # tool calls whose body ran here
    deleted: list[str] = []
    threads = [f"t-{j}" for j in range(args["threads"])]
    seq = 0
    cp = PgCheckpointer(
        postgres_dsn=PG_URL,
        redis_url=args["redis_url"],
        schema=args["schema"],
        key_prefix=args["prefix"],
        cache_ttl=300,
        pool_config={"pool_size": 4, "max_overflow": 0},
    )
    try:
        while time.monotonic() < deadline:
            op = rng.choices(
                ["read", "write", "tool", "list", "spy", "delete"], [30, 35, 15, 8, 7, 5]
            )[0]
            thread = rng.choice(threads)
            config: dict[str, Any] = {"thread_id": thread, "user_id": owner(thread)}
            try:
                if op == "read":
                    await cp.aget_state_cache(config)
                elif op == "write":
                    while True:
                        attempt = dict(config)
                        state = await cp.aget_state_cache(attempt) or {"n": 0}
                        seq += 1
                        message = {
                            "id": f"w{index}-{seq}",
                            "role": "user",
                            "seq": seq,
                            "worker": index,
                        }
                        try:
                            version = await cp.aput_checkpoint(
                                attempt, {"n": state["n"] + 1, "by": index}, [message]
                            )
                        except StaleStateError:
                            counts["conflict"] += 1
                            continue
                        writes.append((thread, version, message["id"]))
                        break
                elif op == "tool":
                    k = rng.randrange(TOOLS_PER_THREAD)

                    def body(k: int, thread: str = thread) -> dict[str, int]:
                        ran.append((thread, k))
                        return {"k": k}

                    try:
                        result = await cp.arun_tool_once(
                            config, f"tool-{k}", "work", {"k": k}, body
                        )
                        if result != {"k": k}:
                            errors["tool result differs"] += 1
                    except ToolExecutionInProgress:
                        counts["tool in progress"] += 1
                elif op == "list":
                    listed = await cp.alist_threads({"user_id": config["user_id"]})
                    if any(t.user_id != config["user_id"] for t in listed):
                        errors["listing shows another user's thread"] += 1
                elif op == "spy":
                    other = next(u for u in USERS if u != config["user_id"])
                    spy = {"thread_id": thread, "user_id": other}
                    if await cp.aget_state_cache(spy) is not None or await cp.aget_messages(spy):
                        errors["another user's thread was readable"] += 1
                else:
                    seq += 1
                    eph = {"thread_id": f"eph-{index}-{seq}", "user_id": config["user_id"]}
                    await cp.aput_checkpoint(eph, {"short": "lived"}, [{"id": "m"}])
                    await cp.arun_tool_once(eph, "c", "t", {}, lambda: 1)
                    if not await cp.aclean_thread(eph):
                        errors["delete found nothing"] += 1
                    deleted.append(eph["thread_id"])
                counts[op] += 1
            except Exception as exc:  # counted and reported; the soak fails on any
                errors[f"{op}: {type(exc).__name__}: {exc}"[:160]] += 1
    finally:
        await cp.aclose()
    return {"counts": counts, "errors": errors, "writes": writes, "ran": ran, "deleted": deleted}


def worker_main(index: int, args: dict[str, Any], start_at: float, out: Any) -> None:
    deadline = time.monotonic() + (start_at - time.time()) + args["seconds"]
    out.put(asyncio.run(work(index, args, deadline)))


async def verify(args: dict[str, Any], logs: list[dict[str, Any]]) -> list[str]:
    """Every invariant, against the database and the cache; the failures found."""
    problems: list[str] = []
    writes: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for log in logs:
        for thread, version, message_id in log["writes"]:
            writes[thread].append((version, message_id))
    ran = collections.Counter((t, k) for log in logs for t, k in log["ran"])
    async with PgCheckpointer(
        postgres_dsn=PG_URL,
        redis_url=args["redis_url"],
        schema=args["schema"],
        key_prefix=args["prefix"],
    ) as cp:
        repo: CheckpointRepository = cp.inner
        for j in range(args["threads"]):
            thread = f"t-{j}"
            config = {"thread_id": thread, "user_id": owner(thread)}
            seen = writes[thread]
            state = await repo.aget_state(config)
            head = config["_checkpoint_version"]
            if head != len(seen):
                problems.append(f"{thread}: head version {head}, {len(seen)} writes succeeded")
            if sorted(v for v, _ in seen) != list(range(1, len(seen) + 1)):
                problems.append(f"{thread}: the versions the writers got are not 1..{len(seen)}")
            if seen and (state or {}).get("n") != head:
                problems.append(f"{thread}: counter {(state or {}).get('n')} at version {head}")
            retained = [s.version for s in await repo.alist_states(config)]
            expected = list(range(head, max(0, head - repo.state_history_limit), -1))
            if retained != expected:
                problems.append(f"{thread}: retained versions {retained[:5]}... not contiguous")
            messages = await repo.aget_messages(config)
            ids = [m["id"] for m in messages]
            if len(ids) != len(set(ids)):
                problems.append(f"{thread}: duplicate message ids")
            if set(ids) != {m for _, m in seen}:
                problems.append(f"{thread}: messages {len(ids)} differ from writes {len(seen)}")
            by_worker: dict[int, list[int]] = collections.defaultdict(list)
            for m in messages:
                by_worker[m["worker"]].append(m["seq"])
            if any(s != sorted(s) for s in by_worker.values()):
                problems.append(f"{thread}: a worker's messages are out of order")
            cached_config = dict(config)
            if await cp.aget_state_cache(cached_config) != state or (
                cached_config["_checkpoint_version"] != head
            ):
                problems.append(f"{thread}: the cache disagrees with the database")
            for k in range(TOOLS_PER_THREAD):
                record = await repo.aget_tool_execution(config, f"tool-{k}")
                runs = ran[(thread, k)]
                if runs > 1:
                    problems.append(f"{thread} tool-{k}: the body ran {runs} times")
                if runs and (record is None or record.status != "succeeded"):
                    problems.append(f"{thread} tool-{k}: ran but the ledger says {record}")
        for log in logs:
            for thread in log["deleted"]:
                if await repo.aget_thread(
                    {"thread_id": thread, "user_id": USERS[0]}
                ) or await repo.aget_thread({"thread_id": thread, "user_id": USERS[1]}):
                    problems.append(f"{thread}: deleted, yet still there")
    return problems


async def drop_schema(schema: str) -> None:
    conn = await asyncpg.connect(PG_URL)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument(
        "--redis-down", type=float, default=2.0, help="seconds Redis stays down in the middle"
    )
    parser.add_argument("--keep", action="store_true", help="keep the schema afterwards")
    options = parser.parse_args()

    schema = f"soak_{uuid.uuid4().hex[:8]}"
    directory = tempfile.mkdtemp(prefix="tenxstore-soak-")
    redis = RedisServer(Path(directory))
    redis.start()
    args = {
        "schema": schema,
        "redis_url": f"redis://127.0.0.1:{redis.port}/0",
        "prefix": schema,
        "threads": options.threads,
        "seconds": options.seconds,
    }

    async def setup() -> None:
        async with CheckpointRepository(PG_URL, schema=schema) as repo:
            await repo.asetup()

    asyncio.run(setup())
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3  # the workers start together, once imported
    workers = [
        ctx.Process(target=worker_main, args=(i, args, start_at, out))
        for i in range(options.workers)
    ]
    started = time.monotonic()
    for w in workers:
        w.start()
    try:
        time.sleep(max(0.0, start_at - time.time()) + options.seconds / 2)
        redis.kill()
        print(f"redis killed at {time.monotonic() - started:.1f}s", flush=True)
        time.sleep(options.redis_down)
        redis.start()
        print(f"redis back at {time.monotonic() - started:.1f}s", flush=True)
        logs = [out.get(timeout=options.seconds + 120) for _ in workers]
        for w in workers:
            w.join(60)
        problems = asyncio.run(verify(args, logs))
    finally:
        redis.kill()
        shutil.rmtree(directory, ignore_errors=True)
        if not options.keep:
            asyncio.run(drop_schema(schema))

    counts: collections.Counter[str] = sum((log["counts"] for log in logs), collections.Counter())
    errors: collections.Counter[str] = sum((log["errors"] for log in logs), collections.Counter())
    operations = sum(
        v for k, v in counts.items() if k in ("read", "write", "tool", "list", "spy", "delete")
    )
    print(
        f"\nsoak: {options.workers} workers x {options.seconds:g}s, {options.threads} threads, "
        f"Redis down {options.redis_down:g}s in the middle"
    )
    print(
        f"operations: {operations} ({operations / options.seconds:.0f}/s)  "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    print(
        f"writes that succeeded: {sum(len(log['writes']) for log in logs)}; "
        f"tool bodies run: {sum(len(log['ran']) for log in logs)}; "
        f"threads created and deleted: {sum(len(log['deleted']) for log in logs)}"
    )
    print(f"errors: {sum(errors.values())}" + "".join(f"\n  {v} x {k}" for k, v in errors.items()))
    print(f"invariants: {'all hold' if not problems else f'{len(problems)} broken'}")
    for problem in problems:
        print(f"  {problem}")
    return 1 if problems or errors or any(w.exitcode for w in workers) else 0


if __name__ == "__main__":
    sys.exit(main())
