"""Hostile review of the Qdrant vector index (``QdrantIndex``): real local-mode Qdrant
under tmp_path, real databases. Races are made deterministic by a ``Gated`` index
that only *pauses* the index's own calls (no call is faked): what is proved is an
interleaving any two coroutines or processes may take.

Failing tests here are findings for the lead (see the review report); passing ones
are suspicions checked that held.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from qdrant_client import AsyncQdrantClient

from tenxstore import AuthPolicy, ConfigError, MemoryStore
from tenxstore.memory import QdrantIndex
from tenxstore.memory.qdrant import Point
from tests.conftest import Backend, backend_for
from tests.memory.conftest import Clock
from tests.memory.embeddings import HashingEmbedding, SmallHashing

LOGGER = "tenxstore.memory.qdrant"


class Gated(QdrantIndex):
    """A real QdrantIndex whose calls can be held, per asyncio task name and method,
    until a test releases them (``hold``); ``arrived``/``done`` tell where tasks are."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gates: dict[tuple[str, str], asyncio.Event] = {}
        self.arrived: dict[tuple[str, str], asyncio.Event] = defaultdict(asyncio.Event)
        self.done: dict[tuple[str, str], asyncio.Event] = defaultdict(asyncio.Event)

    def hold(self, task: str, what: str) -> asyncio.Event:
        self.gates[(task, what)] = gate = asyncio.Event()
        return gate

    async def _through(self, what: str, work: Any) -> Any:
        task = asyncio.current_task()
        name = task.get_name() if task else ""
        self.arrived[(name, what)].set()
        gate = self.gates.get((name, what))
        if gate is not None:
            await gate.wait()
        try:
            return await work()
        finally:
            self.done[(name, what)].set()

    async def upsert(self, points: Sequence[Point]) -> None:
        await self._through("upsert", lambda: super(Gated, self).upsert(points))

    async def marker(self, user: str, namespace: str) -> int | None:
        return await self._through("marker", lambda: super(Gated, self).marker(user, namespace))

    async def set_marker(self, user: str, namespace: str, revision: int | None) -> None:
        await self._through(
            "set_marker", lambda: super(Gated, self).set_marker(user, namespace, revision)
        )

    async def points(self, user: Any, namespace: str | None) -> dict[str, tuple[str, Any]]:
        return await self._through("points", lambda: super(Gated, self).points(user, namespace))


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with backend_for(request.param, tmp_path) as b:
        yield b


async def _store(db: Backend, index: QdrantIndex | None, **options: Any) -> MemoryStore:
    embedding = options.pop("embedding", None) or HashingEmbedding()
    store = MemoryStore(await db.make(**options), embedding=embedding, vector_index=index)
    await store.asetup()
    return store


def _keys(hits: Any) -> list[str]:
    return [h.memory.key for h in hits]


def _tie_free(hits: Any) -> tuple[int, list[tuple[float, str]]]:
    """The hits as (score, key), ties in any order, those tied with the last left out
    (which of equal scores a limit cuts is arbitrary in both indexes)."""
    scored = sorted((-round(h.score, 4), h.memory.key) for h in hits)
    last = scored[-1][0] if scored else None
    return len(scored), [x for x in scored if x[0] != last]


async def _drift(store: MemoryStore) -> list[str]:
    """Every live memory with a vector whose Qdrant point is missing or not its row
    (rev or expiry), and every point of no live memory: what Qdrant holds wrong."""
    from tenxstore.memory import indexing

    index = store.vector_index
    assert index is not None and index.model_id is not None
    rows = await indexing._rows(store, index, store.rows.live(store.base.now()))
    want = {}
    for r in rows:
        if r.vector is not None:
            p = indexing._point(index, r)
            want[indexing.point_id(p.user, p.namespace, p.key)] = (p.rev, p.expires_at, p.key)
    have = await index.points(None, None)
    out = []
    for ident, (rev, expires, key) in want.items():
        if ident not in have:
            out.append(f"missing {key}")
        elif have[ident] != (rev, expires):
            out.append(f"stale {key}: {have[ident]} != {(rev, expires)}")
    out += [f"orphan {i}" for i in have if i not in want]
    return out


