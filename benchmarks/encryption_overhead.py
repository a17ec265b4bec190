"""What encryption at rest costs: the ~5 KB state workload (``workload.py``), plain and
encrypted, on PostgreSQL and a SQLite file.

Each turn writes a state with its two messages (``aput_checkpoint``) and reads the state
back (``aget_state``), on two repositories — one without a key ring, one with — in
their own schemas (files), the two taking turns within every turn so a busy machine
slows both alike. Printed: the median microseconds of a write, a read and a whole
turn (read and write; wall, and this process's CPU over the whole run), and
encrypted / plain.

Beside them, the floor of the read: the row tenxstore just wrote fetched on the raw
driver (asyncpg, prepared, on a held connection; sqlite3 in one thread hop) and given
to ``orjson`` — opened first, for the sealed one, with ``pybase64`` and
``cryptography``'s AES-GCM called directly. Its encrypted / plain is what opening
costs a read with nothing of tenxstore in the way: the overhead no implementation of
this envelope can go below.

    TENXSTORE_BENCH_PG_URL=postgresql://postgres@127.0.0.1:5432/test \\
        python benchmarks/encryption_overhead.py --turns 400 --runs 3
    python benchmarks/encryption_overhead.py --turns 50 --runs 1 --sqlite-only
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pybase64
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from workload import PG_URL, drop_schema, make_schema, next_state, turn_messages

import tenxstore


class TimedKeyRing(tenxstore.KeyRing):
    """A key ring that clocks what opening envelopes costs inside the read path (where
    the caches are colder than in a loop of decryptions alone)."""

    samples: list[float] = []  # noqa: RUF012  (one list for the process, on purpose)

    def open_json(
        self, text: str, thread_id: Any, column: str, life: tenxstore.Life | None = None
    ) -> str | bytes:
        t0 = time.perf_counter()
        try:
            return super().open_json(text, thread_id, column, life)
        finally:
            TimedKeyRing.samples.append(time.perf_counter() - t0)


KEY = bytes(range(32))
KEYS = TimedKeyRing([("bench", KEY)])
_HEAD = "!tx2:bench:"
_AAD = b"tenxstore\x00" + _HEAD.encode() + b"\x00states.state_data\x00"


def life_tag(incarnation: int, owner: str) -> bytes:
    """The thread's life as a tx2 envelope's associated data names it (see
    ``tenxstore.envelopes.life_tag``): the incarnation, the owner length-prefixed."""
    named = b"=" + owner.encode()
    return b"%d\x00%d:%s\x00" % (incarnation, len(named), named)


def open_floor(text: str, aad: bytes, cipher: AESGCM) -> Any:
    """A stored state opened with nothing but the libraries: base64, AES-GCM, orjson
    (``aad``: the associated data, the thread's life and id with it, known already:
    tenxstore reads the life in the same row as the state, at no cost of a round trip)."""
    if not text.startswith("!"):
        return orjson.loads(text)
    raw = memoryview(pybase64.b64decode(text[len(_HEAD) :], validate=True))
    return orjson.loads(cipher.decrypt(raw[:12], raw[12:], aad))


class FloorReader:
    """The head state's row read on the raw driver: asyncpg prepared on a held
    connection, or sqlite3 in one thread hop (as ``floors.py`` reads)."""

    SQL = "SELECT state_data FROM {}states WHERE thread_id = {} ORDER BY version DESC LIMIT 1"

    def __init__(self, url: str, schema: str | None) -> None:
        self.url, self.schema = url, schema
        self.pg: Any = None
        self.lite: sqlite3.Connection | None = None
        self.cipher = AESGCM(KEY)
        self.aad: bytes | None = None  # known once the thread exists (its life is fixed)

    async def start(self) -> FloorReader:
        if self.schema is not None:
            self.pg = await asyncpg.connect(self.url)
            self.stmt = await self.pg.prepare(self.SQL.format(f'"{self.schema}".', "$1"))
        else:
            path = self.url.removeprefix("sqlite:///")
            self.lite = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        return self

    def _lite_read(self, thread_id: str) -> str:
        assert self.lite is not None
        row = self.lite.execute(self.SQL.format("", "?"), (thread_id,)).fetchone()
        return str(row[0])

    async def read(self, thread_id: str, incarnation: int | None) -> Any:
        if self.pg is not None:
            text = await self.stmt.fetchval(thread_id)
        else:
            text = await asyncio.to_thread(self._lite_read, thread_id)
        if self.aad is None:
            assert incarnation is not None
            self.aad = _AAD + life_tag(incarnation, "u") + thread_id.encode()
        return open_floor(text, self.aad, self.cipher)

    async def close(self) -> None:
        if self.pg is not None:
            await self.pg.close()
        if self.lite is not None:
            self.lite.close()


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
    floors = {
        mode: await FloorReader(url.replace("{mode}", mode), schema and f"{schema}_{mode}").start()
        for mode in modes
    }
    kinds = ("write", "read", "turn", "floor")
    times: dict[str, dict[str, list[float]]] = {m: {k: [] for k in kinds} for m in modes}
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
                life = config.get("_checkpoint_incarnation")
                assert await floors[mode].read("bench", life) == state
                t3 = time.perf_counter()
                if turn >= 10:  # warmed up
                    times[mode]["read"].append((t1 - t0) * 1e6)
                    times[mode]["write"].append((t2 - t1) * 1e6)
                    times[mode]["turn"].append((t2 - t0) * 1e6)
                    times[mode]["floor"].append((t3 - t2) * 1e6)
    finally:
        for floor in floors.values():
            await floor.close()
        for mode, cp in repos.items():
            await cp.aclose()
            if schema is not None:
                await drop_schema(url, f"{schema}_{mode}")
    result: dict[str, Any] = {
        mode: {
            **{kind: statistics.median(times[mode][kind]) for kind in kinds},
            "cpu": cpu[mode] / turns * 1e6,
        }
        for mode in modes
    }
    result["open"] = statistics.median(TimedKeyRing.samples[10:]) * 1e6
    return result


def report(name: str, runs: list[dict[str, Any]]) -> None:
    print(f"\n{name}: median of {len(runs)} run(s) (microseconds per call)")
    columns = ("write", "read", "turn", "cpu", "floor")
    heads = ("write", "read", "turn", "cpu/turn", "floor read")
    print(f"{'':<10} " + " ".join(f"{h:>10}" for h in heads))
    medians = {
        mode: {k: statistics.median(r[mode][k] for r in runs) for k in columns}
        for mode in ("plain", "encrypted")
    }
    for mode, m in medians.items():
        print(f"{mode:<10} " + " ".join(f"{m[k]:>10.0f}" for k in columns))
    p, e = medians["plain"], medians["encrypted"]
    print(f"{'ratio':<10} " + " ".join(f"{e[k] / p[k]:>9.3f}x" for k in columns))
    opening = statistics.median(r["open"] for r in runs)
    print(
        f"opening a sealed state inside a read (base64 and AES-GCM; median): {opening:.1f} us,"
        f" {opening / p['read']:.1%} of a plain read; the floor read's opening costs "
        f"{e['floor'] - p['floor']:.1f} us, {(e['floor'] - p['floor']) / p['floor']:.1%} of"
        " its plain read"
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
