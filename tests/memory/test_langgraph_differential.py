"""TenxStore against LangGraph's own InMemoryStore: the same random sequences of puts,
deletes, gets, filtered searches, namespace listings and mixed batches, every answer
compared.

Compared exactly: gets, listings (prefix and suffix with wildcards, max_depth,
limit/offset), batch results, and searches without a query — in the order LangGraph's
database stores list them, the most recently written first (InMemoryStore answers in
its dicts' order: its answer is taken whole and put in that order, then paged).
Scores aside, and a search with a query, which InMemoryStore without an index does not
rank: compared as sets with a limit above the items, and TenxStore's ranked ones (those
holding a word of the query) first.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp
from langgraph.store.memory import InMemoryStore

from tenxstore import MemoryStore
from tenxstore.langgraph import TenxStore

LABELS = ["a", "b", "memories", "%", "_", "a_b", "a%", "\\", "*", "ü", "x y", "'", "alice\n"]
KEYS = ["k", "K", "k%", "_", "*", "日本", "a b", "1", "k_"]
WORDS = ["pizza", "tea", "window", "aisle", "jazz", "rust"]
STEPS = 110


def a_value(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.15:  # the documents' shape: a memory as it is
        return {"content": " ".join(rng.sample(WORDS, 2)), "metadata": {"m": rng.randint(0, 2)}}
    value: dict[str, Any] = {"kind": "v", "n": rng.randint(-3, 3)}  # every filter starts here
    optional = {
        "tag": rng.choice(WORDS),
        "flag": rng.choice([True, False]),
        "obj": {"a": rng.randint(0, 2), "b": rng.choice(["x", "y"])},
        "list": [rng.randint(0, 1) for _ in range(rng.randint(0, 2))],
        "text": rng.choice(["", "nul \x00 inside", "emoji 🎉", "quote \"'", "%_\\"]),
        "big": rng.choice([2**70, -(2**65), 1.5, None]),
    }
    value.update({k: v for k, v in optional.items() if rng.random() < 0.7})
    return value


def a_filter(rng: random.Random) -> dict[str, Any] | None:
    choice = rng.randrange(9)
    if choice == 0:
        return None
    ordered = {"$gt": 0, "$gte": 1, "$lt": 1, "$lte": -1}
    op = rng.choice(list(ordered))
    return [
        {"kind": "v", "n": {op: ordered[op]}},
        {"kind": "v", "n": {"$gt": -2, "$lte": 2}},
        {"tag": rng.choice(WORDS)},
        {"tag": {"$ne": rng.choice(WORDS)}},
        {"flag": rng.choice([True, False])},
        {"obj": {"a": rng.randint(0, 2)}},
        {"list": [0, 1]},
        {"metadata": {"m": rng.randint(0, 2)}},
    ][choice - 1]


def a_namespace(rng: random.Random) -> tuple[str, ...]:
    first = rng.choice([label for label in LABELS])
    return (first, *rng.choices(LABELS, k=rng.randint(0, 2)))


def shown(items: list[Any]) -> list[tuple[Any, ...]]:
    return [(i.namespace, i.key, i.value) for i in items]


def drop_empty(ref: InMemoryStore) -> None:
    """InMemoryStore keeps a namespace in its listings once it was read or emptied (its
    dict of namespaces is a defaultdict); LangGraph's database stores list only the
    namespaces that hold items, as TenxStore does."""
    for ns in [ns for ns, items in ref._data.items() if not items]:
        del ref._data[ns]


class Run:
    """One sequence of ops on both stores, and the order of writes (newest first)."""

    def __init__(self, ours: TenxStore, rng: random.Random) -> None:
        self.ours, self.ref, self.rng = ours, InMemoryStore(), rng
        self.namespaces = [a_namespace(rng) for _ in range(8)]
        self.written: dict[tuple[tuple[str, ...], str], int] = {}
        self.clock = 0
        self.compared = 0

    def wrote(self, ns: tuple[str, ...], key: str, value: Any) -> None:
        self.clock += 1
        if value is None:
            self.written.pop((ns, key), None)
        else:
            self.written[(ns, key)] = self.clock

    async def both(self, ops: list[Any]) -> tuple[list[Any], list[Any]]:
        if self.rng.random() < 0.2:  # the sync face, from a worker thread
            ours = await asyncio.to_thread(self.ours.batch, ops)
        else:
            ours = await self.ours.abatch(ops)
        theirs = await self.ref.abatch(ops)
        drop_empty(self.ref)
        return ours, theirs

    async def step(self) -> None:
        rng = self.rng
        ns, key = rng.choice(self.namespaces), rng.choice(KEYS)
        kind = rng.random()
        if kind < 0.35:
            value = a_value(rng)
            await self.ours.aput(ns, key, value)
            await self.ref.aput(ns, key, value)
            self.wrote(ns, key, value)
        elif kind < 0.45:
            await self.ours.adelete(ns, key)
            await self.ref.adelete(ns, key)
            drop_empty(self.ref)
            self.wrote(ns, key, None)
        elif kind < 0.55:
            ours, theirs = await self.both([GetOp(ns, key)])
            assert shown([i for i in ours if i]) == shown([i for i in theirs if i])
        elif kind < 0.75:
            await self.search(ns[: rng.randint(0, len(ns))])
        elif kind < 0.9:
            await self.list_namespaces()
        else:
            await self.batch(ns, key)
        self.compared += 1

    async def search(self, prefix: tuple[str, ...]) -> None:
        rng = self.rng
        keep = a_filter(rng)
        everything = await self.ref.asearch(prefix, filter=keep, limit=10**6)
        everything.sort(key=lambda i: -self.written[(i.namespace, i.key)])
        if rng.random() < 0.3:  # ranked by keywords: the same items, the matches first
            query = " ".join(rng.sample(WORDS, rng.randint(1, 2)))
            ours = await self.ours.asearch(prefix, query=query, filter=keep, limit=10**4)
            key = sorted(shown(everything), key=repr)
            assert sorted(shown(ours), key=repr) == key
            holds = [any(w in json.dumps(i.value) for w in query.split()) for i in ours]
            assert holds == sorted(holds, reverse=True), "the matches come first"
            assert [i.score is not None for i in ours] == holds
            assert all(0 <= i.score <= 1 for i in ours if i.score is not None)
            return
        limit, offset = rng.choice([1, 2, 3, 10, 100]), rng.choice([0, 0, 1, 2, 5])
        ours = await self.ours.asearch(prefix, filter=keep, limit=limit, offset=offset)
        assert shown(ours) == shown(everything[offset : offset + limit]), (prefix, keep)
        assert all(i.score is None for i in ours)

    def a_condition_path(self) -> tuple[str, ...]:
        rng = self.rng
        ns = rng.choice(self.namespaces)
        cut = rng.randint(1, len(ns))
        path = list(ns[:cut] if rng.random() < 0.5 else ns[-cut:])
        if rng.random() < 0.4:
            path[rng.randrange(len(path))] = "*"
        if rng.random() < 0.15:
            path[-1] = rng.choice(LABELS)
        return tuple(path)

    async def list_namespaces(self) -> None:
        rng = self.rng
        conditions = []
        if rng.random() < 0.6:
            conditions.append(MatchCondition("prefix", self.a_condition_path()))
        if rng.random() < 0.4:
            conditions.append(MatchCondition("suffix", self.a_condition_path()))
        op = ListNamespacesOp(
            match_conditions=tuple(conditions),
            max_depth=rng.choice([None, None, 1, 2]),
            limit=rng.choice([1, 3, 100]),
            offset=rng.choice([0, 0, 1, 4]),
        )
        ours, theirs = await self.both([op])
        assert ours == theirs, op

    async def batch(self, ns: tuple[str, ...], key: str) -> None:
        """Reads see the items as they were before the batch; the last write of an
        item wins."""
        rng = self.rng
        other = (rng.choice(self.namespaces), rng.choice(KEYS))
        first, second = a_value(rng), rng.choice([None, a_value(rng)])
        ops: list[Any] = [
            ListNamespacesOp(limit=1000),  # first: InMemoryStore's gets add empty namespaces
            PutOp(ns, key, first),
            GetOp(ns, key),
            PutOp(*other, a_value(rng)),
            PutOp(ns, key, second),
            GetOp(*other),
        ]
        ours, theirs = await self.both(ops)
        assert ours[0] == theirs[0]
        assert ours[1] is None and theirs[1] is None
        for i in (2, 5):
            assert shown([ours[i]] if ours[i] else []) == shown([theirs[i]] if theirs[i] else [])
        written = {(ns, key): second}
        if other != (ns, key):
            written = {(ns, key): second, other: ops[3].value}
        for (where, name), value in written.items():
            self.wrote(where, name, value)


async def test_tenxstore_answers_as_langgraphs_inmemorystore(lg_memories: MemoryStore) -> None:
    store = TenxStore(lg_memories)
    for seed in (7, 2024):
        run = Run(store.for_user(f"user-{seed}"), random.Random(seed))
        for _ in range(STEPS):
            await run.step()
        assert run.compared == STEPS
        # what is left is the same, item for item
        left = await run.ref.asearch((), limit=10**6)
        ours = await run.ours.asearch((), limit=10**6)
        assert sorted(shown(ours), key=repr) == sorted(shown(left), key=repr)
    # two sequences, two users: neither sees the other's items
    assert await store.for_user("user-7").alist_namespaces(prefix=("nobody",)) == []
