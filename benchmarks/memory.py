"""Long-term memory beside the best peer: tenxstore's ``MemoryStore`` against LangGraph's
``AsyncPostgresStore`` (psycopg, pgvector HNSW, cosine) and ``InMemoryStore``, on the
same server, with the same vectors.

The measured user holds N memories (1k, 10k, ... ``--sizes``); nine other users hold N
in all, so a search that does not pre-filter by user would fill its top-k with
theirs. Vectors are synthetic and clustered (384 dimensions, 64 clusters), made once
per size and handed to every system by one lookup embedding: search and put times
exclude the embedding's own cost, which is reported apart (the packaged model's, when
the ``embeddings`` extra is installed).

Systems (each one user's namespace, each op timed alone; the order of the systems is
shuffled every round, and this process's CPU time is recorded beside wall time):

* ``tenx-pgvector``: ``MemoryStore`` on PostgreSQL after ``tenxstore memories
  enable-pgvector`` (HNSW, pre-filtered by user and namespace, iterative scans);
* ``tenx-pg-exact``: the same on a schema without the vector column (exact search in
  numpy over the cached matrix);
* ``tenx-sqlite``: ``MemoryStore`` on a SQLite file (exact, numpy);
* ``tenx-qdrant``: ``MemoryStore`` on a SQLite file with ``QdrantIndex(path=...)``,
  Qdrant's local mode (no server can run here; local mode keeps every point in
  Python and scores them there, so it runs up to ``--qdrant-max``, 10k by default);
* ``lg-postgres``: LangGraph's ``AsyncPostgresStore`` with an HNSW index;
* ``lg-memory``: LangGraph's ``InMemoryStore`` (exact, in process);
* ``floor``: put and get as ONE prepared statement each on a held asyncpg connection,
  the fewest round trips the work needs, doing the API's work: an upsert of a row of
  content, metadata, float32 vector bytes, version and timestamps that returns the
  version and timestamps, and a read of a live row's fields (no history is kept).

Both HNSW indexes are built after their store is loaded, in bulk (tenxstore's by
``tenxstore memories enable-pgvector``, the operator's step for a database that gains
pgvector; LangGraph's by its own index DDL, dropped before the load and run again
after it), with ``maintenance_work_mem`` 2GB; then the database is analyzed, as
autovacuum would have done. LangGraph's filtered search is then planned by those
statistics: its HNSW index or an exact scan of the user's rows (a recall@10 of exactly
1.000 on its row says it scanned; an earlier run at 10k did, at 52 ms a search).

Each round is a put, a get and a search right after that write (a cached matrix is
renewed: "search after a write"); then rounds of searches alone, as an agent's
post-load retrieval reads far more often than it writes ("search"). Search runs with
``mode="vector"`` for tenxstore (the peers have no hybrid), relative
recall@10 is each system's top 10 against the exact top 10 of the user's vectors, and
bytes are what each system's tables take on disk (SQLite: the file).

    python benchmarks/memory.py                      # 1k and 10k; docs/benchmarks-memory.md
    python benchmarks/memory.py --sizes 1000 --ops 30 --out /tmp/m.md   # a quick look

Needs PostgreSQL with pgvector available (``../shared/tools/install-pgvector``; the
benchmark creates a database of its own and drops it), ``pip install -e ".[bench,vectors]"``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import numpy as np
from workload import PG_URL, ROOT, pct

DIMS = 384
CLUSTERS = 64
OTHERS = 9
NAMESPACE = ("memories",)
MODEL = "bench-lookup@1"


class LookupEmbedding:
    """The benchmark's embedding: each text's vector, made beforehand (no model cost)."""

    dims = DIMS
    model_id = MODEL

    def __init__(self) -> None:
        self.vectors: dict[str, list[float]] = {}

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.vectors[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.vectors[text]

    async def aembed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return self.embed_documents(texts)

    async def aembed_query(self, text: str) -> list[float]:
        return self.embed_query(text)


@dataclass
class Corpus:
    """The memories of one size: the measured user's and the others', and queries."""

    size: int
    user: list[tuple[str, str, np.ndarray]]  # key, text, unit vector
    others: list[tuple[str, str, str, np.ndarray]]  # user, key, text, vector
    queries: list[tuple[str, np.ndarray]]
    embedding: LookupEmbedding

    def exact_top(self, query: np.ndarray, k: int = 10) -> list[str]:
        matrix = np.stack([v for _, _, v in self.user])
        best = np.argsort(-(matrix @ query), kind="stable")[:k]
        return [self.user[i][0] for i in best]


def corpus(size: int, queries: int, seed: int = 11) -> Corpus:
    rng = np.random.default_rng(seed + size)
    centers = rng.normal(size=(CLUSTERS, DIMS)).astype(np.float32)

    def vectors(n: int) -> np.ndarray:
        picked = centers[rng.integers(0, CLUSTERS, n)]
        v = picked + 0.45 * rng.normal(size=(n, DIMS)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    embedding = LookupEmbedding()
    user_v, other_v, query_v = vectors(size), vectors(size), vectors(queries)
    user = [(f"m{i}", f"memory {i} of alice", user_v[i]) for i in range(size)]
    others = [
        (f"user-{i % OTHERS}", f"o{i}", f"memory {i} of user-{i % OTHERS}", other_v[i])
        for i in range(size)
    ]
    asked = [(f"query {i}", query_v[i]) for i in range(queries)]
    for text, v in [(t, v) for _, t, v in user] + [(t, v) for *_, t, v in others] + asked:
        embedding.vectors[text] = v.tolist()
    return Corpus(size, user, others, asked, embedding)


@dataclass
class System:
    name: str
    put: Callable[[str, str], Awaitable[Any]]
    get: Callable[[str], Awaitable[Any]]
    search: Callable[[str], Awaitable[list[str]]] | None
    close: Callable[[], Awaitable[Any]]
    size_bytes: Callable[[], Awaitable[int | None]]
    wall: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cpu: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    recall: list[float] = field(default_factory=list)
    bytes: int | None = None


def db_url(base: str, name: str) -> str:
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{name}"))


def asyncpg_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def relation_bytes(url: str, schema: str, tables: Sequence[str]) -> int:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        total = 0
        for table in tables:
            found = await conn.fetchval(
                "SELECT pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
                schema,
                table,
            )
            total += int(found or 0)
        return total
    finally:
        await conn.close()


async def load_tenx(store: Any, data: Corpus) -> None:
    """Every user's memories, by ``astore_many`` (a transaction of 5,000, 500 a round
    trip; vectors looked up in batches of 500), as LangGraph's are by ``abatch``."""
    from tenxstore import NewMemory

    mine: dict[str, list[Any]] = defaultdict(list)
    for key, text, _ in data.user:
        mine["alice"].append(NewMemory(text, key=key, namespace=NAMESPACE))
    for user, key, text, _ in data.others:
        mine[user].append(NewMemory(text, key=key, namespace=NAMESPACE))
    for user, memories in mine.items():
        for start in range(0, len(memories), 5000):
            chunk = memories[start : start + 5000]
            await store.astore_many(user, chunk, batch_size=500, embed_batch_size=500)


