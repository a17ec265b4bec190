"""One long-lived checkpointer, many event loops: ``asyncio.run`` per request, loops in
worker threads, and engines or clients the caller bound to a loop that has ended."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import create_async_engine

import tenxstore
from tenxstore import CachedCheckpointer, CheckpointRepository, ConfigError
from tests import services
from tests.conftest import cfg, drop_schema, new_schema

NAMES = ["memory", "sqlite", "postgresql", "pgbouncer", "sqlite+redis", "postgresql+redis"]


@pytest.fixture
def schema() -> Iterator[str]:
    name = new_schema()
    yield name
    asyncio.run(drop_schema(services.pg_url(), name))


def make(name: str, tmp_path: Path, schema: str) -> Any:
    """A checkpointer made outside any event loop, as a module-level global would be."""
    if name == "memory":
        return tenxstore.InMemoryCheckpointer()
    if name.startswith("sqlite"):
        repo = CheckpointRepository(f"sqlite:///{tmp_path / 'loops.db'}")
    elif name == "pgbouncer":
        repo = CheckpointRepository(
            services.pgbouncer_url(), schema=schema, pool_mode="transaction"
        )
    else:
        repo = CheckpointRepository(services.pg_url(), schema=schema)
    if name.endswith("+redis"):
        return CachedCheckpointer(repo, redis_url=services.redis_url(), key_prefix=schema)
    return repo


async def turn(cp: Any, n: int, thread: str = "t1") -> int:
    """One request: read through the cache, write the next state."""
    config = cfg(thread)
    state = await cp.aget_state_cache(config) or {"n": 0}
    assert state["n"] == n
    version: int = await cp.aput_state(config, {"n": n + 1})
    return version


@pytest.mark.parametrize("name", NAMES)
def test_asyncio_run_per_request(name: str, tmp_path: Path, schema: str) -> None:
    cp = make(name, tmp_path, schema)
    cp.setup()
    for n in range(4):
        assert asyncio.run(turn(cp, n)) == n + 1
    asyncio.run(cp.aclose())
    gc.collect()  # a connection left to the collector warns here, and warnings are errors


@pytest.mark.parametrize("name", NAMES)
def test_a_loop_in_a_worker_thread_beside_the_main_one(
    name: str, tmp_path: Path, schema: str
) -> None:
    cp = make(name, tmp_path, schema)
    cp.setup()

    async def main() -> None:
        assert await turn(cp, 0, "main") == 1
        # LangGraph's sync API from a worker thread runs its own loop meanwhile.
        assert await asyncio.to_thread(asyncio.run, turn(cp, 0, "worker")) == 1
        assert await turn(cp, 1, "main") == 2
        await cp.aclose()

    asyncio.run(main())
    gc.collect()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_callers_engine_bound_to_a_dead_loop_is_a_config_error(schema: str) -> None:
    url = services.pg_url().replace("postgresql://", "postgresql+asyncpg://")
    engine = create_async_engine(url)
    cp = CheckpointRepository(engine, schema=schema)
    cp.setup()
    assert asyncio.run(turn(cp, 0)) == 1  # the engine's pool now holds that loop's connection
    with pytest.raises(ConfigError, match="closed"):
        asyncio.run(cp.aget_state(cfg()))
    engine.sync_engine.dispose(close=False)  # the caller's to clean up: a dead loop's sockets
    gc.collect()  # they warn now, in this test, where that is expected


def test_a_callers_engine_in_use_on_another_loop_is_a_config_error(schema: str) -> None:
    url = services.pg_url().replace("postgresql://", "postgresql+asyncpg://")

    async def main() -> None:
        engine = create_async_engine(url)
        cp = CheckpointRepository(engine, schema=schema)
        await cp.asetup()
        assert await turn(cp, 0) == 1
        with pytest.raises(ConfigError, match="another event loop"):
            await asyncio.to_thread(asyncio.run, cp.aget_state(cfg()))
        await engine.dispose()

    asyncio.run(main())


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_callers_redis_bound_to_a_dead_loop_fails_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = Redis.from_url(services.redis_url())
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'r.db'}")
    prefix = f"loops-{uuid.uuid4().hex}"
    cp = CachedCheckpointer(repo, redis=client, key_prefix=prefix)
    cp.setup()
    assert asyncio.run(turn(cp, 0)) == 1
    with caplog.at_level(logging.WARNING, logger="tenxstore"):
        # The write commits, then the client of the dead loop fails: the call still
        # returns its version, and the failure is logged, never raised.
        assert asyncio.run(turn(cp, 1)) == 2
    assert any("redis" in r.getMessage() for r in caplog.records)
    assert asyncio.run(cp.aget_state(cfg())) == {"n": 2}
    asyncio.run(repo.aclose())
    del client, cp
    gc.collect()  # the caller's client of the dead loop warns now, in this test

    async def forget() -> None:
        async with Redis.from_url(services.redis_url()) as redis:
            await redis.delete(f"{prefix}:t1:alice")

    asyncio.run(forget())


@pytest.mark.parametrize("name", NAMES)
def test_loops_in_worker_threads_at_once(name: str, tmp_path: Path, schema: str) -> None:
    """Four threads, each with its own loop, writing at the same time (the in-memory
    database's one connection takes turns across loops)."""
    code = f"""
import asyncio, sys, threading
sys.path.insert(0, {str(Path(__file__).parents[2])!r})
from tests.contract.test_loops import make
cp = make({name!r}, __import__("pathlib").Path({str(tmp_path)!r}), {schema!r})
cp.setup()
errors = []
def worker(w):
    async def go():
        for i in range(25):
            config = {{"thread_id": f"t{{w}}-{{i}}", "user_id": "alice"}}
            await cp.aput_state(config, {{"i": i}})
            assert await cp.aget_state_cache(config) == {{"i": i}}
    try:
        asyncio.run(go())
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
asyncio.run(cp.aclose())
print(errors)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr[-3000:]


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("how", ["loop closed without shutdown", "redis_pool_config"])
def test_clients_of_a_loop_that_closed_are_replaced_not_reused(
    how: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Some frameworks close their loop without shutting it down: what tenxstore made for
    that loop is replaced on the next one, never reused (no failed call, no back-off)."""
    options = {"redis_pool_config": {"max_connections": 20}} if how == "redis_pool_config" else {}
    cp = tenxstore.PgCheckpointer(
        postgres_dsn=services.pg_url(),
        redis_url=services.redis_url(),
        schema=schema,
        key_prefix=schema,
        **options,
    )
    cp.setup()
    with caplog.at_level(logging.WARNING, logger="tenxstore"):
        for n in range(3):
            if how == "redis_pool_config":
                assert asyncio.run(turn(cp, n)) == n + 1
            else:
                loop = asyncio.new_event_loop()
                try:
                    assert loop.run_until_complete(turn(cp, n)) == n + 1
                finally:
                    loop.close()
    assert [r.getMessage() for r in caplog.records] == []
    assert asyncio.run(cp.acheck()).pending_invalidations == 0

    async def forget() -> None:
        await cp.aclose()
        async with Redis.from_url(services.redis_url()) as redis:
            await redis.delete(f"{schema}:t1:alice")

    asyncio.run(forget())
    gc.collect()


def test_requests_in_several_threads_each_with_its_own_loop(schema: str) -> None:
    """A sync web app: threads, each request an ``asyncio.run``, one checkpointer. A
    loop's connections are never used, nor closed, by another thread's loop (that
    crashed the interpreter once). In a subprocess, so that a crash fails the test."""
    code = f"""
import asyncio, collections, sys, threading
sys.path.insert(0, {str(Path(__file__).parents[2])!r})
import tenxstore
from tests import services
cp = tenxstore.CheckpointRepository(
    services.pg_url(), schema={schema!r}, engine_options={{"pool_size": 8, "max_overflow": 2}}
)
cp.setup()
errors = collections.Counter()

async def burst(k, i):
    reads = [cp.aget_state({{"thread_id": f"t{{j}}", "user_id": "u"}}) for j in range(8)]
    await asyncio.gather(*reads)

async def single(k, i):
    config = {{"thread_id": f"s{{k}}", "user_id": "u"}}
    await cp.aget_state(config)
    await cp.aput_state(config, {{"i": i}})

def worker(k, fn, n):
    for i in range(n):
        try:
            asyncio.run(fn(k, i))
        except Exception as exc:
            errors[repr(exc)[:120]] += 1

threads = [threading.Thread(target=worker, args=(k, burst, 40)) for k in range(2)]
threads += [threading.Thread(target=worker, args=(k, single, 60)) for k in range(2, 5)]
[t.start() for t in threads]
[t.join() for t in threads]
print(dict(errors))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "{}"), done.stderr[-3000:]


def test_a_cancelled_call_keeps_the_in_memory_database() -> None:
    async def main() -> None:
        cp = tenxstore.InMemoryCheckpointer()
        try:
            await cp.aput_state(cfg("keep"), {"precious": True})
            for yields in range(12):  # a cancellation at each point of a read and a write
                for call in (cp.aget_state(cfg("keep")), cp.aput_state(cfg("other"), {})):
                    task = asyncio.ensure_future(call)
                    for _ in range(yields):
                        await asyncio.sleep(0)
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            assert await cp.aget_state(cfg("keep")) == {"precious": True}
        finally:
            await cp.aclose()

    asyncio.run(main())
