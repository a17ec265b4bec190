"""The benchmark still runs end to end (a tiny workload; the numbers are not checked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import services

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_benchmark_smoke(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the bench extra is not installed")
    pytest.importorskip("langgraph.checkpoint.postgres", reason="the bench extra is not installed")
    out = tmp_path / "bench.md"
    env = {
        **os.environ,
        "TENXSTORE_BENCH_PG_URL": services.pg_url(),
        "TENXSTORE_BENCH_REDIS_URL": services.redis_url(),
    }
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "conversation.py"),
            "--turns",
            "25",
            "--flat-turns",
            "25",
            "--flat-repeats",
            "1",
            "--threads",
            "4",
            "--thread-turns",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    for heading in ("## Ratios", "## Bytes stored", "## SQL statements", "## Throughput"):
        assert heading in text
    assert "langgraph" in text
    assert (tmp_path / "benchmark-latency.png").stat().st_size > 1000


@pytest.mark.slow
def test_floors_smoke(tmp_path: Path) -> None:
    """The floors benchmark runs end to end on a tiny workload (numbers not checked)."""
    pytest.importorskip("matplotlib", reason="the bench extra is not installed")
    out = tmp_path / "floors.md"
    env = {
        **os.environ,
        "TENXSTORE_BENCH_PG_URL": services.pg_url(),
        "TENXSTORE_BENCH_REDIS_URL": services.redis_url(),
    }
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "floors.py"),
            *("--turns", "12", "--runs", "1", "--tp-turns", "3", "--tp-sizes", "1,4"),
            *("--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    for heading in ("## Ratios", "## Statements and round trips", "## Throughput", "## HOT"):
        assert heading in text
    assert (tmp_path / "benchmark-floors.png").stat().st_size > 1000
