"""The Redis hot cache: keys, versions, the guard, invalidation, and a Redis that fails."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from redis.asyncio import ConnectionPool, Redis
from sqlalchemy.ext.asyncio import create_async_engine

import tenxstore
from tenxstore import (
    AuthPolicy,
    CachedCheckpointer,
    CheckpointRepository,
    PgCheckpointer,
    SqliteCheckpointer,
    StaleStateError,
)
from tenxstore.cache import cache_key
from tests import services
from tests.cache.conftest import sql_statements
from tests.conftest import cfg, drop_schema, new_schema
from tests.servers import TcpProxy


@pytest.fixture
async def repo(tmp_path: Path) -> AsyncIterator[CheckpointRepository]:
    repository = CheckpointRepository(f"sqlite:///{tmp_path / 'c.db'}")
    await repository.asetup()
    yield repository
    await repository.aclose()


@pytest.fixture
async def wrap(repo: CheckpointRepository) -> AsyncIterator[Any]:
    """Build CachedCheckpointers around the test's repository; close them afterwards."""
    made: list[CachedCheckpointer] = []

    def make(**options: Any) -> CachedCheckpointer:
        # A generous bound unless a test is about timeouts: under a loaded CI machine a
        # 0.25 s Redis call may time out, and fail-open would hide the entry under test.
        options.setdefault("redis_timeout", 2.0)
        cp = CachedCheckpointer(repo, **options)
        made.append(cp)
        return cp

    yield make
    for cp in made:
        await cp.aclose()


@pytest.fixture
async def cached(wrap: Any, redis_url: str, redis_client: Redis) -> CachedCheckpointer:
    cp: CachedCheckpointer = wrap(redis_url=redis_url, key_prefix="cachetest", cache_ttl=600)
    return cp


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_the_decorator_has_the_repositorys_interface() -> None:
    assert public_methods(CachedCheckpointer) == public_methods(CheckpointRepository)
    for preset in (PgCheckpointer, SqliteCheckpointer, tenxstore.InMemoryCheckpointer):
        assert public_methods(preset) == public_methods(CheckpointRepository)


def test_keys_are_verbatim_or_encoded_without_collisions() -> None:
    assert cache_key("state_cache", "t-1.x_y", "u", True) == "state_cache:t-1.x_y:u"
    assert cache_key("state_cache", "t", "u", False) == "state_cache:t:*"
    assert cache_key("p", "a:b", "c", True) != cache_key("p", "a", "b:c", True)
    assert cache_key("p", "*", "u", True) != cache_key("p", "t", "u", False).replace("t", "*")
    assert cache_key("p", "t", "*", True) != cache_key("p", "t", None, False)
    samples = ["a", "a:b", "b:c", ":", "~", "~YQ", "*", "é", "a b", "YQ", "a.b", "a%", "c"]
    keys = {cache_key("p", t, u, True) for t in samples for u in samples}
    assert len(keys) == len(samples) ** 2
    assert all(k.count(":") == 2 for k in keys)


async def test_write_stores_the_state_with_its_version_and_ttl(
    cached: CachedCheckpointer, redis_client: Redis
) -> None:
    config = cfg()
    assert await cached.aput_checkpoint(config, {"a": 1}) == 1
    raw = await redis_client.get("cachetest:t1:alice")
    master = (await redis_client.info("replication"))["master_replid"].encode()
    tag = b"m:" + master + b":"  # the master that stored it, in front of the JSON
    assert raw is not None and raw.startswith(tag + b'{"__checkpoint_version__":1,')
    life = config["_checkpoint_incarnation"]
    assert tenxstore.serde.decode(raw[len(tag) :]) == {
        "__checkpoint_version__": 1,
        "__checkpoint_incarnation__": life,
        "a": 1,
    }
    assert 590_000 < await redis_client.pttl("cachetest:t1:alice") <= 600_000


async def test_no_ttl(wrap: Any, redis_url: str, redis_client: Redis) -> None:
    cp = wrap(redis_url=redis_url, key_prefix="cachetest", cache_ttl=None)
    await cp.aput_state(cfg("forever"), {})
    assert await redis_client.pttl("cachetest:forever:alice") == -1
    raw = await redis_client.get("cachetest:forever:alice")
    assert raw is not None and raw.startswith(b"m:")
    entry = tenxstore.serde.decode(raw.split(b":", 2)[2])
    assert entry["__checkpoint_version__"] == 1 and set(entry) == {
        "__checkpoint_version__",
        "__checkpoint_incarnation__",
    }


