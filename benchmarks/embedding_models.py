"""Measure one local embedding model (``tenxstore.embeddings.local``) and print its row
of the table in docs/embedding-models.md.

Run it in a virtual environment that holds the model's package, tenxstore and nothing
else of note (docs/embedding-models.md has the commands)::

    python benchmarks/embedding_models.py multilingual-e5-small-q4
    python benchmarks/embedding_models.py all-MiniLM-L6-v2 --threads 2

What it measures:

- install size: the files of the model's package and of every package it requires,
  transitively (from their RECORDs), plus numpy (the extra's and the store's); the
  docs also give ``du`` of the whole site-packages, taken before tenxstore went in;
- cold start: a new process that imports tenxstore's ``LocalEmbedding`` and embeds one
  query, wall time as its parent sees it (the median of ``--cold-runs``, after one run
  to warm the disk cache); in brackets, the model's part of it: constructing the
  ``LocalEmbedding`` and its first vector, past the imports, as the process measures it;
- throughput: 256 short texts (the set's memories) embedded as documents in one call,
  texts per second of wall time, and per CPU second of this process's threads (a
  machine shared with other work slows the first, hardly the second; the best of
  three, after a warm-up); and one query's latency (the median of 21 of the set's);
- quality: recall@1, recall@5 and MRR of pure vector search (exact cosine in numpy)
  on benchmarks/memory_set, overall and on the paraphrases.

``--threads`` caps the model's threads (``LocalEmbedding(threads=...)``, and
OMP_NUM_THREADS and friends for the other libraries; the machine this ran on has two
cores).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS")
# A new process: import, construct, embed one query; it prints how long the last two
# took (the model's own load and first vector).
COLD = (
    "from tenxstore.embeddings.local import LocalEmbedding\n"
    "import time\n"
    "started = time.perf_counter()\n"
    "LocalEmbedding({model!r}, threads={threads}).embed_query('what does the user like?')\n"
    "print(time.perf_counter() - started)\n"
)


def _name(requirement: str) -> str | None:
    """The distribution a requirement names, or None when it only applies with an extra
    or on another platform."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - pip's own copy is no public API
        match = re.match(r"[A-Za-z0-9._-]+", requirement)
        return None if "extra ==" in requirement or not match else match.group(0)
    req = Requirement(requirement)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return None
    return req.name


def install_size(package: str, *also: str) -> tuple[int, list[str]]:
    """Bytes of ``package``, of ``also`` and of everything they require (transitively),
    and the distributions counted."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [package, *also]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional requirement left out
        seen[key] = dist
        todo.extend(n for n in map(_name, dist.requires or []) if n)
    total = 0
    for dist in seen.values():
        for file in dist.files or []:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                total += path.stat().st_size
    names = sorted(f"{d.metadata['Name']}=={d.version}" for d in seen.values())
    return total, names


def cold_start(model: str, threads: int, runs: int) -> tuple[float, float]:
    """Seconds from a new process's start to its first query vector, and of those the
    model's load and first vector (medians)."""
    total, model_part = [], []
    for i in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", COLD.format(model=model, threads=threads)],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        if i:  # the first one warms the disk cache
            total.append(time.perf_counter() - started)
            model_part.append(float(done.stdout.split()[-1]))
    return statistics.median(total), statistics.median(model_part)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()
    for var in THREAD_VARS:
        os.environ[var] = str(args.threads)
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import memory_quality

    from tenxstore.embeddings.local import MODELS, LocalEmbedding

    spec = MODELS[args.model]
    size, dists = install_size(spec.package, "numpy")
    cold, load = cold_start(args.model, args.threads, args.cold_runs)

    embedding = LocalEmbedding(args.model, batch_size=args.texts, threads=args.threads)
    data = memory_quality.load()
    texts = [m.content for m in data.memories][: args.texts]
    embedding.embed_documents(texts[:16])  # loaded and warm
    timings = [_timed(embedding, texts) for _ in range(3)]
    rate = len(texts) / min(wall for wall, _ in timings)
    cpu_rate = len(texts) / min(cpu for _, cpu in timings)
    queries = [q.query for q in data.queries[:21]]
    query_ms = statistics.median(_query_time(embedding, q) for q in queries) * 1000

    row = [
        args.model,
        embedding.model_id,
        str(embedding.dims),
        f"{size / 1e6:,.0f} MB",
        f"{cold:.2f} s ({load:.2f} s)",
        f"{rate:,.0f}/s",
        f"{cpu_rate:,.0f}/s",
        f"{query_ms:.0f} ms",
    ]
    if not args.skip_quality:
        embedding.batch_size = 64
        results = asyncio.run(
            memory_quality.score(data, memory_quality.exact_ranker(data, embedding))
        )
        r, p = results["all"].row(), results["paraphrase"].row()
        row += [f"{r['recall@1']:.3f}", f"{r['recall@5']:.3f}", f"{r['mrr']:.3f}"]
        row += [f"{p['recall@5']:.3f}"]
        print(memory_quality.table(results, f"exact cosine, {embedding.model_id}"))
        print()
    print("counted:", " ".join(dists))
    print(
        "| model | model_id | dims | install | cold start (model's part) | docs/s "
        "| docs/CPU-s | query | recall@1 | recall@5 | MRR | paraphrase recall@5 |"
    )
    print("| " + " | ".join(row) + " |")


def _query_time(embedding: object, query: str) -> float:
    started = time.perf_counter()
    embedding.embed_query(query)  # type: ignore[attr-defined]
    return time.perf_counter() - started


def _timed(embedding: object, texts: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (every thread of this process) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    embedding.embed_documents(texts)  # type: ignore[attr-defined]
    return time.perf_counter() - wall, time.process_time() - cpu


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
