"""Search by meaning on every database: vectors written with their memory (or not at
all), one model at a time, hybrid ranking that keeps keyword-only hits, isolation,
and a cached matrix that no write in any process leaves stale."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from tenxstore import ConfigError, EmbeddingError, MemoryStore
from tenxstore.memory.vectors import CACHE
from tests.conftest import Backend
from tests.memory.conftest import Clock
from tests.memory.embeddings import HashingEmbedding

ROOT = Path(__file__).resolve().parents[2]
FACTS = [
    ("diet", "Alice is a vegetarian and never eats meat"),
    ("coffee", "Alice drinks a double espresso every morning"),
    ("code", "The staging deploy code is QX-7731"),
    ("pet", "Alice has a golden retriever called Biscuit"),
    ("city", "Alice moved to Lisbon in the spring"),
    ("lang", "Alice is learning Portuguese on weekends"),
]


@pytest.fixture
async def vstore(store_backend: Backend) -> AsyncIterator[MemoryStore]:
    store = MemoryStore(await store_backend.make(), embedding=HashingEmbedding())
    yield store
    await store.aclose()


async def _fill(store: MemoryStore, user: str = "alice") -> None:
    for key, text in FACTS:
        await store.astore(user, text, key=key)


async def _vectors(store: MemoryStore) -> int:
    vt = store.rows.vt
    return int((await store.base.read(select(func.count()).select_from(vt)))[0][0])


class Broken:
    """An embedding that fails in one of the ways a real one can."""

    def __init__(self, how: str, dims: int = 256) -> None:
        self.how, self.dims, self.model_id = how, dims, "test-hashing-trigrams"
        self.good = HashingEmbedding(dims)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors = self.good.embed_documents(texts)
        if self.how == "raises":
            raise RuntimeError("the model server is down")
        if self.how == "dims":
            return [v[:-1] for v in vectors]
        if self.how == "nan":
            vectors[0][3] = math.nan
        if self.how == "count":
            return vectors + vectors
        if self.how == "text":
            return [["a"] * self.dims for _ in texts]  # type: ignore[list-item]
        return vectors

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_documents(texts)

    async def aembed_query(self, text: str) -> list[float]:
        return self.embed_query(text)


@pytest.mark.parametrize("how", ["raises", "dims", "nan", "count", "text"])
async def test_a_bad_embedding_writes_nothing(store_backend: Backend, how: str) -> None:
    store = MemoryStore(await store_backend.make(), embedding=HashingEmbedding())
    await store.astore("alice", "Alice likes green tea", key="tea")
    bad = store.with_embedding(Broken(how))
    with pytest.raises(EmbeddingError) as raised:
        await bad.astore("alice", "Alice likes black tea", key="tea")
    assert raised.value.model_id == "test-hashing-trigrams"
    with pytest.raises(EmbeddingError):
        await bad.astore("alice", "a new one", key="other")
    with pytest.raises(EmbeddingError):
        await bad.aupdate("alice", "tea", content="Alice likes oolong")
    found = await store.aget("alice", "tea")
    assert found is not None and found.content == "Alice likes green tea" and found.version == 1
    assert await store.aget("alice", "other") is None
    assert await _vectors(store) == 1
    if how != "count":  # a query is one text: the embedding's first vector
        with pytest.raises(EmbeddingError):
            await bad.asearch("alice", "tea")
    await store.aclose()


async def test_another_model_or_dims_is_refused(store_backend: Backend) -> None:
    cp = await store_backend.make()
    store = MemoryStore(cp, embedding=HashingEmbedding())
    await _fill(store)
    for other in (HashingEmbedding(model_id="another-model"), HashingEmbedding(dims=128)):
        mixed = MemoryStore(cp, embedding=other)
        with pytest.raises(ConfigError, match="reembed"):
            await mixed.asearch("alice", "coffee")
        with pytest.raises(ConfigError, match="reembed"):
            await mixed.astore("alice", "more", key="more")
        with pytest.raises(ConfigError, match="reembed"):
            await mixed.asetup()
    assert await store.aget("alice", "more") is None
    assert (await store.asearch("alice", "espresso", mode="vector"))[0].memory.key == "coffee"


async def test_reembed_resumes_where_it_stopped(store_backend: Backend) -> None:
    cp = await store_backend.make()
    store = MemoryStore(cp, embedding=HashingEmbedding())
    for n in range(23):
        await store.astore("alice" if n % 2 else "bob", f"fact number {n} about tea", key=f"k{n}")
    await store.astore("alice", "Alice drinks a double espresso", key="coffee")
    new = HashingEmbedding(dims=64, model_id="new-model")

    class Interrupted(HashingEmbedding):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            if self.calls == 2:
                raise ConnectionError("stopped")  # the third batch fails
            return super().embed_documents(texts)

    with pytest.raises(EmbeddingError):
        await store.areembed(Interrupted(dims=64, model_id="new-model"), batch_size=5)
    vt = store.rows.vt
    done = select(func.count()).select_from(vt).where(vt.c.model_id == "new-model")
    assert (await store.base.read(done))[0][0] == 10  # two batches of five, each whole
    with pytest.raises(ConfigError):  # half done: not a store of either model yet
        await MemoryStore(cp, embedding=new).asearch("alice", "espresso")
    assert await store.areembed(new, batch_size=5) == 14  # the rest, not the first ten again
    assert await store.areembed(new, batch_size=5) == 0
    redone = MemoryStore(cp, embedding=new)
    assert (await redone.asearch("alice", "espressos", mode="vector"))[0].memory.key == "coffee"
    with pytest.raises(ConfigError):  # the old model is the other one now
        await store.asearch("alice", "espresso")
    with pytest.raises(ConfigError):
        await store.areembed(new, batch_size=0)


async def test_hybrid_keeps_keyword_only_hits_and_scores_are_in_0_1(vstore: MemoryStore) -> None:
    await _fill(vstore)
    for n in range(40):  # many memories closer by vector than the code is
        await vstore.astore("alice", f"Alice espresso vegetarian note {n}", key=f"n{n}")
    # stored without a vector: only the keyword engine can find it
    await vstore.astore("alice", "ticket ZZ-90210 was closed", key="ticket", embed=False)
    assert "ticket" in [h.memory.key for h in await vstore.asearch("alice", "ZZ-90210")]
    hits = await vstore.asearch("alice", "espresso ZZ-90210", limit=50)
    assert "ticket" in [h.memory.key for h in hits]  # in the union, not dropped
    vector = await vstore.asearch("alice", "espresso ZZ-90210", limit=50, mode="vector")
    assert "ticket" not in [h.memory.key for h in vector]
    code = await vstore.asearch("alice", "QX-7731", limit=3)
    assert code[0].memory.key == "code" and 0.5 < code[0].score <= 1.0  # first in both
    for mode in ("hybrid", "vector", "keyword"):
        found = await vstore.asearch("alice", "vegetarians espresso", limit=50, mode=mode)
        assert found, mode
        scores = [h.score for h in found]
        assert all(0.0 <= s <= 1.0 for s in scores), (mode, scores)
        assert scores == sorted(scores, reverse=True), mode
        assert len({h.memory.key for h in found}) == len(found)
    above = await vstore.asearch("alice", "vegetarians", score_threshold=0.9, mode="vector")
    assert all(h.score >= 0.9 for h in above)


async def test_vector_finds_what_keywords_cannot(vstore: MemoryStore) -> None:
    await _fill(vstore)
    # no stemming: "vegetarians" is not the word "vegetarian"
    assert await vstore.asearch("alice", "vegetarians", mode="keyword") == []
    assert (await vstore.asearch("alice", "vegetarians", mode="vector"))[0].memory.key == "diet"
    assert (await vstore.asearch("alice", "retrievers"))[0].memory.key == "pet"
    assert (await vstore.asearch("alice", "Portugal portuguese"))[0].memory.key == "lang"


async def test_filter_namespace_and_limit_apply(vstore: MemoryStore) -> None:
    await vstore.astore("alice", "espresso at work", namespace=("work",), metadata={"n": 1})
    await vstore.astore("alice", "espresso at home", namespace=("home",), metadata={"n": 2})
    await vstore.astore("alice", "espresso elsewhere", namespace=("work", "trips"))
    work = await vstore.asearch("alice", "espresso", namespace=("work",), limit=10)
    assert {h.memory.content for h in work} == {"espresso at work", "espresso elsewhere"}
    kept = await vstore.asearch("alice", "espresso", namespace=(), filter={"n": {"$gte": 2}})
    assert [h.memory.content for h in kept] == ["espresso at home"]
    assert len(await vstore.asearch("alice", "espresso", namespace=(), limit=2)) == 2
    assert await vstore.asearch("alice", "espresso", namespace=(), limit=0) == []


async def test_modes_need_what_they_search(store_backend: Backend) -> None:
    cp = await store_backend.make()
    plain = MemoryStore(cp)
    for mode in ("vector", "hybrid"):
        with pytest.raises(ConfigError, match="embedding"):
            await plain.asearch("alice", "x", mode=mode)
    with pytest.raises(ConfigError, match="mode"):
        await MemoryStore(cp, embedding=HashingEmbedding()).asearch("alice", "x", mode="fuzzy")  # type: ignore[arg-type]
    no_words = MemoryStore(cp, embedding=HashingEmbedding(), keyword_index=False)
    await no_words.astore("alice", "Alice drinks espresso", key="c")
    assert (await no_words.asearch("alice", "espressos"))[0].memory.key == "c"
    with pytest.raises(ConfigError, match="keyword"):
        await no_words.asearch("alice", "espresso", mode="keyword")
    with pytest.raises(ConfigError):
        MemoryStore(cp, embedding="openai")


async def test_another_users_vectors_never_come_back(vstore: MemoryStore) -> None:
    # bob's memories are the closest to the query, and there are many of them
    for n in range(60):
        await vstore.astore("bob", f"espresso vegetarian espresso {n}", key=f"b{n}")
    await _fill(vstore)
    for mode in ("hybrid", "vector"):
        hits = await vstore.asearch("alice", "espresso vegetarian", limit=5, mode=mode)
        assert len(hits) == 5 and {h.memory.user_id for h in hits} == {"alice"}
        assert {h.memory.key for h in hits[:2]} == {"coffee", "diet"}


async def test_delete_and_store_again(vstore: MemoryStore) -> None:
    await _fill(vstore)
    assert (await vstore.asearch("alice", "retriever", mode="vector"))[0].memory.key == "pet"
    assert await vstore.adelete("alice", "pet")
    assert "pet" not in [h.memory.key for h in await vstore.asearch("alice", "retriever", limit=10)]
    await vstore.astore("alice", "Alice adopted a grey cat", key="pet")
    hits = await vstore.asearch("alice", "retriever dog", limit=10, mode="vector")
    assert [h.memory.content for h in hits if h.memory.key == "pet"] == ["Alice adopted a grey cat"]
    await vstore.aupdate("alice", "pet", content="Alice walks a retriever again")
    assert (await vstore.asearch("alice", "retriever", mode="vector"))[0].memory.key == "pet"
    await vstore.aupdate("alice", "pet", metadata={"kept": True})  # the vector stays
    assert (await vstore.asearch("alice", "retriever", mode="vector"))[0].memory.key == "pet"
    assert await _vectors(vstore) == len(FACTS)


async def test_a_write_without_an_embedding_drops_the_stale_vector(vstore: MemoryStore) -> None:
    await _fill(vstore)
    plain = MemoryStore(vstore.repository)
    await plain.aupdate("alice", "pet", content="Alice adopted a grey cat")
    assert await _vectors(vstore) == len(FACTS) - 1
    hits = await vstore.asearch("alice", "retriever", limit=10, mode="vector")
    assert "pet" not in [h.memory.key for h in hits]  # its vector was of the old content
    assert await vstore.areembed() == 0  # no vector: not redone unless asked to
    assert await vstore.areembed(missing=True) == 1
    assert (await vstore.asearch("alice", "grey cats", mode="vector"))[0].memory.key == "pet"


async def test_expired_memories_are_never_found(vstore: MemoryStore, clock: Clock) -> None:
    await _fill(vstore)
    await vstore.astore("alice", "Alice espresso espresso", key="brief", ttl=60)
    assert (await vstore.asearch("alice", "espresso", mode="vector"))[0].memory.key == "brief"
    clock.advance(61)  # the cached matrix still holds it: its expiry applies
    for mode in ("hybrid", "vector"):
        hits = await vstore.asearch("alice", "espresso", limit=20, mode=mode)
        assert "brief" not in [h.memory.key for h in hits]


async def test_two_stores_on_one_database_see_each_others_writes(store_backend: Backend) -> None:
    if store_backend.name == "memory":
        pytest.skip("an in-memory database is one store's own")
    one = MemoryStore(await store_backend.make(), embedding=HashingEmbedding())
    two = MemoryStore(await store_backend.make(), embedding=HashingEmbedding())
    await _fill(one)
    assert (await one.asearch("alice", "retriever", mode="vector"))[0].memory.key == "pet"
    hits = CACHE.hits
    assert (await one.asearch("alice", "retriever", mode="vector"))[0].memory.key == "pet"
    assert CACHE.hits == hits + 1  # no write in between: the cached matrix served it
    await two.astore("alice", "Alice rescued a retriever puppy retriever", key="puppy")
    assert (await one.asearch("alice", "retriever", mode="vector"))[0].memory.key == "puppy"
    await two.adelete("alice", "puppy")
    await two.aupdate("alice", "pet", content="Alice adopted a grey cat")
    hits_now = await one.asearch("alice", "retriever", limit=10, mode="vector")
    assert "puppy" not in [h.memory.key for h in hits_now]
    assert (await one.asearch("alice", "grey cat", mode="vector"))[0].memory.key == "pet"
    await two.lifecycle.delete(lambda: two.lifecycle.of_user("alice"), 100)
    assert await one.asearch("alice", "retriever", mode="vector") == []
    await one.aclose()
    await two.aclose()


async def test_a_write_refreshes_the_cached_matrix_by_what_it_changed(vstore: MemoryStore) -> None:
    """After a write, a search reads the vector of the memory written, not the scope's
    other vectors, and ranks as a matrix read whole would."""
    await _fill(vstore)

    async def ranked(query: str) -> list[tuple[str, float]]:
        hits = await vstore.asearch("alice", query, limit=10, mode="vector")
        return [(h.memory.key, round(h.score, 5)) for h in hits]

    async def refreshed_like_whole(query: str, reads: int) -> list[tuple[str, float]]:
        before = CACHE.vectors_read
        refreshed = await ranked(query)
        assert CACHE.vectors_read - before == reads
        CACHE.clear()
        assert await ranked(query) == refreshed  # the same as a matrix read whole
        return refreshed

    await ranked("tea")  # the scope's matrix, cached
    await vstore.astore("alice", "Alice drinks green tea at noon", key="tea")
    assert (await refreshed_like_whole("green tea", 1))[0][0] == "tea"
    await vstore.aupdate("alice", "coffee", content="Alice gave up coffee for mate")
    assert (await refreshed_like_whole("mate", 1))[0][0] == "coffee"
    # the newest memory deleted and stored again: SQLite may give it the same id, and
    # its version is 1 again — its life (uid) tells the two apart
    assert await vstore.adelete("alice", "tea")
    assert "tea" not in [k for k, _ in await refreshed_like_whole("green tea", 0)]
    await vstore.astore("alice", "Alice collects vinyl records", key="tea")
    assert (await refreshed_like_whole("vinyl records", 1))[0][0] == "tea"
    await vstore.aupdate("alice", "pet", metadata={"kept": True})  # a new version
    await refreshed_like_whole("retriever", 1)
    await vstore.astore("bob", "Bob drinks green tea", key="tea")  # another user's scope
    assert "tea" not in [k for k, _ in await refreshed_like_whole("green tea", 0)][:1]


async def test_a_vector_written_again_at_the_same_version_is_read_again(
    store_backend: Backend,
) -> None:
    """A cached matrix is never left holding a vector that was rewritten without a new
    version of its memory: back to a model with another ``text_of``, or given again to
    memories whose vector was deleted (``missing=True``)."""
    cp = await store_backend.make()
    store = MemoryStore(cp, embedding=HashingEmbedding())
    await _fill(store)

    async def top(query: str) -> str:
        return (await store.asearch("alice", query, limit=1, mode="vector"))[0].memory.key

    assert await top("espresso") == "coffee"  # the scope's matrix, cached
    topics = {"coffee": "Lisbon trams", "city": "espresso beans"}
    await store.areembed(HashingEmbedding(model_id="elsewhere"))
    assert await store.areembed(text_of=lambda m: topics.get(m.key, m.content)) == len(FACTS)
    assert await top("espresso") == "city"  # the same versions and model, new vectors
    assert await top("trams") == "coffee"
    # a vector deleted, then given again: a search in between would drop its row, but
    # none ran — the matrix still holds the first vector of the same version
    assert await store.areembed(HashingEmbedding(model_id="elsewhere")) == len(FACTS)
    assert await store.areembed(text_of=lambda m: None) == 0  # deleted, none written
    assert await store.areembed(missing=True) == len(FACTS)
    assert await top("espresso") == "coffee"
    CACHE.clear()
    assert await top("espresso") == "coffee"
    await store.aclose()


_CHILD = """
import asyncio, sys
sys.path.insert(0, {root!r})
from tenxstore import KeyRing, MemoryStore
from tests.memory.embeddings import HashingEmbedding