def disk_bytes(file: Path, qdrant: Path | None) -> int:
    """A SQLite file's bytes (with its journal), and a Qdrant local directory's."""
    found = sum(p.stat().st_size for p in file.parent.glob(file.name + "*"))
    if qdrant is not None:
        found += sum(p.stat().st_size for p in qdrant.rglob("*") if p.is_file())
    return found


async def tenx_system(
    name: str,
    url: str,
    data: Corpus,
    schema: str | None,
    pgvector: bool,
    file: Path | None = None,
    qdrant: Path | None = None,
) -> System:
    from tenxstore import MemoryStore

    if pgvector:  # loaded first, then the operator's step (a bulk HNSW build)
        first = MemoryStore(url, schema=schema, embedding=data.embedding)
        await first.asetup()
        await load_tenx(first, data)
        await first.aclose()
        command = [str(Path(sys.executable).with_name("tenxstore")), "memories", "enable-pgvector"]
        await asyncio.to_thread(
            subprocess.run, [*command, "--url", url, "--schema", str(schema)], check=True
        )
    index = None
    if qdrant is not None:
        from tenxstore.memory import QdrantIndex

        index = QdrantIndex(path=str(qdrant))
    store = MemoryStore(url, schema=schema, embedding=data.embedding, vector_index=index)
    await store.asetup()
    if not pgvector:
        await load_tenx(store, data)
    tables = ["memories", "memory_versions", "memory_vectors", "memory_revisions"]

    async def put(key: str, text: str) -> Any:
        return await store.astore("alice", text, key=key, namespace=NAMESPACE)

    async def get(key: str) -> Any:
        return await store.aget("alice", key, namespace=NAMESPACE)

    async def search(query: str) -> list[str]:
        hits = await store.asearch("alice", query, namespace=NAMESPACE, limit=10, mode="vector")
        return [h.memory.key for h in hits]

    async def size() -> int | None:
        if file is not None:
            return disk_bytes(file, qdrant)
        assert schema is not None
        return await relation_bytes(url, schema, tables)

    return System(name, put, get, search, store.aclose, size)