# -- 1. point ids: the \x1f separator is not an injective encoding ----------------------


async def test_point_id_collision_loses_a_memory_from_search(db: Backend, tmp_path: Path) -> None:
    """user/namespace/key may contain U+001F (validation allows it); point_id joins
    them with U+001F, so ("n", "x\\x1fy") and ("n\\x1fx", "y") are ONE point. The second
    write overwrites the first's point while the first scope's marker still says "in
    sync": the first memory is never found through Qdrant again (the database's own
    index finds it)."""
    store = await _store(db, QdrantIndex(path=str(tmp_path / "q"), retry_after=0))
    plain = await _store(db, None)
    try:
        await store.astore("alice", "Alice is a vegetarian", namespace=("n",), key="x\x1fy")
        await store.astore("alice", "espresso", namespace=("n\x1fx",), key="y")
        # across users too: a user id holding U+001F takes another user's point
        await store.astore("bob", "Bob likes trams", namespace=("memories",), key="a\x1fb")
        await store.astore("bob\x1fmemories", "unrelated words", namespace=("a",), key="b")
        expected = _keys(
            await plain.asearch("alice", "vegetarian", namespace=("n",), mode="vector")
        )
        assert expected == ["x\x1fy"]
        got = await store.asearch("alice", "vegetarian", namespace=("n",), mode="vector")
        got = await store.asearch("alice", "vegetarian", namespace=("n",), mode="vector")
        bobs = await store.asearch("bob", "trams", mode="vector")
        assert (_keys(got), _keys(bobs)) == (expected, ["a\x1fb"])
    finally:
        await store.aclose()
        await plain.aclose()


# -- 2. the marker's compare-and-set does not prove the points are the write's ----------


async def test_two_writers_of_one_key_leave_a_live_memory_unfindable(
    db: Backend, tmp_path: Path, clock: Clock
) -> None:
    """Writer A (v2, ttl=60) has committed and is copying its point, B (v3, no ttl)
    writes the same memory. Were A's older point to land over B's and the marker to
    end at the database's revision, the live memory would be filtered out IN Qdrant
    after the TTL: never a candidate, never repaired. A copies under the scope's
    revision lock, so B commits after A's copy, and its own copy is the last."""
    index = Gated(path=str(tmp_path / "q"), retry_after=0)
    store = await _store(db, index)
    plain = await _store(db, None)
    try:
        await store.astore("alice", "Alice is a vegetarian", key="diet")
        a_gate = index.hold("A", "upsert")
        a = asyncio.create_task(
            store.astore("alice", "Alice is a vegetarian", key="diet", ttl=60), name="A"
        )
        await index.arrived[("A", "upsert")].wait()  # A committed v2, copying it
        b = asyncio.create_task(
            store.astore("alice", "Alice is a vegetarian", key="diet"), name="B"
        )
        a_gate.set()
        await a
        await b
        clock.advance(120)
        assert _keys(await plain.asearch("alice", "vegetarian", mode="vector")) == ["diet"]
        await store.asearch("alice", "vegetarian", mode="vector")  # one search to repair
        assert await _drift(store) == []
        assert _keys(await store.asearch("alice", "vegetarian", mode="vector")) == ["diet"]
    finally:
        await store.aclose()
        await plain.aclose()


async def test_reindex_during_a_write_loses_the_written_point(db: Backend, tmp_path: Path) -> None:
    """areindex ("safe while the application runs") while a write of the same scope
    commits: were the reindex to delete the write's new point and the write then to
    move the marker, the new memory would have no point and the marker say in sync.
    The reindex brings each scope up under its revision lock, so the write commits
    and copies itself after it."""
    index = Gated(path=str(tmp_path / "q"), retry_after=0)
    store = await _store(db, index)
    plain = await _store(db, None)
    try:
        await store.astore("alice", "Alice drinks espresso", key="coffee")
        r_gate = index.hold("R", "points")
        r = asyncio.create_task(store.areindex(), name="R")
        await index.arrived[("R", "points")].wait()  # the scope's lock held
        w = asyncio.create_task(
            store.astore("alice", "Alice is a vegetarian", key="diet"), name="W"
        )
        r_gate.set()
        await r
        await w
        assert _keys(await plain.asearch("alice", "vegetarian", mode="vector", limit=1)) == ["diet"]
        await store.asearch("alice", "vegetarian", mode="vector")  # one search to repair
        assert await _drift(store) == []
        assert _keys(await store.asearch("alice", "vegetarian", mode="vector", limit=1)) == ["diet"]
    finally:
        await store.aclose()
        await plain.aclose()


