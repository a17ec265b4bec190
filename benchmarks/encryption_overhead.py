"""What encryption at rest costs: the ~5 KB state workload (``workload.py``), plain and
encrypted, on PostgreSQL and a SQLite file.

Each turn writes a state with its two messages (``aput_checkpoint``) and reads the state
back (``aget_state``), on two repositories — one without a key ring, one with — in
their own schemas (files), the two taking turns within every turn so a busy machine
slows both alike. Printed: the median microseconds of a write and a read (wall, and
this process's CPU over the whole run), and encrypted / plain.

    TENXSTORE_BENCH_PG_URL=postgresql://postgres@127.0.0.1:5432/test \\
        python benchmarks/encryption_overhead.py --turns 400 --runs 3
    python benchmarks/encryption_overhead.py --turns 50 --runs 1 --sqlite-only
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from workload import PG_URL, drop_schema, make_schema, next_state, turn_messages

import tenxstore


class TimedKeyRing(tenxstore.KeyRing):
    """A key ring that clocks what opening envelopes costs inside the read path (where
    the caches are colder than in a loop of decryptions alone)."""

    samples: list[float] = []  # noqa: RUF012  (one list for the process, on purpose)

    def open_json(self, text: str, thread_id: Any, column: str) -> str | bytes:
        t0 = time.perf_counter()
        try:
            return super().open_json(text, thread_id, column)
        finally:
            TimedKeyRing.samples.append(time.perf_counter() - t0)


KEYS = TimedKeyRing([("bench", bytes(range(32)))])


async def one_run(url: str, schema: str | None, turns: int, seed: int) -> dict[str, Any]:
    """One conversation per mode; per-call wall microseconds and total CPU seconds."""
    rng = random.Random(seed)
    modes = {"plain": None, "encrypted": KEYS}
    repos = {}
    for mode, keys in modes.items():
        place = None if schema is None else f"{schema}_{mode}"
        if place is not None:
            await make_schema(url, place)
        target = url if schema is not None else url.replace("{mode}", mode)
        repos[mode] = tenxstore.CheckpointRepository(target, schema=place, keys=keys)
        await repos[mode].asetup()
    times: dict[str, dict[str, list[float]]] = {m: {"write": [], "read": []} for m in modes}
    cpu = dict.fromkeys(modes, 0.0)
    TimedKeyRing.samples.clear()
    context: list[dict[str, Any]] = []
    try:
        for turn in range(turns):
            messages = turn_messages(turn, rng)
            context += messages
            state = next_state(turn, context, rng)
            order = list(modes)
            rng.shuffle(order)
            for mode in order:
                cp = repos[mode]
                config = {"thread_id": "bench", "user_id": "u"}
                c0 = time.process_time()
                t0 = time.perf_counter()
                await cp.aget_state(config)
                t1 = time.perf_counter()
                await cp.aput_checkpoint(config, state, [dict(m) for m in messages])
                t2 = time.perf_counter()
                cpu[mode] += time.process_time() - c0
                if turn >= 10:  # warmed up
                    times[mode]["read"].append((t1 - t0) * 1e6)
                    times[mode]["write"].append((t2 - t1) * 1e6)
    finally:
        for mode, cp in repos.items():
            await cp.aclose()
            if schema is not None:
                await drop_schema(url, f"{schema}_{mode}")
    result: dict[str, Any] = {
        mode: {
            "write": statistics.median(times[mode]["write"]),
            "read": statistics.median(times[mode]["read"]),
            "cpu": cpu[mode] / turns * 1e6,
        }
        for mode in modes
    }
    result["open"] = statistics.median(TimedKeyRing.samples[10:]) * 1e6
    return result


def report(name: str, runs: list[dict[str, Any]]) -> None:
    print(f"\n{name}: median of {len(runs)} run(s) (microseconds per call)")
    print(f"{'':<10} {'write':>9} {'read':>9} {'cpu/turn':>9}")
    medians = {
        mode: {k: statistics.median(r[mode][k] for r in runs) for k in ("write", "read", "cpu")}
        for mode in ("plain", "encrypted")
    }
    for mode, m in medians.items():
        print(f"{mode:<10} {m['write']:>9.0f} {m['read']:>9.0f} {m['cpu']:>9.0f}")
    p, e = medians["plain"], medians["encrypted"]
    print(
        f"{'ratio':<10} {e['write'] / p['write']:>8.3f}x {e['read'] / p['read']:>8.3f}x "
        f"{e['cpu'] / p['cpu']:>8.3f}x"
    )
    opening = statistics.median(r["open"] for r in runs)
    print(
        f"opening a sealed state inside a read (base64 and AES-GCM; median): {opening:.1f} us,"
        f" {opening / p['read']:.1%} of a plain read"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sqlite-only", action="store_true")
    options = parser.parse_args()
    if not options.sqlite_only:
        pg = []
        for run in range(options.runs):
            schema = f"bench_enc_{uuid.uuid4().hex[:8]}"
            pg.append(await one_run(PG_URL, schema, options.turns, run))
        report("PostgreSQL", pg)
    with tempfile.TemporaryDirectory() as folder:
        lite = []
        for run in range(options.runs):
            url = f"sqlite:///{Path(folder)}/run{run}-{{mode}}.db"
            lite.append(await one_run(url, None, options.turns, run))
        report("SQLite file", lite)


if __name__ == "__main__":
    asyncio.run(main())
