"""Long-term memory: the documents' fourth layer, facts that carry across threads.

:class:`MemoryStore` keeps each user's memories in the checkpointer's own database
(tables ``memories`` and ``memory_versions``, made by the same migrations), versioned
and sealed like every payload, with keyword search on the database's full-text engine.
:class:`~tenxstore.memory.mem0.Mem0Store` gives the same methods over Mem0 (the
``mem0`` extra). :class:`~tenxstore.memory.qdrant.QdrantIndex` (the ``qdrant`` extra)
puts the vectors in Qdrant as well, searched instead of the database's own index.
See docs/memory.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .validation import DEFAULT_NAMESPACE, MAX_CONTENT_BYTES, MAX_METADATA_BYTES

if TYPE_CHECKING:
    from .bulk import NewMemory
    from .mem0 import Mem0Store, local_mem0
    from .qdrant import QdrantIndex
    from .store import MemoryStore

__all__ = [
    "DEFAULT_NAMESPACE",
    "MAX_CONTENT_BYTES",
    "MAX_METADATA_BYTES",
    "Mem0Store",
    "MemoryStore",
    "NewMemory",
    "QdrantIndex",
    "local_mem0",
]


def __getattr__(name: str) -> Any:
    # Imported when first asked for: tenxstore.lifecycle uses this package's rows, and
    # the store imports the repository, which imports tenxstore.lifecycle.
    if name == "MemoryStore":
        from .store import MemoryStore

        return MemoryStore
    if name in ("Mem0Store", "local_mem0"):  # mem0 itself is imported only when used
        from . import mem0

        return getattr(mem0, name)
    if name == "QdrantIndex":  # qdrant_client itself is imported only when used
        from .qdrant import QdrantIndex

        return QdrantIndex
    if name == "NewMemory":
        from .bulk import NewMemory

        return NewMemory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