async def test_concurrent_writers_then_one_search_leave_nothing_stale(
    db: Backend, tmp_path: Path
) -> None:
    """asyncio.gather of many astore/aupdate/adelete on one key and on many keys,
    ungated: after one search of the scope Qdrant holds exactly the database."""
    store = await _store(db, QdrantIndex(path=str(tmp_path / "q"), retry_after=0))
    try:
        await store.astore("alice", "seed", key="hot")
        jobs: list[Any] = []
        for n in range(12):
            jobs.append(store.astore("alice", f"hot topic number {n}", key="hot", ttl=600 + n))
            jobs.append(store.astore("alice", f"cold topic {n}", key=f"k{n}"))
            jobs.append(store.aupdate("alice", "hot", metadata={"n": n}))
            jobs.append(store.astore("bob", f"bob topic {n}", key="hot"))
        jobs += [store.adelete("alice", f"k{n}") for n in range(0, 12, 3)]
        done = await asyncio.gather(*jobs, return_exceptions=True)
        errors = [d for d in done if isinstance(d, BaseException)]
        assert all(type(e).__name__ == "StaleStateError" for e in errors) or not errors, errors
        await store.asearch("alice", "topic", mode="vector")
        await store.asearch("bob", "topic", mode="vector")
        assert await _drift(store) == []
    finally:
        await store.aclose()


# -- 3. cancellation after the commit -----------------------------------------------------


async def test_cancelled_after_commit_is_durable_and_repaired(db: Backend, tmp_path: Path) -> None:
    """Cancelled while its point is being written (after the commit): the memory is in
    the database, and the next search repairs Qdrant (the marker never moved)."""
    index = Gated(path=str(tmp_path / "q"), retry_after=0)
    store = await _store(db, index)
    try:
        index.hold("C", "upsert")  # never released
        c = asyncio.create_task(
            store.astore("alice", "Alice is a vegetarian", key="diet"), name="C"
        )
        await index.arrived[("C", "upsert")].wait()
        c.cancel()
        with pytest.raises(asyncio.CancelledError):
            await c
        assert (await store.aget("alice", "diet")) is not None
        assert _keys(await store.asearch("alice", "vegetarian", mode="vector")) == ["diet"]
        assert await _drift(store) == []
    finally:
        await store.aclose()


# -- 4. a collection of another model at run time ---------------------------------------