async def test_a_hit_restores_the_version_and_runs_no_sql(cached: CachedCheckpointer) -> None:
    await cached.aput_checkpoint(cfg(), {"a": 1})
    await cached.aput_checkpoint(cfg(), {"a": 2})
    config = cfg()
    with sql_statements(cached) as seen:
        assert await cached.aget_state_cache(config) == {"a": 2}
    assert seen == []
    assert config["_checkpoint_version"] == 2
    assert await cached.aput_checkpoint(config, {"a": 3}) == 3


async def test_a_miss_reads_the_database_and_refreshes(
    cached: CachedCheckpointer, redis_client: Redis
) -> None:
    await cached.inner.aput_state(cfg(), {"from": "db"})  # written behind the cache's back
    config = cfg()
    with sql_statements(cached) as seen:
        assert await cached.aget_state_cache(config) == {"from": "db"}
    assert len(seen) >= 1 and config["_checkpoint_version"] == 1
    assert await redis_client.exists("cachetest:t1:alice")
    with sql_statements(cached) as seen:
        assert await cached.aget_state_cache(cfg()) == {"from": "db"}
    assert seen == []
    absent = cfg("nowhere")
    assert await cached.aget_state_cache(absent) is None
    assert absent["_checkpoint_version"] == 0


async def test_the_guard_refuses_an_older_version(
    cached: CachedCheckpointer, redis_client: Redis
) -> None:
    await cached.aput_state(cfg(), {"v": 1})
    await cached.aput_state(cfg(), {"v": 2})
    assert await cached.aput_state_cache(cfg(), {"v": "old"}, 1) is False
    assert await cached.aput_state_cache(cfg(), {"v": "same"}, 2) is True
    assert await cached.aput_state_cache(cfg(), {"v": "newer"}, 10) is True
    assert await cached.aput_state_cache(cfg(), {"v": "older"}, 9) is False
    config = cfg()
    assert await cached.aget_state_cache(config) == {"v": "newer"}
    assert config["_checkpoint_version"] == 10
    with pytest.raises(tenxstore.SerializationError):
        await cached.aput_state_cache(cfg(), {"__checkpoint_version__": 1}, 11)
    with pytest.raises(ValueError):
        await cached.aput_state_cache(cfg(), {}, -1)


async def test_a_conflict_drops_the_entry(cached: CachedCheckpointer, redis_client: Redis) -> None:
    loser = cfg()
    await cached.aget_state_cache(loser)
    await cached.aput_state(cfg(), {"winner": True})
    assert await redis_client.exists("cachetest:t1:alice")
    with pytest.raises(StaleStateError):
        await cached.aput_state(loser, {"winner": False})
    assert not await redis_client.exists("cachetest:t1:alice")


async def test_colon_ids_never_share_an_entry(cached: CachedCheckpointer) -> None:
    await cached.aput_state(cfg("a:b", "c"), {"who": "thread a:b of c"})
    await cached.aput_state(cfg("a", "b:c"), {"who": "thread a of b:c"})
    assert await cached.aget_state_cache(cfg("a:b", "c")) == {"who": "thread a:b of c"}
    assert await cached.aget_state_cache(cfg("a", "b:c")) == {"who": "thread a of b:c"}
    assert await cached.aget_state_cache(cfg("a:b", "b:c")) is None


async def test_cached_entries_respect_isolation(cached: CachedCheckpointer) -> None:
    await cached.aput_state(cfg(), {"secret": 1})
    assert await cached.aget_state_cache(cfg(user="mallory")) is None
    admin = {"thread_id": "t1", "auth_policy": AuthPolicy(enforce_user_isolation=False)}
    assert await cached.aget_state_cache(dict(admin)) == {"secret": 1}  # cached under "*"
    await cached.aput_state(cfg(), {"secret": 2})  # invalidates the "*" entry
    assert await cached.aget_state_cache(dict(admin)) == {"secret": 2}
    await cached.aput_state({**admin, "user_id": "alice"}, {"secret": 3})
    assert await cached.aget_state_cache(cfg()) == {"secret": 3}
    assert await cached.aget_state_cache(cfg(user="mallory")) is None


