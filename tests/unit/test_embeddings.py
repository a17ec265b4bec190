"""tenxstore.embeddings: LangChain objects, plain functions (sync and async) and
Embeddings as they are, all behind one protocol; anything else refused."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding

import tenxstore.embeddings as embeddings
from tenxstore import ConfigError
from tenxstore.embeddings import (
    CallableEmbedding,
    Embedding,
    LangChainEmbedding,
    as_embedding,
)
from tests.memory.embeddings import HashingEmbedding


def test_a_langchain_embeddings_object() -> None:
    lc = DeterministicFakeEmbedding(size=12)
    found = as_embedding(lc)
    assert isinstance(found, LangChainEmbedding) and isinstance(found, Embedding)
    assert found.dims == 12  # found by embedding one word
    assert found.model_id.endswith("DeterministicFakeEmbedding")
    assert found.embed_documents(["a", "b"]) == lc.embed_documents(["a", "b"])
    assert found.embed_query("a") == lc.embed_query("a")
    assert asyncio.run(found.aembed_documents(["a"])) == lc.embed_documents(["a"])
    assert asyncio.run(found.aembed_query("a")) == lc.embed_query("a")
    named = as_embedding(lc, dims=12, model_id="fake-12")
    assert named.model_id == "fake-12"


def test_sync_and_async_functions() -> None:
    def sync(texts: list[str]) -> list[list[float]]:
        return [[float(len(t)), 1.0] for t in texts]

    async def coro(texts: list[str]) -> list[list[float]]:
        await asyncio.sleep(0)
        return [[float(len(t)), 2.0] for t in texts]

    one = as_embedding(sync, dims=2)
    assert isinstance(one, CallableEmbedding) and one.model_id.endswith("sync")
    assert one.embed_documents(["ab"]) == [[2.0, 1.0]]
    assert asyncio.run(one.aembed_query("abc")) == [3.0, 1.0]
    two = as_embedding(coro, dims=2, model_id="coro-2")
    assert two.model_id == "coro-2"
    assert asyncio.run(two.aembed_documents(["a", "bb"])) == [[1.0, 2.0], [2.0, 2.0]]
    assert two.embed_query("abcd") == [4.0, 2.0]  # sync from a thread with no loop
    with pytest.raises(ConfigError, match="dims"):
        as_embedding(sync)


def test_an_embedding_is_taken_as_it_is() -> None:
    mine = HashingEmbedding(dims=16)
    assert as_embedding(mine) is mine
    assert as_embedding(mine, dims=16) is mine
    with pytest.raises(ConfigError, match="dims"):
        as_embedding(mine, dims=8)
    renamed = as_embedding(mine, model_id="renamed")
    assert renamed.model_id == "renamed" and renamed.dims == 16


@pytest.mark.parametrize("bad", [None, "openai:text-embedding-3-small", b"x", 3, object()])
def test_anything_else_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigError):
        as_embedding(bad)


@pytest.mark.parametrize("dims", [0, -1, True, 1.5, 16001])
def test_dims_and_model_ids_are_checked(dims: Any) -> None:
    with pytest.raises(ConfigError):
        as_embedding(lambda texts: [], dims=dims)
    with pytest.raises(ConfigError):
        as_embedding(lambda texts: [], dims=3, model_id="")


def test_local_embedding_is_looked_up_lazily() -> None:
    with pytest.raises(AttributeError):
        embeddings.NoSuchThing  # noqa: B018
    try:
        local = embeddings.LocalEmbedding
    except ImportError:  # tenxstore.embeddings.local is another change's (its extra)
        return
    assert local.__name__ == "LocalEmbedding"


def test_a_langchain_object_with_a_model_id_and_no_dims() -> None:
    class Bedrockish(DeterministicFakeEmbedding):
        model_id: str = "amazon.titan-embed-text-v2"

    found = as_embedding(Bedrockish(size=8))
    assert isinstance(found, LangChainEmbedding)
    assert (found.model_id, found.dims) == ("amazon.titan-embed-text-v2", 8)
