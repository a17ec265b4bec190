"""The soak in its CI length: worker processes, Redis restarted midway, every invariant."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import services

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_soak() -> None:
    seconds = os.environ.get("TENXSTORE_SOAK_SECONDS", "30")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "soak.py"),
            "--seconds",
            seconds,
            "--workers",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=float(seconds) + 300,
        env={**os.environ, "TENXSTORE_BENCH_PG_URL": services.pg_url()},
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "invariants: all hold" in done.stdout
    assert "errors: 0" in done.stdout
    assert "redis back at" in done.stdout
