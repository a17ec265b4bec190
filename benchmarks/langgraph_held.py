"""What a read of the head saves by not fetching the values the process holds.

Two ``TenxCheckpointSaver``s on PostgreSQL (each its own schema) run the chat graph of
``langgraph_chat.py`` side by side in one process, with ``InMemorySaver`` as the
reference: ``held`` as shipped (the read stops a chain of deltas at the value the
process wrote or read last), ``whole`` forgetting what it holds before each read (the
read fetches and rebuilds every chain, as before). Turns interleaved, the order
shuffled every turn (seeded), garbage collected outside the timings. Printed: the p50
wall time of the last 50 turns, what each saver adds to the graph's turn (the paired
median of its turn less the memory saver's same turn) in wall and in this process's
CPU time, ``--runs`` times.

    python benchmarks/langgraph_held.py                # 200 turns, 3 runs
    python benchmarks/langgraph_held.py --turns 100 --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import time
import uuid
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph_chat import build_graph, words  # beside this file (sys.path[0])
from workload import PG_URL, drop_schema

import tenxstore
from tenxstore.langgraph import TenxCheckpointSaver

LAST = 50


async def one_run(turns: int, seed: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per saver, the wall and the CPU seconds of each turn."""
    rng = random.Random(seed)
    texts = [words(rng) for _ in range(turns)]
    savers: dict[str, Any] = {}
    opened: list[tuple[Any, str]] = []
    try:
        for name in ("held", "whole"):
            schema = f"lgheld_{uuid.uuid4().hex[:8]}"
            cp = tenxstore.CheckpointRepository(PG_URL, schema=schema, enforce_user_isolation=False)
            opened.append((cp, schema))
            await cp.asetup()
            savers[name] = TenxCheckpointSaver(cp)
        savers["whole"]._tables._bases.held = lambda thread, ns: {}  # held: nothing
        savers["memory"] = InMemorySaver()
        graphs = {name: build_graph("plain", texts, saver) for name, saver in savers.items()}
        walls: dict[str, list[float]] = {name: [] for name in graphs}
        cpus: dict[str, list[float]] = {name: [] for name in graphs}
        for turn in range(turns):
            order = list(graphs)
            rng.shuffle(order)
            for name in order:
                message = HumanMessage(content=texts[turn], id=f"human-{turn}")
                started, used = time.perf_counter(), time.process_time()
                await graphs[name].ainvoke(
                    {"messages": [message]}, {"configurable": {"thread_id": "chat"}}
                )
                walls[name].append(time.perf_counter() - started)
                cpus[name].append(time.process_time() - used)
            gc.collect()
            gc.freeze()
        return walls, cpus
    finally:
        for cp, schema in opened:
            await cp.aclose()
            await drop_schema(PG_URL, schema)


def adds(samples: dict[str, list[float]]) -> dict[str, float]:
    """What each tenxstore saver adds to the graph's turn (ms): the paired median of the
    last turns of its samples less the memory saver's same turns."""
    memory = samples["memory"][-LAST:]
    return {
        name: statistics.median(
            [(a - b) * 1000 for a, b in zip(samples[name][-LAST:], memory, strict=True)]
        )
        for name in ("held", "whole")
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(
        "| run | held p50 | whole p50 | memory p50 | held adds | whole adds | saved"
        " | held adds (CPU) | whole adds (CPU) | saved (CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run in range(args.runs):
        walls, cpus = asyncio.run(one_run(args.turns, seed=16 + run))
        p50 = {name: statistics.median(s[-LAST:]) * 1000 for name, s in walls.items()}
        wall, cpu = adds(walls), adds(cpus)
        print(
            f"| {run + 1} | {p50['held']:.2f} | {p50['whole']:.2f} | {p50['memory']:.2f}"
            f" | {wall['held']:.2f} | {wall['whole']:.2f} | {wall['whole'] - wall['held']:.2f}"
            f" | {cpu['held']:.2f} | {cpu['whole']:.2f} | {cpu['whole'] - cpu['held']:.2f} |"
        )


if __name__ == "__main__":
    main()