async def test_clean_thread_fences_the_entry(
    cached: CachedCheckpointer, redis_client: Redis
) -> None:
    await cached.aput_state(cfg(), {"v": 1})
    assert await cached.aclean_thread(cfg()) is True
    raw = await redis_client.get("cachetest:t1:alice")
    assert raw is not None and raw.startswith(b'{"__checkpoint_fence__":')  # no state in it
    assert 0 < await redis_client.pttl("cachetest:t1:alice") <= 60_000
    assert await cached.aget_state_cache(cfg()) is None
    assert await cached.aput_state(cfg(), {"v": "new life"}) == 1  # a new life is cached
    assert await cached.aget_state_cache(cfg()) == {"v": "new life"}


async def test_a_stale_entry_after_a_crash_costs_one_conflict(cached: CachedCheckpointer) -> None:
    await cached.aput_state(cfg(), {"n": 1})
    # The process died between a commit and its cache write: the cache keeps version 1.
    await cached.inner.aput_state(cfg(), {"n": 2})
    run = cfg()
    assert await cached.aget_state_cache(run) == {"n": 1}
    with pytest.raises(StaleStateError) as err:
        await cached.aput_state(run, {"n": 2})
    assert (err.value.expected_version, err.value.actual_version) == (1, 2)
    retry = cfg()
    assert await cached.aget_state_cache(retry) == {"n": 2}
    assert await cached.aput_state(retry, {"n": 3}) == 3
    assert await cached.aget_state(cfg()) == {"n": 3}


def port_of(url: str) -> int:
    return urlsplit(url).port or 6379


def count_redis_commands(cp: CachedCheckpointer) -> list[str]:
    """Instrument the client: every command it sends is appended to the list."""
    sent: list[str] = []
    client = cp.redis
    original = client.execute_command

    async def counting(*args: Any, **kwargs: Any) -> Any:
        sent.append(str(args[0]))
        return await original(*args, **kwargs)

    client.execute_command = counting
    return sent


async def exercise(cp: CachedCheckpointer, rounds: int = 5) -> None:
    for i in range(rounds):
        config = cfg()
        state = await cp.aget_state_cache(config) or {"n": 0}
        assert state["n"] == i
        await cp.aput_checkpoint(config, {"n": i + 1}, [{"id": f"m{i}"}])
    assert await cp.aclean_thread(cfg()) is True


async def test_a_refused_redis_is_ignored_and_not_retried_each_call(wrap: Any) -> None:
    cp = wrap(redis_url="redis://127.0.0.1:1/0", redis_backoff=60)
    sent = count_redis_commands(cp)
    await exercise(cp)
    assert len(sent) == 1  # the first call failed; the window kept the rest away
    assert await cp.aput_state_cache(cfg(), {"x": 1}, 1) is False
    health = await cp.acheck()
    assert health.cache_down_for > 0 and health.cache_error is not None
    assert "unreachable" in health.cache_error