async def langgraph_system(
    name: str,
    store: Any,
    data: Corpus,
    close: Callable[[], Awaitable[Any]],
    size: Callable[[], Awaitable[int | None]],
    loaded: Callable[[], Awaitable[None]] | None = None,
) -> System:
    """A LangGraph store loaded with the corpus (each user a namespace of its own);
    ``loaded`` runs after the load."""
    from langgraph.store.base import PutOp

    mine = ("memories", "alice")
    rows = [(mine, k, t) for k, t, _ in data.user]
    rows += [(("memories", u), k, t) for u, k, t, _ in data.others]
    for start in range(0, len(rows), 500):
        await store.abatch([PutOp(ns, k, {"text": t}) for ns, k, t in rows[start : start + 500]])
    if loaded is not None:
        await loaded()

    async def put(key: str, text: str) -> Any:
        return await store.aput(mine, key, {"text": text})

    async def get(key: str) -> Any:
        return await store.aget(mine, key)

    async def search(query: str) -> list[str]:
        return [i.key for i in await store.asearch(mine, query=query, limit=10)]

    return System(name, put, get, search, close, size)


async def lg_postgres(url: str, data: Corpus) -> System:
    from langgraph.store.postgres.aio import AsyncPostgresStore

    index: Any = {
        "dims": DIMS,
        "embed": data.embedding.embed_documents,  # LangGraph takes a function of texts
        "fields": ["text"],
        "ann_index_config": {"kind": "hnsw"},
        "distance_type": "cosine",
    }
    manager = AsyncPostgresStore.from_conn_string(asyncpg_dsn(url), index=index)
    store = await manager.__aenter__()
    await store.setup()
    # its HNSW index made again after the load (its own DDL, read from the catalog), as
    # tenxstore's is by enable-pgvector: one bulk build each, not an insert at a time
    conn = await asyncpg.connect(asyncpg_dsn(url))
    ddl = await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'store_vectors' "
        "AND indexdef LIKE '%USING hnsw%'"
    )
    for found in ddl:
        await conn.execute(f'DROP INDEX "{found["indexname"]}"')

    async def built() -> None:
        for found in ddl:
            await conn.execute(found["indexdef"])
        await conn.close()

    async def close() -> None:
        await manager.__aexit__(None, None, None)

    async def size() -> int:
        return await relation_bytes(url, "public", ["store", "store_vectors"])

    return await langgraph_system("lg-postgres", store, data, close, size, built)


async def lg_memory(data: Corpus) -> System:
    from langgraph.store.memory import InMemoryStore

    embed = data.embedding.embed_documents
    store = InMemoryStore(index={"dims": DIMS, "embed": embed, "fields": ["text"]})

    async def nothing() -> None:
        return None

    return await langgraph_system("lg-memory", store, data, nothing, nothing)


