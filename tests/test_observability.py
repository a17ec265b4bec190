"""Logging, spans and metrics: each event at its level and under its name, and nothing
a user stored in any log record, span or metric."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tenxstore import (
    CachedCheckpointer,
    CheckpointRepository,
    ConnectionLost,
    DatabaseUnavailable,
    InMemoryCheckpointer,
    LockTimeout,
    StaleStateError,
    ToolExecutionMismatch,
    telemetry,
)
from tests import services
from tests.conftest import cfg
from tests.servers import TcpProxy, free_port

MARKER = "M4RK3R-" + uuid.uuid4().hex  # stored everywhere a user's data can go


class Telemetry:
    """The SDK's in-memory exporter and reader, installed once per process (OTel's
    providers are set once), read as deltas per test."""

    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    installed = False

    def __init__(self) -> None:
        if not Telemetry.installed:
            tracer_provider = TracerProvider()
            tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
            trace.set_tracer_provider(tracer_provider)
            metrics.set_meter_provider(MeterProvider(metric_readers=[self.reader]))
            Telemetry.installed = True
        self.spans.clear()
        self._before = self._points()

    def _points(self) -> dict[tuple[str, frozenset[tuple[str, Any]]], float]:
        points: dict[tuple[str, frozenset[tuple[str, Any]]], float] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        key = (metric.name, frozenset(point.attributes.items()))
                        points[key] = getattr(point, "value", None) or point.count  # type: ignore[union-attr]
        return points

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, Any]]], float]:
        """What each metric point gained since the test began (counts for histograms)."""
        after = self._points()
        return {
            key: value - self._before.get(key, 0)
            for key, value in after.items()
            if value != self._before.get(key, 0)
        }

    def count(self, name: str, **attributes: Any) -> float:
        """The gain of ``name`` summed over the points that carry ``attributes``."""
        wanted = {(f"tenxstore.{k}", v) for k, v in attributes.items()}
        return sum(
            value
            for (metric, attrs), value in self.metrics().items()
            if metric == name and wanted <= set(attrs)
        )

    def finished(self) -> list[ReadableSpan]:
        """The spans of the test's calls (a fixture's setup left out)."""
        return [s for s in self.spans.get_finished_spans() if s.name != "tenxstore.asetup"]

    def span(self, name: str) -> ReadableSpan:
        [span] = [s for s in self.finished() if s.name == name]
        return span


@pytest.fixture
def otel() -> Telemetry:
    return Telemetry()


@pytest.fixture
def ids_recorded() -> Iterator[None]:
    telemetry.configure(record_ids=True)
    try:
        yield
    finally:
        telemetry.configure(record_ids=False)


@pytest.fixture
async def sqlite_repo(tmp_path: Path) -> AsyncIterator[CheckpointRepository]:
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'o.db'}", lock_timeout=0.3)
    await repo.asetup()
    yield repo
    await repo.aclose()


@pytest.fixture
async def make_repo(tmp_path: Path, pg_url: str, pg_schema: str) -> AsyncIterator[Any]:
    made: list[Any] = []

    async def make(kind: str) -> Any:
        cp: Any
        if kind == "memory":
            cp = InMemoryCheckpointer()
        elif kind == "sqlite":
            cp = CheckpointRepository(f"sqlite:///{tmp_path / 'm.db'}")
        else:
            cp = CheckpointRepository(pg_url, schema=pg_schema)
        made.append(cp)
        await cp.asetup()
        return cp

    yield make
    for cp in made:
        await cp.aclose()


def cached(repo: CheckpointRepository, redis_url: str, **options: Any) -> CachedCheckpointer:
    prefix = f"obs-{uuid.uuid4().hex[:8]}"
    options.setdefault("redis_timeout", 2.0)
    return CachedCheckpointer(repo, redis_url=redis_url, key_prefix=prefix, **options)


def tenxstore_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("tenxstore")]


# -- spans and metrics ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgresql"])
async def test_a_write_is_one_span_and_counted(otel: Telemetry, make_repo: Any, kind: str) -> None:
    cp = await make_repo(kind)
    otel = Telemetry()  # after setup
    config = cfg()
    await cp.aput_checkpoint(config, {"note": MARKER}, [{"id": "m1", "content": MARKER}])
    span = otel.span("tenxstore.aput_checkpoint")
    assert [s.name for s in otel.finished()] == ["tenxstore.aput_checkpoint"]  # not acommit
    assert dict(span.attributes or {}) == {
        "tenxstore.operation": "aput_checkpoint",
        "tenxstore.backend": kind,
        "tenxstore.outcome": "ok",
        "tenxstore.retries": 0,
    }
    assert span.status.status_code is StatusCode.UNSET
    assert otel.count("tenxstore.writes", operation="aput_checkpoint", backend=kind) == 1
    assert otel.count("tenxstore.call.duration", operation="aput_checkpoint", outcome="ok") == 1
    await cp.aget_state(cfg())
    assert otel.count("tenxstore.writes") == 1  # a read is no write
    assert otel.count("tenxstore.call.duration", operation="aget_state", backend=kind) == 1


async def test_a_conflict_is_an_error_span_and_counted(
    otel: Telemetry, sqlite_repo: CheckpointRepository
) -> None:
    await sqlite_repo.aput_state(cfg(), {"n": 1})
    stale = cfg(_checkpoint_version=0)
    with pytest.raises(StaleStateError):
        await sqlite_repo.aput_state(stale, {"n": MARKER})
    span = [s for s in otel.finished() if s.name == "tenxstore.aput_state"][-1]
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is None  # the message names the thread
    assert span.attributes is not None
    assert span.attributes["tenxstore.outcome"] == "StaleStateError"
    assert span.attributes["error.type"] == "tenxstore.errors.StaleStateError"
    assert not span.events  # no exception event: its message may quote what was stored
    assert otel.count("tenxstore.conflicts", operation="aput_state", backend="sqlite") == 1
    assert otel.count("tenxstore.writes", operation="aput_state") == 1  # the first one
    assert otel.count("tenxstore.call.duration", outcome="StaleStateError") == 1


async def test_cache_hits_and_misses(
    otel: Telemetry, sqlite_repo: CheckpointRepository, redis_url: str
) -> None:
    cp = cached(sqlite_repo, redis_url)
    try:
        await sqlite_repo.aput_state(cfg(), {"n": MARKER})  # the database only: a miss first
        otel = Telemetry()
        assert await cp.aget_state_cache(cfg()) == {"n": MARKER}
        assert await cp.aget_state_cache(cfg()) == {"n": MARKER}
        spans = otel.finished()
        assert [s.name for s in spans] == ["tenxstore.aget_state_cache"] * 2  # one per call
        assert [(s.attributes or {})["tenxstore.cache.result"] for s in spans] == ["miss", "hit"]
        assert (spans[0].attributes or {})["tenxstore.backend"] == "sqlite"
        assert otel.count("tenxstore.cache.misses") == 1
        assert otel.count("tenxstore.cache.hits") == 1
        assert otel.count("tenxstore.cache.fail_open") == 0
    finally:
        await cp.aclose()


async def test_a_redis_that_is_down_fails_open_counted_and_logged_once(
    otel: Telemetry, sqlite_repo: CheckpointRepository, caplog: pytest.LogCaptureFixture
) -> None:
    cp = cached(sqlite_repo, f"redis://127.0.0.1:{free_port()}/0", redis_backoff=60)
    try:
        with caplog.at_level(logging.DEBUG, logger="tenxstore"):
            for i in range(3):
                config = cfg()
                await cp.aget_state_cache(config)
                await cp.aput_checkpoint(config, {"n": i})
        results = [
            (s.attributes or {}).get("tenxstore.cache.result")
            for s in otel.finished()
            if s.name == "tenxstore.aget_state_cache"
        ]
        assert results == ["fail_open"] * 3
        assert otel.count("tenxstore.cache.fail_open", **{"cache.operation": "get"}) == 3
        # three writes, and two reads that found a state refill the cache
        assert otel.count("tenxstore.cache.fail_open", **{"cache.operation": "put"}) == 5
        assert otel.count("tenxstore.cache.misses") == 0
        warnings = [r for r in tenxstore_records(caplog) if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings  # once per window, not per call
        assert warnings[0].name == "tenxstore.redis_cache"
        assert "serving from the database" in warnings[0].getMessage()
    finally:
        await cp.aclose()


async def test_redis_answering_again_is_logged_once(
    sqlite_repo: CheckpointRepository, caplog: pytest.LogCaptureFixture
) -> None:
    link = await TcpProxy(urlsplit(services.redis_url()).port or 6379).start()
    cp = cached(
        sqlite_repo, f"redis://127.0.0.1:{link.port}/{services.redis_db()}", redis_backoff=0.05
    )
    try:
        with caplog.at_level(logging.INFO, logger="tenxstore"):
            await cp.aget_state_cache(cfg())
            link.cut()
            await cp.aget_state_cache(cfg())  # fails: the window opens
            link.restore()
            await asyncio.sleep(0.1)  # the window is a time: let it pass
            for _ in range(3):
                await cp.aget_state_cache(cfg())
        messages = [(r.levelno, r.getMessage()) for r in tenxstore_records(caplog)]
        assert [level for level, _ in messages] == [logging.WARNING, logging.INFO], messages
        assert "answers again" in messages[1][1]
    finally:
        await cp.aclose()
        await link.close()


async def test_tool_ledger_outcomes(
    otel: Telemetry, sqlite_repo: CheckpointRepository, caplog: pytest.LogCaptureFixture
) -> None:
    args = {"q": MARKER}
    assert await sqlite_repo.arun_tool_once(cfg(), "c1", "search", args, lambda q: q) == MARKER
    assert await sqlite_repo.arun_tool_once(cfg(), "c1", "search", args, lambda q: q) == MARKER
    mismatch = pytest.raises(ToolExecutionMismatch)
    with caplog.at_level(logging.DEBUG, logger="tenxstore"), mismatch:
        await sqlite_repo.abegin_tool_execution(cfg(), "c1", "search", {"q": "other"})
    for outcome in ("claimed", "succeeded", "replayed", "mismatch"):
        assert otel.count("tenxstore.tool.outcomes", **{"tool.outcome": outcome}) == 1, outcome
    assert otel.count("tenxstore.tool.outcomes", **{"tool.name": "search"}) == 4
    assert [s.name for s in otel.finished()] == [
        "tenxstore.arun_tool_once",
        "tenxstore.arun_tool_once",
        "tenxstore.abegin_tool_execution",
    ]
    [warning] = [r for r in tenxstore_records(caplog) if r.levelno == logging.WARNING]
    assert warning.name == "tenxstore.ledger" and "reused" in warning.getMessage()


async def test_a_lease_taken_over_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'l.db'}", tool_lease_seconds=0.001)
    try:
        await repo.asetup()
        await repo.abegin_tool_execution(cfg(), "c1", "crawl", {})
        await asyncio.sleep(0.01)  # the lease is a time: let it pass
        with caplog.at_level(logging.DEBUG, logger="tenxstore"):
            again = await repo.abegin_tool_execution(cfg(), "c1", "crawl", {})
        assert again.attempts == 2
        [record] = tenxstore_records(caplog)
        assert record.levelno == logging.WARNING and record.name == "tenxstore.ledger"
        assert "another worker took the call over" in record.getMessage()
    finally:
        await repo.aclose()


async def test_ids_only_when_the_operator_opts_in(
    otel: Telemetry, sqlite_repo: CheckpointRepository, ids_recorded: None
) -> None:
    await sqlite_repo.aput_state(cfg("thread-7", "user-9"), {"n": 1})
    await sqlite_repo.aget_state({"configurable": {"thread_id": "thread-8", "user_id": "u-2"}})
    put, get = otel.finished()
    assert (put.attributes or {})["tenxstore.thread_id"] == "thread-7"
    assert (put.attributes or {})["tenxstore.user_id"] == "user-9"
    assert (get.attributes or {})["tenxstore.thread_id"] == "thread-8"
    # never on metrics: they would be one series per thread
    assert not any("thread_id" in str(key) for key in otel.metrics())


async def test_ids_are_absent_by_default(
    otel: Telemetry, sqlite_repo: CheckpointRepository
) -> None:
    await sqlite_repo.aput_state(cfg("thread-7", "user-9"), {"n": 1})
    [span] = otel.finished()
    assert "tenxstore.thread_id" not in (span.attributes or {})
    assert "tenxstore.user_id" not in (span.attributes or {})


def test_the_environment_opts_into_ids() -> None:
    code = "from tenxstore import telemetry; print(telemetry.record_ids())"
    for value, expected in (("1", "True"), ("", "False")):
        env = {**os.environ, "TENXSTORE_TELEMETRY_IDS": value}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == expected


def test_without_opentelemetry_the_methods_are_only_in_the_error_boundary() -> None:
    # A process where the API cannot be imported: @traced returns the method in the
    # error boundary (tenxstore.boundary.guard) and no span wrapper.
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import tenxstore\n"
        "from tenxstore.repository import CheckpointRepository as R\n"
        "print(R.aget_state.__code__ is tenxstore.boundary.guard(lambda: 0).__code__,"
        " tenxstore.telemetry.enabled())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]


# -- logging -------------------------------------------------------------------------


def test_the_library_adds_only_a_null_handler() -> None:
    handlers = logging.getLogger("tenxstore").handlers
    assert [type(h) for h in handlers] == [logging.NullHandler]


async def test_migrations_applied_are_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo = CheckpointRepository(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        with caplog.at_level(logging.DEBUG, logger="tenxstore"):
            await repo.asetup()
            await repo.asetup()  # nothing to apply: nothing said
        [record] = tenxstore_records(caplog)
        assert (record.name, record.levelno) == ("tenxstore.migrate", logging.INFO)
        assert "from None to 0" in record.getMessage()
    finally:
        await repo.aclose()


async def test_a_lock_timeout_is_a_warning_and_counted(
    otel: Telemetry,
    sqlite_repo: CheckpointRepository,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await sqlite_repo.aput_state(cfg(), {"n": 1})
    holder = sqlite3.connect(tmp_path / "o.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with caplog.at_level(logging.DEBUG, logger="tenxstore"), pytest.raises(LockTimeout):
            await sqlite_repo.aput_state(cfg(), {"n": MARKER})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    [warning] = [r for r in tenxstore_records(caplog) if r.levelno == logging.WARNING]
    assert warning.name.startswith("tenxstore.backends.") and "LockTimeout" in warning.getMessage()
    assert otel.count("tenxstore.lock.timeouts", backend="sqlite") == 1
    span = [s for s in otel.finished() if s.name == "tenxstore.aput_state"][-1]
    assert (span.attributes or {})["tenxstore.outcome"] == "LockTimeout"


async def test_a_lock_wait_is_debug_and_measured(
    otel: Telemetry,
    sqlite_repo: CheckpointRepository,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = cfg()
    await sqlite_repo.aput_state(config, {"n": 0})  # the next write takes the one-hop path
    holder = sqlite3.connect(tmp_path / "o.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    loop = asyncio.get_running_loop()
    tried_twice = asyncio.Event()
    begins: list[str] = []

    def seen(sql: str) -> None:  # in the writer's thread
        if sql == "BEGIN IMMEDIATE":
            begins.append(sql)
            if len(begins) == 2:  # the first try found the lock taken
                loop.call_soon_threadsafe(tried_twice.set)

    remove = sqlite_repo.backend.on_statement(seen)
    try:
        with caplog.at_level(logging.DEBUG, logger="tenxstore"):
            write = asyncio.ensure_future(sqlite_repo.aput_state(config, {"n": 1}))
            await tried_twice.wait()
            holder.execute("ROLLBACK")
            assert await write == 2
    finally:
        remove()
        holder.close()
    waits = [r for r in tenxstore_records(caplog) if "waited" in r.getMessage()]
    assert [r.levelno for r in waits] == [logging.DEBUG]
    assert otel.count("tenxstore.lock.wait", backend="sqlite") == 1


async def test_a_dead_pooled_connection_is_retried_at_debug_and_on_the_span(
    otel: Telemetry, pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"obs-{uuid.uuid4().hex[:8]}"
    options = {"connect_args": {"server_settings": {"application_name": name}}}
    repo = CheckpointRepository(pg_url, schema=pg_schema, engine_options=options)
    admin = await asyncpg.connect(pg_url)
    try:
        await repo.asetup()
        await repo.aput_state(cfg(), {"n": 1})
        for row in await admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1", name
        ):
            await admin.execute("SELECT pg_terminate_backend($1)", row["pid"])
        otel = Telemetry()
        with caplog.at_level(logging.DEBUG, logger="tenxstore"):
            assert await repo.aget_state(cfg()) == {"n": 1}
        retries = [r for r in tenxstore_records(caplog) if "retrying" in r.getMessage()]
        assert retries and {r.levelno for r in retries} == {logging.DEBUG}
        assert (otel.span("tenxstore.aget_state").attributes or {})["tenxstore.retries"] >= 1
        assert otel.count("tenxstore.retries", backend="postgresql") >= 1
    finally:
        await admin.close()
        await repo.aclose()


async def test_a_connection_lost_mid_write_is_a_warning_and_counted(
    otel: Telemetry, pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    armed = [False]

    def drop(chunk: bytes) -> bool:
        if armed[0] and b"FOR UPDATE" in chunk:
            armed[0] = False
            return True
        return False

    link = await TcpProxy(urlsplit(pg_url).port or 5432, drop=drop).start()
    url = urlsplit(pg_url)._replace(netloc=f"postgres@127.0.0.1:{link.port}").geturl()
    repo = CheckpointRepository(url, schema=pg_schema)
    try:
        await repo.asetup()
        await repo.aclose()  # the write's connection is new: its lock statement is sent whole
        armed[0] = True
        raises = pytest.raises(ConnectionLost)
        with caplog.at_level(logging.DEBUG, logger="tenxstore"), raises as lost:
            await repo.aput_state(cfg(), {"n": MARKER})
        assert lost.value.committed is False
        warnings = [r for r in tenxstore_records(caplog) if r.levelno == logging.WARNING]
        assert warnings and all(r.name.startswith("tenxstore.backends.") for r in warnings)
        assert "connection to the database was lost" in warnings[0].getMessage()
        assert otel.count("tenxstore.connection.losses", backend="postgresql") == 1
    finally:
        await repo.aclose()
        await link.close()


async def test_an_unusable_database_is_a_warning_without_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    repo = CheckpointRepository(f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/db")
    try:
        with caplog.at_level(logging.DEBUG, logger="tenxstore"), pytest.raises(DatabaseUnavailable):
            await repo.aget_state(cfg())
    finally:
        await repo.aclose()
    [warning] = [r for r in tenxstore_records(caplog) if r.levelno == logging.WARNING]
    assert warning.name == "tenxstore.backends.base"
    assert "connection refused" in warning.getMessage()
    assert "s3cret" not in warning.getMessage()


# -- nothing stored ever leaves through telemetry --------------------------------------


async def workload(cp: Any) -> None:
    """Every kind of stored value carries the marker; successes, conflicts, replays,
    failures and mismatches all happen."""
    config = cfg("w1", "alice")
    await cp.aput_thread(config, name=MARKER, metadata={"m": MARKER})
    await cp.aget_state_cache(config)
    await cp.aput_checkpoint(config, {"s": MARKER}, [{"id": "m1", "content": MARKER}])
    await cp.aget_state_cache(cfg("w1", "alice"))
    with pytest.raises(StaleStateError):
        await cp.aput_state(cfg("w1", "alice", _checkpoint_version=0), {"s": MARKER})
    await cp.aget_messages(config)
    await cp.alist_states(config)
    await cp.arun_tool_once(config, "t1", "search", {"q": MARKER}, lambda q: q)
    await cp.arun_tool_once(config, "t1", "search", {"q": MARKER}, lambda q: q)

    def broken(q: str) -> str:
        raise RuntimeError(q)

    with pytest.raises(RuntimeError):
        await cp.arun_tool_once(config, "t2", "fail", {"q": MARKER}, broken)
    with pytest.raises(ToolExecutionMismatch):
        await cp.abegin_tool_execution(config, "t1", "search", {"q": MARKER + "2"})
    await cp.aput_state_cache(config, {"s": MARKER}, 99)
    await cp.aexport_thread(config)
    assert await cp.aclean_thread(config) is True


@pytest.mark.parametrize("where", ["sqlite", "postgresql", "down"])
async def test_nothing_stored_reaches_logs_spans_or_metrics(
    otel: Telemetry,
    where: str,
    tmp_path: Path,
    pg_url: str,
    pg_schema: str,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if where == "postgresql":
        repo = CheckpointRepository(pg_url, schema=pg_schema)
    else:
        repo = CheckpointRepository(f"sqlite:///{tmp_path / 'w.db'}")
    url = f"redis://127.0.0.1:{free_port()}/0" if where == "down" else redis_url
    cp = cached(repo, url, redis_backoff=0.01)
    try:
        with caplog.at_level(logging.DEBUG):  # the root logger: everything
            await cp.asetup()
            await workload(cp)
    finally:
        await cp.aclose()
    records = tenxstore_records(caplog)
    assert records  # the workload had things to say
    for record in records:
        assert MARKER not in record.getMessage(), record
        assert MARKER not in repr(record.args), record
    spans = otel.finished()
    assert len(spans) == 14  # one per call of the workload
    for span in spans:
        assert MARKER not in repr(dict(span.attributes or {})), span.name
        assert MARKER not in repr([(e.name, dict(e.attributes or {})) for e in span.events])
        assert MARKER not in str(span.status.description)
        assert "tenxstore.thread_id" not in (span.attributes or {})
    assert MARKER not in repr(otel.metrics())
