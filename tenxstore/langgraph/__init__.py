"""tenxstore for LangGraph: a checkpoint saver, a long-term memory store, replay-safe
tools, and the way in from (and back to) LangGraph's own savers.

Every public name is imported from here (``from tenxstore.langgraph import
TenxCheckpointSaver``) and loaded when first asked for, so that the storage rooms
below, which the repository itself uses, never pull LangGraph in, and a program that
only checkpoints does not pay for LangGraph's store, prebuilt nodes or LangChain's
tools. The names need the ``langgraph`` extra (``pip install 'tenxstore[langgraph]'``).

The rooms, each read in one sitting:

* for graphs: ``saver`` (:class:`TenxCheckpointSaver`; with ``configs``, ``forms``,
  ``lives`` and ``sync``, the sync face on a background loop), ``runs``
  (:func:`ainvoke_retrying`: a refused run again, nothing twice),
  ``tools`` (:class:`ReplaySafeToolNode`), ``store``, ``items``, ``ops`` and ``ttl``
  (:class:`TenxStore`, LangGraph's ``BaseStore`` on the memory store), ``memory``
  (:class:`MemoryConfig`, the documents' agent memory);
* storage (no LangGraph needed): ``tables`` (``LangGraphTables``: ``lg_checkpoints``,
  ``lg_writes``, ``lg_blobs``) composed of ``core``, ``puts``, ``reads``,
  ``histories`` and ``upkeep``, with ``sql`` (the statements), ``columns`` and
  ``values`` (the strict serde's checks); the dialects' one-round-trip paths live in
  ``tenxstore/backends/*_langgraph.py``;
* moving: ``sources`` (LangGraph's PostgreSQL and SQLite tables, read), ``moves``,
  ``importer`` (:func:`aimport_langgraph`), ``export`` (:func:`acopy_langgraph_thread`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .export import acopy_langgraph_thread
    from .importer import LangGraphImport, aimport_langgraph, import_langgraph
    from .memory import MemoryConfig, format_memories, memory_tools
    from .runs import ainvoke_retrying, idempotent_input, invoke_retrying
    from .saver import DEFAULT_HISTORY_LIMIT, HEAD_KEY, TenxCheckpointSaver, run_life
    from .store import SHARED_USER, TenxStore
    from .tools import ReplaySafeToolNode

# Each public name, and the room it lives in.
_ROOMS = {
    "DEFAULT_HISTORY_LIMIT": "saver",
    "HEAD_KEY": "saver",
    "TenxCheckpointSaver": "saver",
    "run_life": "saver",
    "ainvoke_retrying": "runs",
    "idempotent_input": "runs",
    "invoke_retrying": "runs",
    "ReplaySafeToolNode": "tools",
    "TenxStore": "store",
    "SHARED_USER": "store",
    "MemoryConfig": "memory",
    "format_memories": "memory",
    "memory_tools": "memory",
    "LangGraphImport": "importer",
    "aimport_langgraph": "importer",
    "import_langgraph": "importer",
    "acopy_langgraph_thread": "export",
}

__all__ = [
    "DEFAULT_HISTORY_LIMIT",
    "HEAD_KEY",
    "SHARED_USER",
    "LangGraphImport",
    "MemoryConfig",
    "ReplaySafeToolNode",
    "TenxCheckpointSaver",
    "TenxStore",
    "acopy_langgraph_thread",
    "aimport_langgraph",
    "ainvoke_retrying",
    "format_memories",
    "idempotent_input",
    "import_langgraph",
    "invoke_retrying",
    "memory_tools",
    "run_life",
]


if not TYPE_CHECKING:  # mypy reads the names above
    __getattr__, __dir__ = lazy_names(__name__, _ROOMS, globals())
