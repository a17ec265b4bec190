"""What the benchmarks share: the conversation they write, and the services they use."""

from __future__ import annotations

import asyncio
import os
import random
import string
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' server runners (tests/servers.py)

PG_URL = os.environ.get("TENXSTORE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("TENXSTORE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
MYSQL_URL = os.environ.get("TENXSTORE_BENCH_MYSQL_URL", "mysql+asyncmy://root@127.0.0.1:3306/test")
ALPHABET = string.ascii_letters + string.digits + " "


def words(rng: random.Random, n: int = 200) -> str:
    """Random text of ``n`` characters."""
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def turn_messages(turn: int, rng: random.Random) -> list[dict[str, Any]]:
    """One turn's two messages, with the nulls real messages carry."""
    return [
        {"id": f"{turn}-u", "role": "user", "content": words(rng), "name": None},
        {"id": f"{turn}-a", "role": "assistant", "content": words(rng), "tool_calls": None},
    ]


def next_state(turn: int, context: list[dict[str, Any]], rng: random.Random) -> dict[str, Any]:
    """The state after a turn: a step counter, a summary, the last 20 messages as
    context, a few custom fields (about 5 KB, with some nulls)."""
    return {
        "step": turn,
        "summary": words(rng, 120),
        "context": context[-20:],
        "custom": {"mood": rng.choice(["calm", "busy"]), "score": rng.random(), "note": None},
    }


async def make_schema(url: str, schema: str) -> None:
    """An empty schema of that name (dropped first when it exists)."""
    con = await asyncpg.connect(url)
    try:
        await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE; CREATE SCHEMA "{schema}"')
    finally:
        await con.close()


async def drop_schema(url: str, schema: str) -> None:
    """Drop a schema and everything in it."""
    con = await asyncpg.connect(url)
    try:
        await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await con.close()


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed_runs(
    runs: list[tuple[str, Callable[[int], Awaitable[Any]]]],
    conversations: int,
    turns: int,
    seed: int,
) -> dict[str, dict[str, float]]:
    """Each system's ``conversations`` conversations at once (read + write a turn, the
    first turn untimed), the systems in a shuffled order: operations per second and
    this process's CPU seconds per operation, by system."""
    results: dict[str, dict[str, float]] = {}
    order = list(runs)
    random.Random(seed).shuffle(order)
    for name, conversation in order:
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(conversation(c) for c in range(conversations)))
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        ops = conversations * 2 * (turns - 1)
        results[name] = {"ops_per_s": ops / wall, "cpu_per_op": cpu / ops}
    return results


def section_marks(name: str) -> tuple[str, str]:
    """The comments around a section another benchmark owns in a document."""
    return f"<!-- section {name}: written by its own benchmark -->", f"<!-- /section {name} -->"


def kept_sections(path: Path) -> str:
    """The sections other benchmarks wrote into ``path`` (marked), to write back when
    this benchmark rewrites the rest of the document."""
    if not path.exists():
        return ""
    text, kept = path.read_text(), []
    start = "<!-- section "
    at = text.find(start)
    while at >= 0:
        end = text.find("<!-- /section ", at)
        close = text.find("-->", end) + 3
        kept.append(text[at:close])
        at = text.find(start, close)
    return "".join(f"\n{section}\n" for section in kept)


def replace_section(path: Path, name: str, body: str) -> None:
    """Write ``body`` as the section ``name`` of ``path``: in place of the old one, or
    at the end."""
    opening, closing = section_marks(name)
    block = f"{opening}\n{body.rstrip()}\n{closing}"
    text = path.read_text() if path.exists() else ""
    if opening in text:
        before, _, rest = text.partition(opening)
        _, _, after = rest.partition(closing)
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
