"""What tenxstore's telemetry costs a call: ``aget_state`` on a SQLite file, N times,
in three kinds of process:

* ``absent``: OpenTelemetry cannot be imported (tenxstore without the ``otel`` extra):
  the methods are not wrapped at all;
* ``api``: ``opentelemetry-api`` installed, no SDK (no provider set): one check a call;
* ``sdk``: the SDK's providers, spans sampled and sent to a processor that drops them,
  metrics kept in memory: the full work of a span and its duration.

Each kind runs in its own process, the kinds taking turns ``--runs`` times; the median
microseconds per call (wall, and this process's CPU) are printed with the ratio to ``absent``.

    python benchmarks/telemetry_overhead.py                # 10 000 calls, 5 runs
    python benchmarks/telemetry_overhead.py --calls 200 --runs 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

KINDS = ("absent", "api", "sdk")

CHILD = r"""
import asyncio, json, sys, time
kind, path, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "absent":
    sys.modules["opentelemetry"] = None  # as if the extra were not installed
elif kind == "sdk":
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
import tenxstore
from tenxstore import telemetry

async def main():
    async with tenxstore.CheckpointRepository(f"sqlite:///{path}") as cp:
        await cp.asetup()
        config = {"thread_id": "t", "user_id": "u"}
        await cp.aput_state(config, {"n": 1, "text": "x" * 2000})
        for _ in range(200):  # warm up
            await cp.aget_state(config)
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            await cp.aget_state(config)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    us = {"wall": elapsed / calls * 1e6, "cpu": cpu / calls * 1e6}
    print(json.dumps({**us, "enabled": telemetry.enabled()}))

asyncio.run(main())
"""


def run(kind: str, path: Path, calls: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(path), str(calls)],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["enabled"] == (kind == "sdk"), (kind, result)
    return {"wall": float(result["wall"]), "cpu": float(result["cpu"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    times: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(options.runs):
            for kind in KINDS:
                times[kind].append(run(kind, Path(folder) / f"{kind}.db", options.calls))
    print(f"aget_state on SQLite, {options.calls} calls, median of {options.runs} runs")
    print(f"{'kind':<8} {'wall us':>8} {'vs absent':>10} {'cpu us':>8} {'vs absent':>10}")
    base = {m: statistics.median(t[m] for t in times["absent"]) for m in ("wall", "cpu")}
    for kind in KINDS:
        wall = statistics.median(t["wall"] for t in times[kind])
        cpu = statistics.median(t["cpu"] for t in times[kind])
        print(
            f"{kind:<8} {wall:>8.1f} {wall / base['wall']:>9.3f}x "
            f"{cpu:>8.1f} {cpu / base['cpu']:>9.3f}x"
        )


if __name__ == "__main__":
    main()
