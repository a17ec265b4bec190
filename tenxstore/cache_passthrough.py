"""What the cache passes to the wrapped checkpointer as it is.

Thread records, the tool ledger (durable only), iterating and exporting threads: none
of it is cached, so none of it touches Redis.
"""

from __future__ import annotations

from .cache_core import CacheCore
from .facade import forward, forward_iter
from .protocol import Checkpointer

__all__ = ["CachePassthrough"]


class CachePassthrough(CacheCore):
    """The calls :class:`~tenxstore.cache.CachedCheckpointer` passes through."""

    # -- threads -----------------------------------------------------------------

    aput_thread = forward(Checkpointer.aput_thread, "inner", write=True)
    aget_thread = forward(Checkpointer.aget_thread, "inner")
    alist_threads = forward(Checkpointer.alist_threads, "inner")

    # -- tool ledger: durable only, passed through -------------------------------

    abegin_tool_execution = forward(Checkpointer.abegin_tool_execution, "inner", write=True)
    acomplete_tool_execution = forward(Checkpointer.acomplete_tool_execution, "inner", write=True)
    afail_tool_execution = forward(Checkpointer.afail_tool_execution, "inner", write=True)
    aget_tool_execution = forward(Checkpointer.aget_tool_execution, "inner")
    arun_tool_once = forward(Checkpointer.arun_tool_once, "inner", write=True)
    alist_tool_executions = forward(Checkpointer.alist_tool_executions, "inner")

    # -- whole threads: passed through -----------------------------------------

    aiter_threads = forward_iter(Checkpointer.aiter_threads, "inner")
    aexport_thread = forward(Checkpointer.aexport_thread, "inner")
