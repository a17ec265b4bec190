"""Tracing and metrics through the OpenTelemetry API, when it is installed.

Every public call of a checkpointer (and of the LangGraph saver) is wrapped by
:func:`traced`: one span, ``tenxstore.<method>``, and its duration in the
``tenxstore.call.duration`` histogram. What happens inside a call — a retry, a wait
for a lock, a cache hit or miss, a Redis call that failed open, a tool-ledger
outcome — is counted by the small functions below, called where it happens.

Without ``opentelemetry-api`` (``pip install "tenxstore[otel]"``) :func:`traced`
returns the method inside the error boundary only (:mod:`tenxstore.boundary`) and
the counters only log: nothing else is paid. With the API
but no SDK (no tracer or meter provider set), a call pays one check and runs as it
would without it. Nested public calls (a cache decorator calling its repository, the
LangGraph saver deleting a thread) are one span: the outermost.

Nothing a user stored — states, messages, tool arguments or results, error messages
that may quote them — ever becomes an attribute. Thread and user ids are recorded
only when the operator opts in: ``TENXSTORE_TELEMETRY_IDS=1`` in the environment, or
:func:`configure` with ``record_ids=True``.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar, cast

from .boundary import guard, translated
from .errors import StaleStateError

# The optional extra, tenxstore[otel]: looked for here, imported once the application
# has loaded OpenTelemetry itself (see _unbound), as it must to set a provider.
_API = importlib.util.find_spec("opentelemetry") is not None
_metrics: Any = None
_trace: Any = None
_ProxyTracerProvider: Any = None
_Status: Any = None
_StatusCode: Any = None

__all__ = [
    "SCOPE",
    "cache_fail_open",
    "cache_lookup",
    "configure",
    "connection_lost",
    "enabled",
    "lock_timed_out",
    "lock_waited",
    "record_ids",
    "retried",
    "tool_outcome",
    "traced",
]

SCOPE = "tenxstore"
"""The instrumentation scope (tracer and meter name)."""

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])
_BACKENDS = {"postgresql": "postgresql", "pgbouncer": "postgresql", "sqlite": "sqlite"}
_DURATION_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


_record_ids = _env_flag("TENXSTORE_TELEMETRY_IDS")
_on = False  # a tracer or meter provider has been set (never unset: OTel sets them once)


def configure(*, record_ids: bool | None = None) -> None:
    """Process-wide telemetry settings.

    Args:
        record_ids: Put ``tenxstore.thread_id`` and ``tenxstore.user_id`` on spans (and
            ids in log messages). Off by default; ``TENXSTORE_TELEMETRY_IDS=1`` turns it
            on at import.
    """
    global _record_ids
    if record_ids is not None:
        _record_ids = bool(record_ids)


def record_ids() -> bool:
    """Whether the operator opted into ids on spans and in log messages."""
    return _record_ids


def _provider_set() -> bool:
    """Whether a tracer or meter provider has been set, by OTel's public functions
    (each looks the environment up: about a microsecond)."""
    tracing = not isinstance(_trace.get_tracer_provider(), _ProxyTracerProvider)
    metering = type(_metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider"
    return tracing or metering


def _globals_set() -> bool:
    """The same, from the two globals OTel keeps them in (``set_tracer_provider`` and
    ``set_meter_provider`` set them): the check a call pays while none is set."""
    return _trace_globals._TRACER_PROVIDER is not None or (
        _metrics_globals._METER_PROVIDER is not None
    )


def enabled() -> bool:
    """Whether spans and metrics are recorded: the API is installed and a tracer or
    meter provider has been set."""
    global _on
    if not _on and _API:
        _on = _check()
    return _on


def _choose_check() -> Callable[[], bool]:
    """The fast check where OTel's globals are where this release knows them and no
    provider is named in the environment (OTel would load it on first use)."""
    global _trace_globals, _metrics_globals
    if not _API:
        return lambda: False
    try:
        import opentelemetry.metrics._internal as metrics_globals
        import opentelemetry.trace as trace_globals

        trace_globals._TRACER_PROVIDER  # noqa: B018  # present in this release?
        metrics_globals._METER_PROVIDER  # noqa: B018
    except (ImportError, AttributeError):  # pragma: no cover - another OTel release
        return _provider_set
    _trace_globals, _metrics_globals = trace_globals, metrics_globals
    named = ("OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")
    return _provider_set if any(name in os.environ for name in named) else _globals_set


def _bind() -> Callable[[], bool]:
    """Import the OpenTelemetry API the calls use; the check of a provider (one that
    is always False when the API is not there: an ``opentelemetry`` namespace without
    ``opentelemetry-api`` records nothing, as before)."""
    global _API, _metrics, _trace, _ProxyTracerProvider, _Status, _StatusCode
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.trace import ProxyTracerProvider, Status, StatusCode
    except ImportError:
        _API = False
        return lambda: False
    _metrics, _trace = metrics, trace
    _ProxyTracerProvider, _Status, _StatusCode = ProxyTracerProvider, Status, StatusCode
    return _choose_check()


def _unbound() -> bool:
    """The check while OpenTelemetry is not loaded: no provider can have been set
    without loading it, so nothing is recorded, and a process that never loads it
    never pays its import. Once the application has loaded it, the real check."""
    global _check
    if "opentelemetry.trace" not in sys.modules and "opentelemetry.metrics" not in sys.modules:
        return False
    _check = _bind()
    return _check()


_trace_globals: Any = None
_metrics_globals: Any = None
# A provider named in the environment is loaded by OpenTelemetry on first use, which
# may be ours: then bind at once.
if _API and any(
    name in os.environ for name in ("OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")
):
    _check = _bind()
else:
    _check = _unbound


class _Instruments:
    """The tracer and the instruments, made once (OTel's proxies follow a provider
    that is set later)."""

    def __init__(self) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            release = version("tenxstore")
        except PackageNotFoundError:  # pragma: no cover - a checkout never installed
            release = "0+unknown"
        self.tracer = _trace.get_tracer(SCOPE, release)
        meter = _metrics.get_meter(SCOPE, release)
        self.duration = meter.create_histogram(
            "tenxstore.call.duration",
            unit="s",
            description="Duration of a public tenxstore call.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.writes = meter.create_counter(
            "tenxstore.writes", unit="{write}", description="Durable writes committed."
        )
        self.conflicts = meter.create_counter(
            "tenxstore.conflicts",
            unit="{conflict}",
            description="Writes refused by the compare-and-swap (StaleStateError).",
        )
        self.retries = meter.create_counter(
            "tenxstore.retries", unit="{retry}", description="Statements or connections retried."
        )
        self.lock_waits = meter.create_histogram(
            "tenxstore.lock.wait",
            unit="s",
            description="Time a write waited for a lock tenxstore waits for itself.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.lock_timeouts = meter.create_counter(
            "tenxstore.lock.timeouts",
            unit="{timeout}",
            description="Writes that waited longer than lock_timeout (LockTimeout).",
        )
        self.connection_losses = meter.create_counter(
            "tenxstore.connection.losses",
            unit="{loss}",
            description="Connections to the database lost in the middle of a call.",
        )
        self.cache_hits = meter.create_counter(
            "tenxstore.cache.hits", unit="{lookup}", description="Cached reads served by Redis."
        )
        self.cache_misses = meter.create_counter(
            "tenxstore.cache.misses",
            unit="{lookup}",
            description="Cached reads Redis answered without an entry.",
        )
        self.cache_fail_open = meter.create_counter(
            "tenxstore.cache.fail_open",
            unit="{call}",
            description="Redis calls skipped or failed: served from the database.",
        )
        self.tool_outcomes = meter.create_counter(
            "tenxstore.tool.outcomes", unit="{outcome}", description="Tool-ledger outcomes."
        )


_made: _Instruments | None = None


def _instruments() -> _Instruments:
    global _made
    if _made is None:
        _made = _Instruments()
    return _made


class _Call:
    """What one public call has seen so far (its span's attributes at the end)."""

    __slots__ = ("cache", "retries")

    def __init__(self) -> None:
        self.retries = 0
        self.cache: str | None = None


_CALL: ContextVar[_Call | None] = ContextVar("tenxstore_call", default=None)


def _backend_of(obj: Any) -> str:
    """``postgresql``, ``sqlite`` or ``memory``: what a checkpointer (a decorator, a
    saver) stores in, found through ``.inner`` / ``.checkpointer``."""
    for _ in range(8):
        backend = getattr(obj, "backend", None)
        name = getattr(backend, "name", None)
        if isinstance(name, str):
            return _BACKENDS.get(name, name)
        obj = getattr(obj, "inner", None) or getattr(obj, "checkpointer", None)
        if obj is None:
            break
    return "other"


def _id(value: Any) -> str | int | None:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return value
    if isinstance(value, uuid.UUID):
        return str(value)
    return None


def _ids(obj: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The thread and user ids of a call's config (only when the operator opted in)."""
    config = kwargs.get("config", args[0] if args else None)
    if not isinstance(config, Mapping):
        return {}
    conf = config.get("configurable")
    inner: Mapping[str, Any] = conf if isinstance(conf, Mapping) else {}
    found = {}
    for key in ("thread_id", "user_id"):
        value = _id(config.get(key, inner.get(key)))
        if value is None and key == "user_id":
            value = _id(getattr(obj, "user_id", None))  # a saver bound to a user
        if value is not None:
            found[f"tenxstore.{key}"] = value
    return found


def traced(*, write: bool = False, prefix: str = "") -> Callable[[_F], _F]:
    """Wrap a public async method in a span and its duration (see the module).

    Args:
        write: A successful call counts in ``tenxstore.writes``.
        prefix: Put before the method's name (``"langgraph."`` for the saver).
    """

    def decorate(fn: _F) -> _F:
        if not _API:
            return guard(fn)  # no OpenTelemetry: the method in the error boundary
        operation = prefix + fn.__name__

        @functools.wraps(fn)
        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                if _CALL.get() is not None or not (_on or enabled()):
                    return await fn(self, *args, **kwargs)
                return await _run(operation, write, fn, self, args, kwargs)
            except Exception as exc:  # the error boundary (see tenxstore.boundary)
                out = translated(exc)
                if out is exc:
                    raise
                raise out from exc

        return cast(_F, call)

    return decorate


async def _run(
    operation: str,
    write: bool,
    fn: Callable[..., Awaitable[Any]],
    obj: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    made = _instruments()
    attributes: dict[str, Any] = {
        "tenxstore.operation": operation,
        "tenxstore.backend": _backend_of(obj),
    }
    span_attributes = {**attributes, **_ids(obj, args, kwargs)} if _record_ids else attributes
    call = _Call()
    token = _CALL.set(call)
    outcome = "ok"
    started = time.perf_counter()
    with made.tracer.start_as_current_span(
        f"tenxstore.{operation}",
        attributes=span_attributes,
        record_exception=False,  # its message may quote what was stored
        set_status_on_exception=False,
    ) as span:
        try:
            return await fn(obj, *args, **kwargs)
        except BaseException as exc:
            kind = type(exc)
            outcome = kind.__qualname__
            span.set_status(_Status(_StatusCode.ERROR))
            span.set_attribute("error.type", f"{kind.__module__}.{kind.__qualname__}")
            if isinstance(exc, StaleStateError):
                made.conflicts.add(1, attributes)
            raise
        finally:
            elapsed = time.perf_counter() - started
            _CALL.reset(token)
            span.set_attribute("tenxstore.outcome", outcome)
            span.set_attribute("tenxstore.retries", call.retries)
            if call.cache is not None:
                span.set_attribute("tenxstore.cache.result", call.cache)
            if write and outcome == "ok":
                made.writes.add(1, attributes)
            made.duration.record(elapsed, {**attributes, "tenxstore.outcome": outcome})


# -- what happens inside a call: each logs to its module's logger, and counts ----------


def retried(log: logging.Logger, backend: str, reason: str) -> None:
    """A statement or connection is tried again (``reason`` says why, in words)."""
    log.debug("%s: retrying: %s", backend, reason)
    call = _CALL.get()
    if call is not None:
        call.retries += 1
    if _on or enabled():
        _instruments().retries.add(1, {"tenxstore.backend": _BACKENDS.get(backend, backend)})


def lock_waited(log: logging.Logger, backend: str, seconds: float) -> None:
    """A write waited ``seconds`` for a lock before it got it (a lock tenxstore waits
    for itself: SQLite's write lock; PostgreSQL's row locks are waited for inside the
    statement, within the call's duration)."""
    log.debug("%s: waited %.3fs for the write lock", backend, seconds)
    if _on or enabled():
        _instruments().lock_waits.record(
            seconds, {"tenxstore.backend": _BACKENDS.get(backend, backend)}
        )


def lock_timed_out(log: logging.Logger, backend: str, waited: str) -> None:
    """A write gave up waiting for its lock (``LockTimeout``)."""
    log.warning(
        "%s: a write waited more than %s for a thread's lock (LockTimeout)", backend, waited
    )
    if _on or enabled():
        _instruments().lock_timeouts.add(1, {"tenxstore.backend": _BACKENDS.get(backend, backend)})


def connection_lost(log: logging.Logger, backend: str, committed: bool | None) -> None:
    """A connection to the database was lost mid-call (``ConnectionLost``): whether the
    write committed is ``committed`` (None: unknown)."""
    outcome = {False: "nothing was written", None: "the write may have been applied"}
    log.warning(
        "%s: the connection to the database was lost; %s",
        backend,
        outcome.get(committed, "the write was applied"),
    )
    if _on or enabled():
        _instruments().connection_losses.add(
            1, {"tenxstore.backend": _BACKENDS.get(backend, backend)}
        )


def cache_lookup(result: str) -> None:
    """A cached read's outcome: ``"hit"``, ``"miss"`` or ``"fail_open"`` (Redis was not
    usable; ``tenxstore.cache.fail_open`` counted the call itself)."""
    call = _CALL.get()
    if call is not None:
        call.cache = result
    if _on or enabled():
        made = _instruments()
        if result == "hit":
            made.cache_hits.add(1)
        elif result == "miss":
            made.cache_misses.add(1)


def cache_fail_open(operation: str) -> None:
    """A Redis call (``get``, ``put``, ``invalidate``, ``delete``) was skipped while
    Redis is marked down, or failed: the call is served by the database alone. (The
    module that knows the window logs it, once per window.)"""
    if _on or enabled():
        _instruments().cache_fail_open.add(1, {"tenxstore.cache.operation": operation})


def tool_outcome(log: logging.Logger, outcome: str, tool_name: str | None = None) -> None:
    """A tool-ledger outcome. Routine ones are logged at DEBUG; those an operator
    should see (a lease taken over from a worker that went silent, an outcome that
    arrived after its claim was lost, a tool-call id reused for another call) at
    WARNING. The tool's name is recorded; its arguments and results never are."""
    level = logging.WARNING if outcome in _NOTEWORTHY else logging.DEBUG
    if log.isEnabledFor(level):
        log.log(level, "tool call of %s: %s", tool_name or "a tool", _WORDS.get(outcome, outcome))
    if _on or enabled():
        attributes = {"tenxstore.tool.outcome": outcome}
        if tool_name is not None:
            attributes["tenxstore.tool.name"] = tool_name
        _instruments().tool_outcomes.add(1, attributes)


_NOTEWORTHY = frozenset({"taken_over", "claim_lost", "mismatch"})
_WORDS = {
    "claimed": "claimed",
    "reclaimed": "claimed again after a failure",
    "taken_over": "its lease expired and another worker took the call over",
    "replayed": "already succeeded: the stored result is replayed",
    "in_progress": "another worker holds a live claim",
    "mismatch": "the tool_call_id was reused for another tool or other arguments",
    "succeeded": "succeeded",
    "failed": "failed",
    "kept": "an outcome after the first success was ignored (the first success wins)",
    "claim_lost": "an outcome from a claim that lost its lease was refused",
    "not_found": "an outcome for a call never claimed",
}
