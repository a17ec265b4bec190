"""The benchmarks still run end to end (tiny workloads; the numbers are not checked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import replication, services

ROOT = Path(__file__).resolve().parents[1]
# What the benchmarks import from the bench extra: LangGraph's own savers to compare
# with (psycopg comes with the PostgreSQL one) and matplotlib for the plots.
PG_SAVER, SQLITE_SAVER, PLOTS = (
    "langgraph.checkpoint.postgres",
    "langgraph.checkpoint.sqlite",
    "matplotlib",
)


def run_benchmark(script: str, *args: str) -> str:
    """Run a benchmark on the test services; what it printed."""
    env = {
        **os.environ,
        "TENXSTORE_BENCH_PG_URL": services.pg_url(),
        "TENXSTORE_BENCH_REDIS_URL": services.redis_url(),
        "TENXSTORE_BENCH_MYSQL_URL": services.mysql_url(),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_benchmark_smoke(tmp_path: Path) -> None:
    services.require_modules("bench", PG_SAVER, PLOTS)
    out = tmp_path / "bench.md"
    run_benchmark(
        "conversation.py",
        *("--turns", "25", "--flat-turns", "25", "--flat-repeats", "1"),
        *("--threads", "4", "--thread-turns", "2", "--out", str(out)),
    )
    text = out.read_text()
    for heading in ("## Ratios", "## Bytes stored", "## SQL statements", "## Throughput"):
        assert heading in text
    assert "langgraph" in text
    assert (tmp_path / "benchmark-latency.png").stat().st_size > 1000


@pytest.mark.slow
def test_floors_smoke(tmp_path: Path) -> None:
    services.require_modules("bench", PLOTS)
    out = tmp_path / "floors.md"
    run_benchmark(
        "floors.py",
        *("--turns", "12", "--runs", "1", "--tp-turns", "3", "--tp-sizes", "1,4"),
        *("--out", str(out)),
    )
    text = out.read_text()
    for heading in ("## Ratios", "## Statements and round trips", "## Throughput", "## HOT"):
        assert heading in text
    assert (tmp_path / "benchmark-floors.png").stat().st_size > 1000


@pytest.mark.slow
def test_langgraph_chat_smoke(tmp_path: Path) -> None:
    """#16's workload: a real chat graph on every saver (each checks the messages)."""
    services.require_modules("bench", PG_SAVER, SQLITE_SAVER, PLOTS)
    out = tmp_path / "lg.json"
    printed = run_benchmark(
        "langgraph_chat.py", "--quick", "--plot", str(tmp_path / "lg.png"), "--json", str(out)
    )
    assert out.stat().st_size > 100
    assert (tmp_path / "lg.png").stat().st_size > 1000
    assert "After every turn, outside the timings, garbage collected" in printed
    added = printed[printed.index("## What storage adds to the graph") :].split("\n\n")[1]
    rows = added.splitlines()[2:]  # below the table's header
    assert [row.split(" | ")[:2] for row in rows] == [  # every variant on both databases
        ["| plain", "pg"],
        ["| plain", "sqlite"],
        ["| delta", "pg"],
        ["| delta", "sqlite"],
    ]


@pytest.mark.slow
@pytest.mark.parametrize("saver", ["memory", "pg", "sqlite"])
def test_langgraph_turn_smoke(saver: str) -> None:
    """Where a turn goes: one saver alone (and its profile)."""
    services.require_modules("bench", PG_SAVER)  # langgraph_chat.py, which it imports
    run_benchmark("langgraph_turn.py", saver, "--turns", "3", "--profile")


def test_telemetry_overhead_smoke() -> None:
    script = str(ROOT / "benchmarks" / "telemetry_overhead.py")
    done = subprocess.run(
        [sys.executable, script, "--calls", "50", "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert {line.split()[0] for line in done.stdout.splitlines()[2:]} == {"absent", "api", "sdk"}


def test_encryption_overhead_smoke() -> None:
    """The ~5 KB state workload plain and encrypted, with the raw driver's floor (the
    floor reader checks every state it reads back against the one written)."""
    printed = run_benchmark("encryption_overhead.py", "--turns", "15", "--runs", "1")
    for database in ("PostgreSQL", "SQLite file"):
        assert f"\n{database}: median of 1 run(s)" in printed
    assert printed.count("the floor read's opening costs") == 2


def test_round_trips_smoke() -> None:
    """One round trip on each system, and the table of them."""
    printed = run_benchmark("round_trips.py", "--rounds", "1", "--calls", "5")
    rows = [line.split(" | ")[0] for line in printed.splitlines()[2:]]
    assert rows == ["| pg select", "| pg insert+commit", "| redis get", "| redis evalsha"]


@pytest.mark.slow
def test_cold_start_smoke() -> None:
    """Every program once in a fresh process, and the tables (printed, not written)."""
    services.require_modules("bench", PG_SAVER, SQLITE_SAVER)
    printed = run_benchmark("cold_start.py", "--runs", "1", "--out", "-")
    rows = [line for line in printed.splitlines() if line.startswith("| ")]
    assert any(line.startswith("| PostgreSQL | tenx-langgraph |") for line in rows)
    assert any(line.startswith("| `tenxstore --help`, seconds |") for line in rows)


@pytest.mark.slow
def test_langgraph_held_smoke() -> None:
    """A read that stops at the values held, against one that fetches every chain."""
    services.require_modules("bench", PG_SAVER)  # langgraph_chat.py, which it imports
    printed = run_benchmark("langgraph_held.py", "--turns", "4", "--runs", "1")
    assert printed.splitlines()[2].startswith("| 1 | ")


@pytest.mark.slow
def test_replica_reads_smoke() -> None:
    """A primary and a standby of its own: the three systems, and reads that moved."""
    if not replication.available():  # the rule of tests.replication.started
        services.require_path("PostgreSQL 15's server programs", replication.PG_BIN / "pg_rewind")
    printed = run_benchmark("replica_reads.py", "--rounds", "1", "--reads", "5")
    table = printed[printed.index("| system |") :].splitlines()
    rows = [line.split(" | ") for line in table[2:] if line.startswith("| ")]
    assert [row[0] for row in rows] == [
        "| floor (asyncpg, primary)",
        "| primary alone",
        "| primary + 1 replica",
    ]
    served = {row[0][2:]: row[-2] for row in rows}  # the share of reads a replica served
    assert served["primary alone"] == "0%"
    assert served["primary + 1 replica"] != "0%"


def test_cache_read_smoke() -> None:
    """The read script against a plain GET: the table, for each state size."""
    printed = run_benchmark("cache_read.py", "--rounds", "2", "--calls", "5", "--size", "500")
    rows = [line.split(" | ")[:2] for line in printed.splitlines()[3:]]
    assert rows == [
        ["| 500 B", "ms (p50)"],
        ["| 500 B", "ms CPU (mean)"],
        ["| 500 B", "Redis µs/call"],
    ]
