"""What one round trip costs the client: PostgreSQL (asyncpg) against Redis (redis-py).

The measure behind "why Redis does not hold a LangGraph head" (docs/langgraph.md): a
chat turn is one read of the head and seven writes, and a head cached in Redis would
need a Redis command per write. Each system on a held connection, statements
prepared, the order shuffled every round; per call, wall time and this process's CPU
time (the client's share: the servers run in processes of their own).

* ``pg select``: ``SELECT 1``, prepared;
* ``pg insert+commit``: a one-row insert (300 bytes) committed on its own, prepared;
* ``redis get``: ``GET`` of a missing key;
* ``redis evalsha``: a one-line script writing a 500-byte hash field (what a cache's
  versioned put is).

    python benchmarks/round_trips.py                 # 20 rounds of 250 calls each
    python benchmarks/round_trips.py --rounds 5      # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from redis.asyncio import Redis
from workload import PG_URL, REDIS_URL


async def measure(args: argparse.Namespace) -> dict[str, tuple[list[float], list[float]]]:
    """Per system, the wall and CPU milliseconds of one call, one sample a round."""
    conn = await asyncpg.connect(PG_URL)
    redis = Redis.from_url(REDIS_URL)
    table = f"round_trips_{uuid.uuid4().hex[:8]}"
    key = f"round-trips:{uuid.uuid4().hex}"
    try:
        await conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v bytea)")
        select = await conn.prepare("SELECT 1")
        insert = await conn.prepare(f"INSERT INTO {table} (v) VALUES ($1)")
        script = await redis.script_load("return redis.call('HSET', KEYS[1], 'v', ARGV[1])")
        payload = b"x" * 500
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "pg select": lambda: select.fetchval(),
            "pg insert+commit": lambda: insert.fetchval(payload[:300]),
            "redis get": lambda: redis.get(key + ":missing"),
            "redis evalsha": lambda: redis.evalsha(script, 1, key, payload),
        }
        samples: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in calls}
        for call in calls.values():  # warm: plans, connections, scripts
            for _ in range(100):
                await call()
        for _ in range(args.rounds):
            order = list(calls)
            random.shuffle(order)
            for name in order:
                call = calls[name]
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(args.calls):
                    await call()
                samples[name][0].append((time.perf_counter() - wall) / args.calls * 1000)
                samples[name][1].append((time.process_time() - cpu) / args.calls * 1000)
        return samples
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.close()
        await redis.delete(key)
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=250, help="calls a round and system")
    args = parser.parse_args()
    samples = asyncio.run(measure(args))
    print("| call | wall ms (p50 of rounds) | client CPU ms (p50 of rounds) |")
    print("|---|---|---|")
    for name, (wall, cpu) in samples.items():
        print(f"| {name} | {statistics.median(wall):.3f} | {statistics.median(cpu):.3f} |")


if __name__ == "__main__":
    main()
