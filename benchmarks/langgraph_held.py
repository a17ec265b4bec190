"""What a read of the head saves by not fetching the values the process holds.

Two ``TenxCheckpointSaver``s on PostgreSQL (each its own schema) run the chat graph of
``langgraph_chat.py`` side by side in one process, with ``InMemorySaver`` as the
reference: ``held`` as shipped (the read stops a chain of deltas at the value the
process wrote or read last), ``whole`` forgetting what it holds before each read (the
read fetches and rebuilds every chain, as before). Turns interleaved, the order
shuffled every turn, garbage collected outside the timings. Printed: the p50 wall
time of the last 50 turns and what each saver adds to the graph's turn (the paired
median of its turn less the memory saver's same turn), ``--runs`` times.

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


async def one_run(turns: int, seed: int) -> dict[str, list[float]]:
    """Per saver, the wall seconds of each turn."""
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
        for turn in range(turns):
            order = list(graphs)
            random.shuffle(order)
            for name in order:
                message = HumanMessage(content=texts[turn], id=f"human-{turn}")
                started = time.perf_counter()
                await graphs[name].ainvoke(
                    {"messages": [message]}, {"configurable": {"thread_id": "chat"}}
                )
                walls[name].append(time.perf_counter() - started)
            gc.collect()
            gc.freeze()
        return walls
    finally:
        for cp, schema in opened:
            await cp.aclose()
            await drop_schema(PG_URL, schema)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("| run | held p50 | whole p50 | memory p50 | held adds | whole adds | saved |")
    print("|---|---|---|---|---|---|---|")
    for run in range(args.runs):
        walls = asyncio.run(one_run(args.turns, seed=16 + run))
        last = {name: [w * 1000 for w in samples[-LAST:]] for name, samples in walls.items()}
        p50 = {name: statistics.median(samples) for name, samples in last.items()}
        adds = {
            name: statistics.median(
                [a - b for a, b in zip(last[name], last["memory"], strict=True)]
            )
            for name in ("held", "whole")
        }
        print(
            f"| {run + 1} | {p50['held']:.2f} | {p50['whole']:.2f} | {p50['memory']:.2f}"
            f" | {adds['held']:.2f} | {adds['whole']:.2f} | {adds['whole'] - adds['held']:.2f} |"
        )


if __name__ == "__main__":
    main()
