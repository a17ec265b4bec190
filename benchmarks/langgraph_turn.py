"""Where a LangGraph chat turn goes: one saver alone in a process (no interleaving).

The graph of ``langgraph_chat.py`` on one thread for ``--turns`` turns; prints the
mean wall and CPU time (this process's, all threads) of the last 50 turns, and with
``--profile`` a cProfile of them. Compare ``memory`` (the graph and LangGraph's serde
with no storage) with ``pg`` and ``sqlite`` (tenxstore): the difference is what the
storage costs a turn.

    python benchmarks/langgraph_turn.py memory
    python benchmarks/langgraph_turn.py pg --turns 200
    python benchmarks/langgraph_turn.py sqlite --variant delta --profile
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph_chat import build_graph, words  # beside this file (sys.path[0])

import tenxstore
from tenxstore.langgraph import TenxCheckpointSaver

PG_URL = os.environ.get("TENXSTORE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
LAST = 50


async def run(args: argparse.Namespace, folder: Path) -> None:
    cp: Any = None
    saver: Any
    schema = f"turn_{uuid.uuid4().hex[:8]}"
    if args.saver == "memory":
        saver = InMemorySaver()
    else:
        url = PG_URL if args.saver == "pg" else f"sqlite:///{folder / 'turn.db'}"
        cp = tenxstore.CheckpointRepository(
            url,
            schema=schema if args.saver == "pg" else None,
            enforce_user_isolation=False,
        )
        await cp.asetup()
        saver = TenxCheckpointSaver(cp)
    rng = random.Random(16)
    graph = build_graph(args.variant, [words(rng) for _ in range(args.turns)], saver)
    config = {"configurable": {"thread_id": "turn"}}
    profiler = cProfile.Profile()
    wall = cpu = 0.0
    try:
        for turn in range(args.turns):
            last = turn >= args.turns - LAST
            message = HumanMessage(content=words(rng), id=f"human-{turn}")
            if last and args.profile:
                profiler.enable()
            started, used = time.perf_counter(), time.process_time()
            await graph.ainvoke({"messages": [message]}, config)
            if last:
                wall += time.perf_counter() - started
                cpu += time.process_time() - used
            if last and args.profile:
                profiler.disable()
    finally:
        if cp is not None:
            if args.saver == "pg":
                async with cp.engine.begin() as conn:
                    await conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await cp.aclose()
    turns = min(LAST, args.turns)
    print(
        f"{args.saver}/{args.variant}: turns {args.turns - turns + 1}-{args.turns}: "
        f"wall {wall / turns * 1000:.2f} ms, CPU {cpu / turns * 1000:.2f} ms a turn"
        + (" (profiled)" if args.profile else "")
    )
    if args.profile:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("saver", choices=["memory", "pg", "sqlite"])
    parser.add_argument("--variant", choices=["plain", "delta"], default="plain")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--profile", action="store_true", help="cProfile the last 50 turns")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lgturn-") as folder:
        asyncio.run(run(args, Path(folder)))


if __name__ == "__main__":
    main()
