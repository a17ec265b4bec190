"""What naming the master costs a cached read: the read script against a plain GET.

A cache hit was one ``GET``; it is now one ``EVALSHA`` of ``GET_SCRIPT``
(``tenxstore/redis_scripts.py``), which reads INFO's replication section (the master's
id and role), GETs the entry, checks the master it names (``m:<master_replid>:`` in
front of the JSON) and hands it back whole, and the client cuts that name off (timed
with it). Both read the same entry (a state of ``--size`` bytes, stored by the
cache's own put script) on one held connection, in one process; each round runs
``--calls`` of each, the order shuffled every round (seeded), and the paired
difference of the round's medians is what is reported, in wall time and in this
process's CPU time (the client's share), with Redis's own microseconds per call
(``INFO commandstats``, the server's share).

    python benchmarks/cache_read.py                    # 1 KB and 20 KB states, 20 rounds
    python benchmarks/cache_read.py --rounds 3 --calls 50 --size 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import uuid
from typing import Any

from redis.asyncio import Redis
from workload import REDIS_URL

from tenxstore.redis_scripts import GET_SCRIPT, MASTER_SCRIPT, PUT_SCRIPT


async def server_usec(redis: Redis) -> dict[str, tuple[int, int]]:
    """(calls, microseconds) of GET and EVALSHA so far, as Redis counts them."""
    stats = await redis.info("commandstats")
    return {
        name: (stats[f"cmdstat_{name}"]["calls"], stats[f"cmdstat_{name}"]["usec"])
        for name in ("get", "evalsha")
        if f"cmdstat_{name}" in stats
    }


async def one_size(redis: Redis, size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Per-round medians (ms) of each read, wall and CPU, and the server's µs per call."""
    rng = random.Random(args.seed)
    key = f"bench-cache-read:{uuid.uuid4().hex}"
    state = json.dumps({"text": "x" * max(0, size - 12)}, separators=(",", ":"))
    put, get, master = [await redis.script_load(s) for s in (PUT_SCRIPT, GET_SCRIPT, MASTER_SCRIPT)]
    me = (await redis.evalsha(master, 1, key)).decode()
    await redis.evalsha(put, 1, key, 1, 1, 600_000, "", "," + state[1:], "", me, 60_000)
    tag = b"m:" + me.encode() + b":"

    async def script() -> bytes:
        raw = await redis.evalsha(get, 1, key)
        assert isinstance(raw, bytes)  # a hit is the entry itself, as RedisCache.get reads it
        end = raw.find(b":", 2)
        return raw[end + 1 :]

    assert json.loads(await script())["text"] == json.loads(state)["text"]
    assert (await redis.get(key)).startswith(tag + b'{"__checkpoint_version__":1,')
    reads = {"plain GET": lambda: redis.get(key), "read script": script}
    for read in reads.values():  # warm
        for _ in range(100):
            await read()
    wall: dict[str, list[float]] = {name: [] for name in reads}
    cpu: dict[str, list[float]] = {name: [] for name in reads}
    before = await server_usec(redis)
    for _ in range(args.rounds):
        order = list(reads)
        rng.shuffle(order)
        for name in order:
            walls, cpus = [], []
            for _ in range(args.calls):
                w, c = time.perf_counter(), time.process_time()
                await reads[name]()
                walls.append(time.perf_counter() - w)
                cpus.append(time.process_time() - c)
            wall[name].append(statistics.median(walls) * 1000)
            cpu[name].append(statistics.mean(cpus) * 1000)  # process_time is coarse
    after = await server_usec(redis)
    await redis.delete(key)
    server = {
        name: (after[name][1] - before[name][1]) / max(1, after[name][0] - before[name][0])
        for name in ("get", "evalsha")
        if name in before and name in after
    }
    return {"wall": wall, "cpu": cpu, "server": server}


def paired(samples: dict[str, list[float]]) -> tuple[float, float, float]:
    """(median of plain GET, of the script, median of the rounds' differences)."""
    plain, script = samples["plain GET"], samples["read script"]
    differences = [s - p for p, s in zip(plain, script, strict=True)]
    return statistics.median(plain), statistics.median(script), statistics.median(differences)


async def run(args: argparse.Namespace) -> None:
    redis = Redis.from_url(REDIS_URL)
    try:
        print(f"{args.rounds} rounds of {args.calls} reads each, shuffled (seed {args.seed})")
        print("| state | measure | plain GET | read script | paired difference |")
        print("|---|---|---:|---:|---:|")
        for size in args.size:
            found = await one_size(redis, size, args)
            for measure in ("wall", "cpu"):
                plain, script, diff = paired(found[measure])
                unit = "ms (p50)" if measure == "wall" else "ms CPU (mean)"
                print(
                    f"| {size} B | {unit} | {plain:.4f} | {script:.4f} | {diff:+.4f} "
                    f"({diff / plain * 100:+.0f}%) |"
                )
            server = found["server"]
            if "get" in server and "evalsha" in server:
                print(
                    f"| {size} B | Redis µs/call | {server['get']:.2f} | "
                    f"{server['evalsha']:.2f} | {server['evalsha'] - server['get']:+.2f} |"
                )
    finally:
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=250, help="reads a round and kind")
    parser.add_argument("--size", type=int, nargs="+", default=[1000, 20000])
    parser.add_argument("--seed", type=int, default=1)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
