"""TenxStore(index=...): LangGraph's IndexConfig (embed, dims, fields) on the memory
store's vectors, from a graph and beside LangGraph's own InMemoryStore."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

from tenxstore import ConfigError, MemoryStore
from tenxstore.langgraph import TenxCheckpointSaver, TenxStore
from tests.conftest import Backend
from tests.memory.embeddings import HashingEmbedding

ITEMS = {
    "diet": {"text": "Alice is a vegetarian", "source": "chat"},
    "coffee": {"text": "Alice drinks a double espresso", "source": "chat"},
    "pet": {"text": "Alice has a golden retriever", "source": "form"},
}


def _index(**more: Any) -> dict[str, Any]:
    embedding = HashingEmbedding()
    return {"embed": embedding.embed_documents, "dims": embedding.dims, **more}


async def test_search_by_meaning_ranks_as_langgraphs_store(lg_memories: MemoryStore) -> None:
    ours = TenxStore(lg_memories, user_id="alice", index=_index(fields=["text"]))
    theirs = InMemoryStore(index=_index(fields=["text"]))  # type: ignore[arg-type]
    for store in (ours, theirs):
        for key, value in ITEMS.items():
            await store.aput(("facts",), key, value)
        # "vegetarians" is no word of any item: only the vectors find it
        found = await store.asearch(("facts",), query="vegetarians", limit=1)
        assert [i.key for i in found] == ["diet"]
        assert found[0].score is not None
        assert (await store.asearch(("facts",), query="retrievers", limit=1))[0].key == "pet"
        assert (await store.asearch(("facts",), query="espressos", limit=1))[0].key == "coffee"
        listed = await store.asearch(("facts",), limit=10)  # no query: a listing
        assert {i.key for i in listed} == set(ITEMS)
        kept = await store.asearch(("facts",), query="retriever", filter={"source": "chat"})
        assert {i.key for i in kept} == {"diet", "coffee"}


async def test_fields_and_index_false(lg_memories: MemoryStore) -> None:
    store = TenxStore(lg_memories, user_id="alice", index=_index(fields=["text"]))
    await store.aput(("facts",), "hidden", {"text": "Alice collects vintage stamps"}, index=False)
    await store.aput(
        ("facts",), "other", {"text": "x", "note": "Alice plays cello"}, index=["note"]
    )
    await store.aput(("facts",), "nothing", {"note": "no text field here"})
    vt = lg_memories.rows.vt
    assert len(await lg_memories.base.read(vt.select())) == 1  # only "other" has a vector
    top = await store.asearch(("facts",), query="cellos", limit=1)
    assert [i.key for i in top] == ["other"]
    # index=False: no vector, yet its words still find it (hybrid keeps keyword hits)
    assert "hidden" in [i.key for i in await store.asearch(("facts",), query="stamps")]
    assert store.embedded_text({"text": "a", "note": "b"}, ["text", "note"]) == "a\nb"
    assert store.for_user("bob").index_config is not None


async def test_bad_index_configs(lg_memories: MemoryStore) -> None:
    with pytest.raises(ConfigError):
        TenxStore(lg_memories, index={"embed": HashingEmbedding().embed_documents})  # no dims
    with pytest.raises(ConfigError):
        TenxStore(lg_memories, index={"embed": HashingEmbedding(), "dims": 12})  # not its dims
    with pytest.raises(ConfigError):
        TenxStore(lg_memories, index={"dims": 3})  # no embedding anywhere
    with pytest.raises(ConfigError):
        TenxStore(lg_memories, index={"embed": HashingEmbedding(), "fields": "text"})
    with pytest.raises(ConfigError):
        TenxStore(lg_memories, index="openai")  # type: ignore[arg-type]


async def test_reembed_through_the_store_embeds_the_fields(lg_memories: MemoryStore) -> None:
    store = TenxStore(lg_memories, user_id="alice", index=_index(fields=["text"]))
    for key, value in ITEMS.items():
        await store.aput(("facts",), key, value)
    small = HashingEmbedding(dims=64, model_id="small")
    assert await store.areembed(small, batch_size=2) == 3
    again = TenxStore(lg_memories, user_id="alice", index={"embed": small, "fields": ["text"]})
    assert (await again.asearch(("facts",), query="vegetarians", limit=1))[0].key == "diet"


class Turn(TypedDict, total=False):
    said: str
    heard: str


def recall(state: Turn, *, store: BaseStore) -> Turn:
    said = state["said"]
    if said.startswith("remember "):
        fact = said.removeprefix("remember ")
        store.put(("memories",), str(abs(hash(fact))), {"text": fact})
        return {"heard": "noted"}
    hits = store.search(("memories",), query=said, limit=1)
    return {"heard": hits[0].value["text"] if hits else "nothing"}


async def test_a_graph_recalls_by_meaning_across_threads(store_backend: Backend) -> None:
    cp = await store_backend.make()
    store = TenxStore(MemoryStore(cp), index=_index(fields=["text"]))
    graph = (
        StateGraph(Turn)
        .add_node("recall", recall)
        .add_edge(START, "recall")
        .add_edge("recall", END)
        .compile(checkpointer=TenxCheckpointSaver(cp), store=store)
    )

    def config(thread: str, user: str) -> Any:
        return {"configurable": {"thread_id": thread, "user_id": user}}

    def turns() -> list[str]:
        for fact in ("Alice is a vegetarian", "Alice drinks a double espresso"):
            graph.invoke({"said": f"remember {fact}"}, config("t1", "alice"))
        graph.invoke({"said": "remember Bob is a vegetarian too"}, config("t9", "bob"))
        return [
            graph.invoke({"said": said}, config(thread, user))["heard"]
            for said, thread, user in (
                ("what about vegetarians?", "t2", "alice"),
                ("espressos", "t3", "alice"),
                ("espressos", "t4", "carol"),
            )
        ]

    # sync nodes in a worker thread (the store's sync calls never block a loop)
    heard = await asyncio.to_thread(turns)
    assert heard == ["Alice is a vegetarian", "Alice drinks a double espresso", "nothing"]


async def test_no_index_over_a_store_with_an_embedding_keeps_vectors(
    lg_memories: MemoryStore,
) -> None:
    vstore = lg_memories.with_embedding(HashingEmbedding())
    store = TenxStore(vstore, user_id="alice")  # no index=: the store's embedding, "$"
    assert store.index_config is not None and store.index_config["dims"] == 256
    await store.aput(("n",), "a", {"text": "Alice drinks espresso"})
    vt = vstore.rows.vt
    assert len(await vstore.base.read(vt.select())) == 1
    await store.aput(("n",), "a", {"text": "Alice drinks espresso daily"})
    assert len(await vstore.base.read(vt.select())) == 1  # renewed, not deleted
    assert await store.areembed() == 0 and await vstore.areembed() == 0
    assert [i.key for i in await store.asearch(("n",), query="espressos")] == ["a"]
    assert store.for_user("bob").index_config is not None


async def test_reembed_leaves_index_false_items_without_a_vector(
    lg_memories: MemoryStore,
) -> None:
    store = TenxStore(lg_memories, user_id="alice", index=_index(fields=["text"]))
    await store.aput(("n",), "a", {"text": "espresso", "secret": "hunter2"})
    await store.aput(("n",), "b", {"text": "opted out"}, index=False)
    seen: list[str] = []

    class Recording(HashingEmbedding):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            seen.extend(texts)
            return super().embed_documents(texts)

    assert await store.areembed(Recording(dims=64, model_id="m2")) == 1
    assert seen == ["espresso"]  # "b" stays opted out
    vt = lg_memories.rows.vt
    assert len(await lg_memories.base.read(vt.select())) == 1