@pytest.mark.filterwarnings("ignore:Payload indexes:UserWarning")
async def test_another_models_reindex_turns_qdrant_trouble_into_errors(
    db: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`tenxstore memories reindex` defaults to --embedding LocalEmbedding and
    areindex recreates a collection of another model without asking. An operator who
    forgets --embedding wipes the application's collection; the running application
    then gets ConfigError from astore (AFTER its commit: a caller retrying stores
    twice) and from asearch — not the promised fallback to the database's index."""
    caplog.set_level(logging.WARNING, LOGGER)
    path = str(tmp_path / "q")
    client = AsyncQdrantClient(path=path)
    app = await _store(db, QdrantIndex(client=client, retry_after=0))
    try:
        await app.astore("alice", "Alice is a vegetarian", key="diet")
        ops = MemoryStore(
            app.repository, embedding=SmallHashing(), vector_index=QdrantIndex(client=client)
        )
        with pytest.raises(ConfigError):
            await ops.areindex()  # another model's collection: never remade unasked
        await ops.areindex(recreate=True)  # the collection remade for 32 dims, emptied
        failures = []
        for name, call in (
            ("astore 1", lambda: app.astore("alice", "Alice drinks espresso", key="coffee")),
            ("asearch 1", lambda: app.asearch("alice", "vegetarian", mode="vector")),
            ("astore 2", lambda: app.astore("alice", "Alice likes trams", key="trams")),
            ("asearch 2", lambda: app.asearch("alice", "vegetarian", mode="vector")),
        ):
            try:
                await call()
            except ConfigError:
                failures.append(name)
        # committed all the same, though astore 2 raised
        assert await app.aget("alice", "trams") is not None
        assert failures == []
    finally:
        await app.aclose()
        await client.close()


# -- 5. two stores, one collection ---------------------------------------------------------


async def test_one_index_shared_by_stores_of_two_databases_is_refused(tmp_path: Path) -> None:
    """One QdrantIndex instance (or one client) given to the stores of two databases:
    the collection's store id is checked only in ensure(), which the second store
    skips once the instance is ready — both write the same point ids and markers."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    async with (
        backend_for("sqlite", tmp_path / "one") as one,
        backend_for("sqlite", tmp_path / "two") as two,
    ):
        index = QdrantIndex(path=str(tmp_path / "q"), retry_after=0)
        first = await _store(one, index)
        await first.astore("alice", "Alice is a vegetarian", key="diet")
        second = MemoryStore(await two.make(), embedding=HashingEmbedding(), vector_index=index)
        try:
            with pytest.raises(ConfigError, match="another database"):
                await second.asetup()
                await second.astore("alice", "Alice drinks espresso", key="diet")
        finally:
            await first.aclose()
            await second.aclose()


@pytest.mark.filterwarnings("ignore:Payload indexes:UserWarning")
async def test_two_clients_of_two_databases_on_one_collection_are_refused(
    db: Backend, tmp_path: Path
) -> None:
    client = AsyncQdrantClient(path=str(tmp_path / "q"))
    first = await _store(db, QdrantIndex(client=client))
    (tmp_path / "other").mkdir()
    async with backend_for("sqlite", tmp_path / "other") as other:
        second = MemoryStore(
            await other.make(),
            embedding=HashingEmbedding(),
            vector_index=QdrantIndex(client=client),
        )
        try:
            with pytest.raises(ConfigError, match="another database"):
                await second.asetup()
        finally:
            await first.aclose()
            await second.aclose()
    await client.close()


# -- 6. what held -----------------------------------------------------------------------------


async def test_int_users_same_key_namespace_prefixes_and_isolation_lifted(
    db: Backend, tmp_path: Path, clock: Clock
) -> None:
    (tmp_path / "int").mkdir()
    async with backend_for(db.name, tmp_path / "int", fresh=True) as ints:
        await _int_users(ints, tmp_path, clock)


async def _int_users(db: Backend, tmp_path: Path, clock: Clock) -> None:
    index = QdrantIndex(path=str(tmp_path / "q"), retry_after=0)
    store = await _store(db, index, user_id_type="int")
    plain = MemoryStore(store.repository, embedding=HashingEmbedding())
    try:
        for user in (1, 2, 11):
            await store.astore(user, f"vegetarian {user}", key="diet", namespace=("a", "b"))
            await store.astore(user, f"vegetarian bc {user}", key="diet", namespace=("a", "bc"))
        await store.astore(1, "vegetarian soon gone", key="t", namespace=("a", "b"), ttl=5)
        for user in (1, 2, 11):
            for ns in (("a", "b"), ("a", "bc"), ("a",), ()):
                got = await store.asearch(user, "vegetarian", namespace=ns, mode="vector", limit=10)
                want = await plain.asearch(
                    user, "vegetarian", namespace=ns, mode="vector", limit=10
                )
                assert [(h.memory.user_id, h.memory.namespace, h.memory.key) for h in got] == [
                    (h.memory.user_id, h.memory.namespace, h.memory.key) for h in want
                ]
                assert {h.memory.user_id for h in got} == {user}
        clock.advance(10)
        assert "t" not in _keys(
            await store.asearch(1, "vegetarian soon gone", mode="vector", namespace=("a",))
        )
        lifted = AuthPolicy(enforce_user_isolation=False)
        every = await store.asearch(
            None, "vegetarian", namespace=("a", "b"), mode="vector", limit=10, auth_policy=lifted
        )
        assert {h.memory.user_id for h in every} == {1, 2, 11}
        assert await store.adelete(2, "diet", namespace=("a", "b"))
        await store.astore(2, "espresso now", key="diet", namespace=("a", "b"))
        again = await store.asearch(2, "espresso", namespace=("a", "b"), mode="vector")
        assert [(h.memory.content, h.memory.version) for h in again] == [("espresso now", 1)]
        await store.repository.adelete_user(11) if hasattr(
            store.repository, "adelete_user"
        ) else None
        assert await store.asearch(11, "vegetarian", mode="vector", namespace=()) == []
    finally:
        await store.aclose()


async def test_filter_threshold_and_hybrid_match_the_databases_index(
    db: Backend, tmp_path: Path
) -> None:
    store = await _store(db, QdrantIndex(path=str(tmp_path / "q"), retry_after=0))
    plain = MemoryStore(store.repository, embedding=HashingEmbedding())
    words = ["vegetarian", "espresso", "Lisbon", "trams", "ünïcode ☕", "😀 emoji", "cats"]
    try:
        for n in range(60):
            spelled = "".join(chr(ord("a") + int(d)) for d in str(n))  # unique trigrams
            text = " ".join(words[(n * k) % len(words)] for k in (1, 2, 3)) + f" q{spelled}z"
            ns = ("memories", "ñ☕", str(n % 3)) if n % 2 else ("memories",)
            await store.astore(
                "alice",
                text,
                key=f"k{n}",
                namespace=ns,
                metadata={"n": n, "odd": n % 2 == 1, "tag": words[n % 7]},
            )
            await store.astore("bob", text, key=f"k{n}", namespace=ns, metadata={"n": n})
        await store.astore("alice", "x" * 60_000 + " espresso", key="huge")
        cases = [
            dict(mode="vector"),
            dict(mode="hybrid"),
            dict(mode="vector", filter={"odd": True}),
            dict(mode="hybrid", filter={"n": {"$gte": 30}}),
            dict(mode="vector", score_threshold=0.75),
            dict(mode="hybrid", score_threshold=0.6, filter={"tag": {"$in": ["cats", "trams"]}}),
            dict(mode="vector", namespace=("memories", "ñ☕")),
            dict(mode="hybrid", namespace=("memories", "ñ☕", "1"), limit=3),
        ]
        for query in ("espresso in Lisbon", "cats", "😀", "ünïcode"):
            for case in cases:
                opts = {"limit": 10, **case}
                got = await store.asearch("alice", query, **opts)
                want = await plain.asearch("alice", query, **opts)
                assert _tie_free(got) == _tie_free(want), (query, case)
    finally:
        await store.aclose()


async def test_sealed_store_sends_no_content_or_metadata_to_qdrant(tmp_path: Path) -> None:
    async with backend_for("sqlite+encrypted", tmp_path) as db:
        store = await _store(db, QdrantIndex(path=str(tmp_path / "q")))
        try:
            await store.astore(
                "alice", "the launch code is 0000", key="k", metadata={"secret": "hunter2"}
            )
            index = store.vector_index
            assert index is not None
            found, _ = await index.client.scroll(index.collection, with_payload=True)
            payload = found[0].payload or {}
            assert set(payload) == {
                "user",
                "namespace",
                "ns_path",
                "key",
                "memory_id",
                "expires_at",
                "rev",
            }
            assert "0000" not in repr(payload) and "hunter2" not in repr(payload)
        finally:
            await store.aclose()


@pytest.mark.filterwarnings("ignore:Payload indexes:UserWarning")
async def test_aclose_twice_and_a_callers_client_stays_open(db: Backend, tmp_path: Path) -> None:
    client = AsyncQdrantClient(path=str(tmp_path / "q"))
    store = await _store(db, QdrantIndex(client=client))
    await store.astore("alice", "Alice is a vegetarian", key="diet")
    await store.aclose()
    await store.aclose()
    assert await client.collection_exists("tenxstore_memories")
    await client.close()
    own = await _store(db, QdrantIndex(path=str(tmp_path / "own")))
    await own.aclose()
    await own.aclose()