async def floor(url: str, data: Corpus) -> System:
    """A put and a get as ONE prepared statement each on a held asyncpg connection,
    doing the work the API's do: an upsert of the memory's content, metadata and
    vector that makes version 1 or the next one and returns the version and
    timestamps; a read of a live memory's fields by (user, namespace, key)."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    await conn.execute(
        "CREATE TABLE floor (user_id text, namespace text, key text, content text, "
        "metadata jsonb, vec bytea, version bigint, created_at timestamptz, "
        "updated_at timestamptz, expires_at timestamptz, PRIMARY KEY (user_id, namespace, key))"
    )
    write = await conn.prepare(
        "INSERT INTO floor VALUES ($1, $2, $3, $4, $5, $6, 1, now(), now(), NULL) "
        "ON CONFLICT (user_id, namespace, key) DO UPDATE SET content = excluded.content, "
        "metadata = excluded.metadata, vec = excluded.vec, version = floor.version + 1, "
        "updated_at = excluded.updated_at RETURNING version, created_at, updated_at"
    )
    read = await conn.prepare(
        "SELECT content, metadata, version, created_at, updated_at, expires_at FROM floor "
        "WHERE user_id = $1 AND namespace = $2 AND key = $3 "
        "AND (expires_at IS NULL OR expires_at > now())"
    )
    vectors = data.embedding.vectors
    ns = ".".join(NAMESPACE)

    async def put(key: str, text: str) -> Any:
        vec = np.asarray(vectors[text], "<f4").tobytes()
        return await write.fetchrow("alice", ns, key, text, "{}", vec)

    async def get(key: str) -> Any:
        return await read.fetchrow("alice", ns, key)

    async def size() -> None:
        return None

    return System("floor", put, get, None, conn.close, size)


async def timed(system: System, kind: str, work: Awaitable[Any]) -> Any:
    wall, cpu = time.perf_counter(), time.process_time()
    result = await work
    system.wall[kind].append((time.perf_counter() - wall) * 1000)
    system.cpu[kind].append((time.process_time() - cpu) * 1000)
    return result


async def measure(systems: list[System], data: Corpus, ops: int, seed: int) -> None:
    """Rounds of a put, a get and a search after that write (``search+write``: a matrix
    cache must be renewed), then rounds of searches alone (``search``: the read-mostly
    case of an agent's post-load retrieval); each round in a shuffled order."""
    rng = random.Random(seed)
    keys = [k for k, _, _ in data.user]
    texts = {k: t for k, t, _ in data.user}
    searching = [s for s in systems if s.search is not None]
    for op in range(ops):
        order = list(systems)
        rng.shuffle(order)
        key = rng.choice(keys)
        query = data.queries[op % len(data.queries)][0]
        for system in order:
            await timed(system, "put", system.put(key, texts[key]))
            await timed(system, "get", system.get(key))
            if system.search is not None:
                await timed(system, "search+write", system.search(query))
    for op in range(ops):
        rng.shuffle(searching)
        query, vector = data.queries[op % len(data.queries)]
        exact = set(data.exact_top(vector))
        for system in searching:
            assert system.search is not None
            found = await timed(system, "search", system.search(query))
            system.recall.append(len(set(found) & exact) / len(exact))


def embedding_cost() -> str:
    """One query's and a batch's time on the packaged model, when it is installed."""
    try:
        from tenxstore.embeddings import LocalEmbedding
    except Exception as exc:  # the extra is not installed: say so in the report
        return f"(packaged model not measured: {type(exc).__name__})"
    model = LocalEmbedding()
    model.embed_query("warm up")
    started = time.perf_counter()
    for i in range(20):
        model.embed_query(f"what does the user prefer for breakfast {i}")
    one = (time.perf_counter() - started) / 20 * 1000
    texts = [f"the user said they like option {i} best" for i in range(64)]
    started = time.perf_counter()
    model.embed_documents(texts)
    batch = (time.perf_counter() - started) / len(texts) * 1000
    return f"{model.model_id}: {one:.1f} ms a query, {batch:.1f} ms a memory in batches of 64"


async def run_size(
    base_url: str, size: int, ops: int, seed: int, qdrant_max: int = 10_000
) -> list[System]:
    data = corpus(size, max(ops, 50), seed)
    name = f"bench_memory_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(asyncpg_dsn(base_url))
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = db_url(base_url, name)
    systems: list[System] = []
    workdir = Path(tempfile.mkdtemp(prefix="tenx-memory-bench-"))
    try:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        await conn.execute("CREATE SCHEMA tenx_vec; CREATE SCHEMA tenx_exact")
        # both HNSW indexes are built in bulk after their load: room to build in memory
        await conn.execute(f"ALTER DATABASE \"{name}\" SET maintenance_work_mem = '2GB'")
        await conn.close()
        started = time.perf_counter()
        systems.append(await tenx_system("tenx-pgvector", url, data, "tenx_vec", True))
        systems.append(await tenx_system("tenx-pg-exact", url, data, "tenx_exact", False))
        file = workdir / "memories.db"
        systems.append(
            await tenx_system("tenx-sqlite", f"sqlite:///{file}", data, None, False, file)
        )
        if size <= qdrant_max:  # local mode holds and scores every point in Python
            where = workdir / "qdrant.db"
            systems.append(
                await tenx_system(
                    "tenx-qdrant", f"sqlite:///{where}", data, None, False, where, workdir / "q"
                )
            )
        systems.append(await lg_postgres(url, data))
        systems.append(await lg_memory(data))
        systems.append(await floor(url, data))
        print(f"  loaded {size} + {size} memories in {time.perf_counter() - started:.0f} s")
        # the statistics autovacuum would have gathered by now (it is off on this
        # machine): each store's queries are planned as they would be in production
        conn = await asyncpg.connect(asyncpg_dsn(url))
        await conn.execute("ANALYZE")
        await conn.close()
        warm = max(3, ops // 10)
        await measure(systems, data, warm, seed + 1)
        for system in systems:
            system.wall.clear(), system.cpu.clear(), system.recall.clear()
        await measure(systems, data, ops, seed)
        for system in systems:
            system.bytes = await system.size_bytes()
    finally:
        for system in systems:
            await system.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return systems


def report(results: dict[int, list[System]], ops: int, model: str, command: str) -> str:
    lines = [
        "# Long-term memory: tenxstore beside LangGraph's stores",
        "",
        f"Made by `{command}` on {platform.node() or 'this machine'} "
        f"({os.cpu_count()} cores, Python {platform.python_version()}), "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {ops} operations of each kind "
        "per system and size, systems shuffled each round (see the module docstring).",
        "",
        f"Embedding excluded from every figure; the packaged model costs {model}.",
        "",
    ]
    for size, systems in results.items():
        lines += [
            f"## {size:,} memories for the user ({size:,} more for nine others)",
            "",
            "| system | put p50 / p99 ms | get p50 / p99 ms | search p50 / p99 ms "
            "| search after a write p50 / p99 ms | search CPU ms | recall@10 | bytes on disk |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in systems:

            def cell(kind: str, s: System = s) -> str:
                w = s.wall.get(kind)
                return f"{pct(w, 0.5):.2f} / {pct(w, 0.99):.2f}" if w else "—"

            cpu = f"{statistics.median(s.cpu['search']):.2f}" if s.cpu.get("search") else "—"
            recall = f"{statistics.mean(s.recall):.3f}" if s.recall else "—"
            size_b = s.bytes
            lines.append(
                f"| {s.name} | {cell('put')} | {cell('get')} | {cell('search')} "
                f"| {cell('search+write')} | {cpu} "
                f"| {recall} | {'—' if size_b is None else f'{size_b / 1e6:.1f} MB'} |"
            )
        by = {s.name: s for s in systems}
        lg = by["lg-postgres"]
        lines += [""]
        for name in ("tenx-pgvector", "tenx-pg-exact", "tenx-sqlite"):
            mine = by[name]

            def ratio(kind: str, other: System, mine: System = mine) -> str:
                return f"{pct(mine.wall[kind], 0.5) / pct(other.wall[kind], 0.5):.2f}x"

            lines.append(
                f"- {name}: search p50 {ratio('search', lg)} lg-postgres's; put "
                f"{ratio('put', lg)}, get {ratio('get', lg)}; put {ratio('put', by['floor'])} "
                f"and get {ratio('get', by['floor'])} the floor"
            )
        lines.append("")
    lines += ["![search p50 by size](benchmark-memory.png)", ""]
    return "\n".join(lines)


def plot(results: dict[int, list[System]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, kind in zip(axes, ("put", "get", "search"), strict=True):
        names = [s.name for s in next(iter(results.values())) if s.wall.get(kind)]
        for i, size in enumerate(results):
            by = {s.name: s for s in results[size]}
            values = [pct(by[n].wall[kind], 0.5) for n in names]
            ax.bar([j + i * 0.4 for j in range(len(names))], values, width=0.4, label=f"{size:,}")
        ax.set_xticks([j + 0.2 for j in range(len(names))], names, rotation=35, ha="right")
        ax.set_title(f"{kind} p50 (ms)")
        ax.legend(title="memories")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument(
        "--qdrant-max",
        type=int,
        default=10_000,
        help="largest size run with tenx-qdrant (Qdrant's local mode: every point in Python)",
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks-memory.md"))
    args = parser.parse_args()
    results: dict[int, list[System]] = {}
    model = embedding_cost()
    command = ("python benchmarks/memory.py " + " ".join(sys.argv[1:])).strip()
    out = Path(args.out)
    for size in (int(s) for s in args.sizes.split(",")):
        print(f"size {size}")
        results[size] = await run_size(PG_URL, size, args.ops, args.seed, args.qdrant_max)
        text = report(results, args.ops, model, command)  # after each size: a long run
        out.write_text(text)  # noqa: ASYNC240 (between sizes)
        plot(results, out.with_name("benchmark-memory.png"))
        print(text)


if __name__ == "__main__":
    asyncio.run(main())