async def main():
    keys = KeyRing([("test-k1", bytes(range(32)))]) if {sealed!r} else None
    store = MemoryStore({url!r}, schema={schema!r}, keys=keys, embedding=HashingEmbedding())
    await store.astore("alice", "Alice rescued a retriever puppy retriever", key="puppy")
    await store.aclose()

asyncio.run(main())
"""


async def test_another_process_write_is_seen(store_backend: Backend) -> None:
    if store_backend.name not in ("sqlite", "postgresql"):
        pytest.skip("one SQLite file and one PostgreSQL schema stand for the others")
    one = MemoryStore(await store_backend.make(), embedding=HashingEmbedding())
    await _fill(one)
    assert (await one.asearch("alice", "retriever", mode="vector"))[0].memory.key == "pet"
    assert store_backend.url is not None
    script = _CHILD.format(
        root=str(ROOT),
        url=store_backend.url,
        schema=store_backend.schema,
        sealed=store_backend.keys is not None,
    )
    env = {**os.environ, "TENXSTORE_KEYS": ""}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (await one.asearch("alice", "retriever", mode="vector"))[0].memory.key == "puppy"
    await one.aclose()


def test_sync_twins(tmp_path: Path) -> None:
    store = MemoryStore(f"sqlite:///{tmp_path / 'sync.db'}", embedding=HashingEmbedding())
    store.setup()
    store.store("alice", "Alice drinks a double espresso", key="coffee")
    assert store.search("alice", "espressos", mode="vector")[0].memory.key == "coffee"
    assert store.reembed(HashingEmbedding(dims=32, model_id="small")) == 1
    store.close()


async def test_vectors_are_dropped_with_their_memory_by_a_sweep(
    vstore: MemoryStore, clock: Clock
) -> None:
    await vstore.astore("alice", "brief espresso", key="brief", ttl=60)
    await vstore.astore("alice", "lasting espresso", key="lasting")
    clock.advance(61)
    assert await vstore.asweep_expired() == 1
    assert await _vectors(vstore) == 1


class Recording(HashingEmbedding):
    """Keeps every text it is given to embed as a document."""

    def __init__(self, dims: int = 256, model_id: str = "test-hashing-trigrams") -> None:
        super().__init__(dims, model_id)
        self.seen: list[str] = []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.seen.extend(texts)
        return super().embed_documents(texts)


async def test_writes_embed_the_callers_text_not_its_stored_form(store_backend: Backend) -> None:
    recording = Recording()
    store = MemoryStore(await store_backend.make(), embedding=recording)
    text = 'He said "hi"\nand a back\\slash'
    await store.astore("alice", text, key="k")
    await store.aupdate("alice", "k", content=text + "!")
    assert recording.seen == [text, text + "!"]  # not the JSON-encoded content
    recording.seen.clear()
    await store.areembed(Recording(model_id="other"))
    redo = Recording(model_id="again")
    await store.areembed(redo)
    assert redo.seen == [text + "!"]  # reembed embeds the very same text
    await store.aclose()


async def test_reembed_without_a_text_deletes_the_stale_vector(store_backend: Backend) -> None:
    cp = await store_backend.make()
    old = MemoryStore(cp, embedding=HashingEmbedding(dims=64, model_id="old"))
    await old.astore("alice", "Alice drinks espresso", key="k1")
    await old.astore("alice", "", key="empty")
    await old.astore("alice", "no text chosen", key="none")
    new = MemoryStore(cp, embedding=HashingEmbedding(dims=64, model_id="new"))
    pick = {"k1": "Alice drinks espresso", "empty": "", "none": None}
    assert await new.areembed(text_of=lambda m: pick[m.key]) == 1
    assert await _vectors(new) == 1  # the old model's other two are gone
    assert [h.memory.key for h in await new.asearch("alice", "espressos", mode="vector")] == ["k1"]
    assert await new.areembed(text_of=lambda m: pick[m.key]) == 0


async def test_an_opted_out_memory_stays_without_a_vector(store_backend: Backend) -> None:
    recording = Recording()
    store = MemoryStore(await store_backend.make(), embedding=recording)
    await store.astore("alice", "secret diary entry", key="optout", embed=False)
    await store.astore("alice", "long document body", key="summ", embed="short summary")
    await store.astore("alice", "plain fact", key="plain")
    recording.seen.clear()
    await store.aupdate("alice", "optout", content="secret diary entry, edited")
    assert recording.seen == [] and await _vectors(store) == 2  # still opted out
    await store.aupdate("alice", "optout", content="now embedded", embed=True)
    await store.aupdate("alice", "summ", content="long body, edited", embed="new summary")
    await store.aupdate("alice", "plain", content="plain fact, edited", embed=False)
    assert recording.seen == ["now embedded", "new summary"] and await _vectors(store) == 2
    await store.aupdate("alice", "optout", content="edited again")  # has one: renewed
    assert recording.seen[-1] == "edited again"
    with pytest.raises(ConfigError):
        await store.aupdate("alice", "plain", content="x", embed=1)  # type: ignore[arg-type]
    redo = Recording(model_id="m2")
    assert await store.areembed(redo) == 2  # those with a vector; "plain" opted out
    assert sorted(redo.seen) == ["edited again", "long body, edited"]
    assert await store.areembed(redo, missing=True) == 1  # asked to: "plain" too
    with pytest.raises(ConfigError):
        await store.areembed(redo, missing="yes")  # type: ignore[arg-type]
    await store.aclose()
