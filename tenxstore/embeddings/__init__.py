"""Embeddings: what turns a memory's text into a vector, for search by meaning.

An :class:`Embedding` embeds a batch of documents and a query, sync and async, and
names its ``model_id`` and ``dims`` (a store keeps them beside every vector, and
refuses to mix two models). :func:`as_embedding` makes one of:

* an :class:`Embedding` already (returned as it is, ``dims``/``model_id`` checked);
* a LangChain ``Embeddings`` object (anything with ``embed_documents`` and
  ``embed_query``; its ``aembed_*`` used when it has them);
* a plain callable taking a list of texts and returning one vector per text, sync or
  ``async def`` (``dims`` required, ``model_id`` defaulting to its qualified name).

:class:`LocalEmbedding` (the packaged offline model, ``tenxstore[embeddings]``) is
imported from :mod:`tenxstore.embeddings.local` when first asked for.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError

__all__ = [
    "CallableEmbedding",
    "Embedding",
    "LangChainEmbedding",
    "LocalEmbedding",
    "as_embedding",
]

Vectors = list[list[float]]
MAX_MODEL_ID = 255
"""Characters of a ``model_id`` (stored beside every vector)."""


@runtime_checkable
class Embedding(Protocol):
    """Texts to vectors of ``dims`` floats, by the model ``model_id``."""

    dims: int
    model_id: str

    def embed_documents(self, texts: list[str]) -> Vectors:
        """One vector per text, in order."""
        ...

    def embed_query(self, text: str) -> list[float]:
        """The vector of a search query."""
        ...

    async def aembed_documents(self, texts: list[str]) -> Vectors:
        """Async :meth:`embed_documents`."""
        ...

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query`."""
        ...


def check_dims(dims: object) -> int:
    """A ``dims``: an int from 1 to 16000 (pgvector's HNSW takes up to 2000)."""
    if isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= 16000:
        raise ConfigError(f"dims must be an int from 1 to 16000, not {dims!r}")
    return dims


def check_model_id(model_id: object) -> str:
    """A ``model_id``: a non-empty string of at most 255 characters."""
    if not isinstance(model_id, str) or not model_id.strip() or len(model_id) > MAX_MODEL_ID:
        raise ConfigError(
            f"model_id must be a non-empty string of at most {MAX_MODEL_ID} characters, "
            f"not {model_id!r}"
        )
    return model_id


def _name_of(obj: Any) -> str:
    kind = obj if inspect.isfunction(obj) or inspect.ismethod(obj) else type(obj)
    module = getattr(kind, "__module__", "") or ""
    name = getattr(kind, "__qualname__", None) or getattr(kind, "__name__", "embedding")
    return f"{module}.{name}" if module else str(name)


class LangChainEmbedding:
    """A LangChain ``Embeddings`` object as an :class:`Embedding`.

    Args:
        embeddings: Anything with ``embed_documents(list[str])`` and
            ``embed_query(str)`` (and, used when present, their ``aembed_*``).
        dims: Its vectors' length (None: asked of it, ``dims``, or else found by
            embedding one word once).
        model_id: What to record beside its vectors (None: its ``model_id``, ``model`` or
            ``model_name`` attribute, else its class's qualified name).
    """

    def __init__(
        self, embeddings: Any, *, dims: int | None = None, model_id: str | None = None
    ) -> None:
        self.embeddings = embeddings
        if model_id is None:
            found = next(
                (
                    getattr(embeddings, name)
                    for name in ("model_id", "model", "model_name")
                    if isinstance(getattr(embeddings, name, None), str)
                    and getattr(embeddings, name)
                ),
                None,
            )
            model_id = found if isinstance(found, str) and found else _name_of(embeddings)
        self.model_id = check_model_id(model_id)
        if dims is None:
            found_dims = getattr(embeddings, "dims", None) or getattr(
                embeddings, "dimensions", None
            )
            if isinstance(found_dims, int) and not isinstance(found_dims, bool):
                dims = found_dims
            else:
                dims = len(embeddings.embed_query("dimensions"))
        self.dims = check_dims(dims)

    def embed_documents(self, texts: list[str]) -> Vectors:
        return list(self.embeddings.embed_documents(list(texts)))

    def embed_query(self, text: str) -> list[float]:
        return list(self.embeddings.embed_query(text))

    async def aembed_documents(self, texts: list[str]) -> Vectors:
        method = getattr(self.embeddings, "aembed_documents", None)
        if method is None:
            return await asyncio.to_thread(self.embed_documents, texts)
        return list(await method(list(texts)))

    async def aembed_query(self, text: str) -> list[float]:
        method = getattr(self.embeddings, "aembed_query", None)
        if method is None:
            return await asyncio.to_thread(self.embed_query, text)
        return list(await method(text))

    def __repr__(self) -> str:
        return f"LangChainEmbedding({self.model_id!r}, dims={self.dims})"