@pytest.fixture
async def black_hole() -> AsyncIterator[int]:
    """A TCP port that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for w in held:
        w.close()
    server.close()
    await server.wait_closed()


async def test_a_black_holed_redis_costs_one_bounded_wait(wrap: Any, black_hole: int) -> None:
    cp = wrap(redis_url=f"redis://127.0.0.1:{black_hole}/0", redis_timeout=0.2, redis_backoff=60)
    sent = count_redis_commands(cp)
    await exercise(cp)
    assert len(sent) == 1


async def test_a_caller_client_is_bounded_too(wrap: Any, black_hole: int) -> None:
    patient = Redis(host="127.0.0.1", port=black_hole, socket_timeout=30)
    cp = wrap(redis=patient, redis_timeout=0.2, redis_backoff=60)
    sent = count_redis_commands(cp)
    # A hang guard, not a speed check: without the library's own bound this call
    # waits for the client's 30 s socket timeout and wait_for fails.
    assert await asyncio.wait_for(cp.aget_state_cache(cfg()), 10) is None
    assert sent == ["EVALSHA"]  # the read was tried, and its failure opened the window
    assert (await cp.acheck()).cache_down_for > 0
    await patient.aclose()


async def test_redis_dies_and_returns(wrap: Any, tmp_path: Path) -> None:
    server = services.RedisServer(tmp_path)
    server.start()
    cp = wrap(redis_url=f"redis://127.0.0.1:{server.port}/0", redis_backoff=0.05)
    try:
        await cp.aput_state(cfg(), {"n": 1})
        with sql_statements(cp) as seen:
            assert await cp.aget_state_cache(cfg()) == {"n": 1}
        assert seen == []
        server.kill()
        for n in (2, 3, 4):  # every call succeeds from the database
            config = cfg()
            assert await cp.aget_state_cache(config) == {"n": n - 1}
            assert await cp.aput_state(config, {"n": n}) == n
        server.start()  # a new, empty Redis on the same port
        await asyncio.sleep(0.2)  # the 0.05 s window is a time: let it pass
        config = cfg()
        assert await cp.aget_state_cache(config) == {"n": 4}  # probe: miss, refresh
        with sql_statements(cp) as seen:
            assert await cp.aget_state_cache(cfg()) == {"n": 4}
        assert seen == [], "the cache is used again after the restart"
    finally:
        server.kill()


async def test_entries_that_went_stale_while_redis_was_unreachable_are_never_served(
    wrap: Any, redis_url: str, redis_client: Redis
) -> None:
    link = await TcpProxy(port_of(redis_url)).start()
    try:
        cp = wrap(
            redis_url=f"redis://127.0.0.1:{link.port}/{services.redis_db()}", key_prefix="cachetest"
        )
        cp_backoff = wrap(
            redis_url=f"redis://127.0.0.1:{link.port}/{services.redis_db()}",
            key_prefix="cachetest",
            redis_backoff=0.05,
        )
        await cp_backoff.aput_state(cfg(), {"n": 1})
        assert await cp_backoff.aget_state_cache(cfg()) == {"n": 1}
        link.cut()  # this process loses Redis; the entry stays there
        assert await cp_backoff.aclean_thread(cfg()) is True
        assert (await cp_backoff.acheck()).pending_invalidations >= 1
        link.restore()
        await asyncio.sleep(0.2)  # the 0.05 s window is a time: let it pass
        # The very first read after Redis is back must not serve the deleted state.
        assert await cp_backoff.aget_state_cache(cfg()) is None
        assert await cp.aget_state_cache(cfg()) is None  # nor any other reader's
        assert (await cp_backoff.acheck()).pending_invalidations == 0
    finally:
        await link.close()


async def test_pg_checkpointer_arguments(redis_url: str, pg_url: str) -> None:
    with pytest.raises(ValueError):
        PgCheckpointer(redis_url=redis_url)
    with pytest.raises(ValueError):
        PgCheckpointer(postgres_dsn=pg_url)
    with pytest.raises(ValueError):
        PgCheckpointer(postgres_dsn=pg_url, redis_url=redis_url, redis=Redis())
    with pytest.raises(ValueError):
        PgCheckpointer(postgres_dsn=pg_url, redis_url=redis_url, cache_ttl=0)
    with pytest.raises(ValueError):
        PgCheckpointer(postgres_dsn=pg_url, redis_url=redis_url, cache_ttl="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PgCheckpointer(postgres_dsn=pg_url, redis_url=redis_url, state_history_limit=0)
    with pytest.raises(ValueError):
        SqliteCheckpointer("x.db", cache_ttl=-1)
    with pytest.raises(ValueError, match="redis_timeout"):
        PgCheckpointer(postgres_dsn=pg_url, redis_url=redis_url, redis_timeout=0)
    with pytest.raises(ValueError, match="redis_timeout"):
        SqliteCheckpointer("x.db", redis_url=redis_url, redis_timeout=-1)


@pytest.mark.parametrize("how", ["dsn", "engine", "asyncpg_pool", "redis_pool"])
async def test_pg_checkpointer_end_to_end(how: str, pg_url: str, redis_url: str) -> None:
    schema = new_schema()
    closers: list[Any] = []
    kwargs: dict[str, Any] = {"schema": schema, "cache_ttl": 60, "key_prefix": schema}
    if how == "engine":
        engine = create_async_engine(pg_url.replace("postgresql://", "postgresql+asyncpg://"))
        kwargs["pg_pool"] = engine
        closers.append(engine.dispose)
    elif how == "asyncpg_pool":
        pool = await asyncpg.create_pool(pg_url, min_size=1, max_size=3)
        kwargs["pg_pool"] = pool
        closers.append(pool.close)
    else:
        kwargs["postgres_dsn"] = pg_url
    if how == "redis_pool":
        redis_pool = ConnectionPool.from_url(redis_url)
        kwargs["redis_pool"] = redis_pool
        closers.append(redis_pool.disconnect)
    else:
        kwargs["redis_url"] = redis_url
    try:
        async with PgCheckpointer(**kwargs) as cp:
            if how == "asyncpg_pool":
                with pytest.raises(ValueError, match="asetup"):
                    cp.setup()
                await cp.asetup()
            else:
                cp.setup()
            config = cfg(f"e2e-{how}")
            for n in range(5):
                state = await cp.aget_state_cache(config) or {"n": 0}
                await cp.aput_checkpoint(config, {"n": state["n"] + 1}, [{"id": str(n)}])
            assert await cp.aget_state(cfg(f"e2e-{how}")) == {"n": 5}
            assert len(await cp.aget_messages(config)) == 5
            assert await cp.arun_tool_once(config, "c", "t", {}, lambda: "ok") == "ok"
            if how == "asyncpg_pool":
                assert kwargs["pg_pool"].get_size() <= 3
                assert kwargs["pg_pool"].get_idle_size() == kwargs["pg_pool"].get_size()
            assert await cp.aclean_thread(config) is True
    finally:
        for close in closers:
            await close()
        await drop_schema(pg_url, schema)


async def test_sqlite_checkpointer_with_redis(
    tmp_path: Path, redis_url: str, redis_client: Redis
) -> None:
    async with SqliteCheckpointer(  # a generous bound: see the wrap fixture
        tmp_path / "s.db", redis_url=redis_url, key_prefix="cachetest", redis_timeout=2.0
    ) as cp:
        await cp.asetup()
        await cp.aput_state(cfg(), {"x": 1})
        assert await redis_client.exists("cachetest:t1:alice")
        with sql_statements(cp) as seen:
            assert await cp.aget_state_cache(cfg()) == {"x": 1}
        assert seen == []


async def test_pg_checkpointer_through_pgbouncer(redis_url: str) -> None:
    from tests import services

    schema = new_schema()
    try:
        async with PgCheckpointer(
            postgres_dsn=services.pgbouncer_url(),
            redis_url=redis_url,
            schema=schema,
            key_prefix=schema,  # a Redis shared with other runs
            pool_mode="transaction",
        ) as cp:
            cp.setup()
            config = cfg("via-pgbouncer")
            for n in range(1, 6):
                await cp.aget_state_cache(config)
                assert await cp.aput_state(config, {"n": n}) == n
            assert await cp.aget_state(cfg("via-pgbouncer")) == {"n": 5}
    finally:
        await drop_schema(services.pg_url(), schema)


class PausedAfterRead:
    """A checkpointer whose database reads stop once they have the row, until released:
    a refill that read before a delete and puts after it, on demand (no timing)."""

    def __init__(self, inner: CheckpointRepository) -> None:
        self._inner = inner
        self.has_read, self.release = asyncio.Event(), asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def aget_state(self, config: dict[str, Any]) -> dict[str, Any] | None:
        state = await self._inner.aget_state(config)
        self.has_read.set()
        await self.release.wait()
        return state


@pytest.mark.parametrize("then", ["deleted", "deleted-and-recreated"])
async def test_a_refill_that_read_before_a_delete_never_lands(
    repo: CheckpointRepository, wrap: Any, redis_url: str, redis_client: Redis, then: str
) -> None:
    writer = wrap(redis_url=redis_url, key_prefix="cachetest")
    paused = PausedAfterRead(repo)
    reader = wrap(redis_url=redis_url, key_prefix="cachetest")
    reader.inner = paused  # the same store, read through the pausing checkpointer
    for n in (1, 2, 3, 4, 5):
        await writer.aput_state(cfg(), {"secret": n})
    await redis_client.delete("cachetest:t1:alice")  # evicted: the next read refills
    refill = asyncio.ensure_future(reader.aget_state_cache(cfg()))
    await paused.has_read.wait()  # the reader holds version 5 from the database
    assert await writer.aclean_thread(cfg()) is True
    if then == "deleted-and-recreated":
        assert await writer.aput_state(cfg(), {"secret": "new life"}) == 1
    paused.release.set()
    assert await refill == {"secret": 5}  # it read before the delete: that is what it saw
    expected = None if then == "deleted" else {"secret": "new life"}
    for cp in (writer, reader):
        for _ in range(3):
            assert await cp.aget_state_cache(cfg()) == expected


async def test_an_unscoped_write_or_delete_invalidates_the_owners_entry(
    cached: CachedCheckpointer,
) -> None:
    admin = {"thread_id": "t1", "auth_policy": AuthPolicy(enforce_user_isolation=False)}
    await cached.aput_state(cfg(), {"v": "alice's 1"})
    assert await cached.aget_state_cache(cfg()) == {"v": "alice's 1"}  # cached for alice
    await cached.aput_state(dict(admin), {"v": "admin's 2"})
    assert await cached.aget_state_cache(cfg()) == {"v": "admin's 2"}
    assert await cached.aget_state_cache(dict(admin)) == {"v": "admin's 2"}
    assert await cached.aclean_thread(dict(admin)) is True
    assert await cached.aget_state_cache(cfg()) is None
    assert await cached.aget_state_cache(dict(admin)) is None


async def test_a_redis_that_refuses_us_is_named_once_and_in_the_health_check(
    wrap: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = services.RedisServer(tmp_path, args=("--requirepass", "right"))
    server.start()
    try:
        for url, problem in (
            (f"redis://:wrong@127.0.0.1:{server.port}/0", "credentials"),
            (f"redis://:right@127.0.0.1:{server.port}/99", "database index"),
            (f"redis://127.0.0.1:{server.port}/0", "credentials"),  # no password at all
        ):
            cp = wrap(redis_url=url, redis_backoff=0.01)
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="tenxstore"):
                for _ in range(3):
                    await exercise(cp, rounds=2)  # every call is served by the database
                    await asyncio.sleep(0.1)  # the window is a time: Redis is tried again
            loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(loud) == 1 and problem in loud[0].getMessage(), loud
            failures = [r for r in caplog.records if "failed" in r.getMessage()]
            assert len(failures) >= 2  # tried again after each window: quietly
            health = await cp.acheck()
            assert health.cache_error is not None and problem in health.cache_error
            assert not health.ok and health.database_error is None
    finally:
        server.kill()


@pytest.mark.parametrize(
    "garbage",
    [
        b"not json",
        b'{"__checkpoint_version__":1,"a":',
        b"[1, 2]",
        b'{"a": 1}',
        b'{"__checkpoint_version__": "7", "a": 1}',
        b'{"__checkpoint_version__": true}',
        b'{"__checkpoint_version__": -3}',
        b"\xff\xfe",
        b" " + b"[" * 200_000 + b"]" * 200_000,  # the stdlib parser's recursion limit
        b'{"__checkpoint_version__":1,"__checkpoint_incarnation__":1180591620717411303424}',
        b'{"__checkpoint_version__":9223372036854775808}',
    ],
    ids=repr,
)
async def test_an_entry_that_does_not_decode_is_a_miss(
    cached: CachedCheckpointer,
    redis_client: Redis,
    garbage: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await cached.aput_state(cfg(), {"from": "db"})
    await redis_client.set("cachetest:t1:alice", garbage)
    config = cfg()
    with caplog.at_level(logging.WARNING, logger="tenxstore"):
        assert await cached.aget_state_cache(config) == {"from": "db"}
    assert config["_checkpoint_version"] == 1
    assert any("does not decode" in r.getMessage() for r in caplog.records)
    with sql_statements(cached) as seen:  # dropped and refreshed: a hit again
        assert await cached.aget_state_cache(cfg()) == {"from": "db"}
    assert seen == []


async def test_preset_arguments_say_what_they_need(tmp_path: Path, redis_url: str) -> None:
    with pytest.raises(ValueError, match="PostgreSQL URL"):
        PgCheckpointer(postgres_dsn=f"sqlite:///{tmp_path / 'x.db'}", redis_url=redis_url)
    with pytest.raises(ValueError, match="PostgreSQL URL"):
        PgCheckpointer(postgres_dsn="mysql://root@localhost/db", redis_url=redis_url)
    with pytest.raises(ValueError, match="InMemoryCheckpointer"):
        SqliteCheckpointer("sqlite://")
    with pytest.raises(ValueError, match="file path"):
        SqliteCheckpointer("postgresql://localhost/db")
    for path in (f"sqlite:///{tmp_path / 'url.db'}", str(tmp_path / "path.db"), tmp_path / "p.db"):
        async with SqliteCheckpointer(path) as cp:
            await cp.asetup()
            assert await cp.aput_state(cfg(), {"x": 1}) == 1
    assert (tmp_path / "url.db").exists()