class CallableEmbedding:
    """A function of a batch of texts to their vectors (sync or ``async def``) as an
    :class:`Embedding`; a query is a batch of one.

    A sync function is run in a worker thread by the async methods; an async one is
    run on a fresh event loop by the sync methods (from a thread without one running).
    """

    def __init__(
        self,
        fn: Callable[[list[str]], Sequence[Sequence[float]] | Awaitable[Sequence[Sequence[float]]]],
        *,
        dims: int,
        model_id: str | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigError(f"an embedding function must be callable, not {type(fn).__name__}")
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004  # an object whose __call__ is async
        )
        self.dims = check_dims(dims)
        self.model_id = check_model_id(_name_of(fn) if model_id is None else model_id)

    def embed_documents(self, texts: list[str]) -> Vectors:
        found = self.fn(list(texts))
        if inspect.isawaitable(found):
            found = _run(found)
        return [list(v) for v in found]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> Vectors:
        if self.is_async:
            found: Any = await self.fn(list(texts))  # type: ignore[misc]
        else:
            found = await asyncio.to_thread(self.fn, list(texts))
            if inspect.isawaitable(found):
                found = await found
        return [list(v) for v in found]

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.aembed_documents([text]))[0]

    def __repr__(self) -> str:
        return f"CallableEmbedding({self.model_id!r}, dims={self.dims})"


def _run(work: Awaitable[Any]) -> Any:
    async def wait() -> Any:
        return await work

    return asyncio.run(wait())


def as_embedding(obj: Any, *, dims: int | None = None, model_id: str | None = None) -> Embedding:
    """``obj`` as an :class:`Embedding` (see the module).

    Raises:
        ConfigError: ``obj`` is none of those, or a plain callable without ``dims``,
            or its ``dims`` / ``model_id`` are not valid (or not the ones given).
    """
    if obj is None or isinstance(obj, (str, bytes)):
        raise ConfigError(
            "an embedding must be an Embedding, a LangChain Embeddings object or a "
            f"function of a list of texts to their vectors, not {obj!r}"
        )
    found = getattr(obj, "dims", None)
    if (
        all(
            callable(getattr(obj, name, None))
            for name in ("embed_documents", "embed_query", "aembed_documents", "aembed_query")
        )
        and isinstance(getattr(obj, "model_id", None), str)
        and isinstance(found, int)
        and not isinstance(found, bool)
    ):  # an Embedding (a LangChain object with a model_id but no dims is adapted below)
        check_dims(found)
        check_model_id(obj.model_id)
        if dims is not None and dims != found:
            raise ConfigError(f"the embedding's dims is {found}, not {dims}")
        if model_id is not None and model_id != obj.model_id:
            return LangChainEmbedding(obj, dims=found, model_id=model_id)
        return obj  # type: ignore[no-any-return]
    if callable(getattr(obj, "embed_documents", None)) and callable(
        getattr(obj, "embed_query", None)
    ):
        return LangChainEmbedding(obj, dims=dims, model_id=model_id)
    if callable(obj):
        if dims is None:
            raise ConfigError(
                "an embedding function needs dims= (the length of the vectors it returns)"
            )
        return CallableEmbedding(obj, dims=dims, model_id=model_id)
    raise ConfigError(
        "an embedding must be an Embedding, a LangChain Embeddings object or a function "
        f"of a list of texts to their vectors, not {type(obj).__name__}"
    )


def __getattr__(name: str) -> Any:
    # The packaged model's dependencies are an extra: imported when first asked for.
    if name == "LocalEmbedding":
        return importlib.import_module(f"{__name__}.local").LocalEmbedding
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
