"""The tables of :mod:`tenxstore.langgraph` (``lg_checkpoints``, ``lg_writes``).

LangGraph checkpoints and pending writes live beside tenxstore's own tables, under
the same thread row lock and ownership rules. Values arrive serialized by LangGraph's
serde; this module stores and finds them.
"""

from __future__ import annotations

from .langgraph_core import (
    INTERRUPT,
    KEY,
    KeyLimits,
    Values,
    needed,
    run_id_of,
    uses_delta_channels,
)
from .langgraph_puts import Puts
from .langgraph_reads import Reads

__all__ = [
    "INTERRUPT",
    "KEY",
    "KeyLimits",
    "LangGraphTables",
    "Values",
    "needed",
    "run_id_of",
    "uses_delta_channels",
]


class LangGraphTables(Puts, Reads):
    """LangGraph checkpoints and writes of a repository's threads.

    Its parts, each a module: :mod:`~tenxstore.langgraph_core` (state, sealing, key
    limits), :mod:`~tenxstore.langgraph_puts` (puts and writes),
    :mod:`~tenxstore.langgraph_reads` (reads and histories),
    :mod:`~tenxstore.langgraph_upkeep` (pruning, deleting runs, copying) and
    :mod:`~tenxstore.langgraph_sql` (the statements built once per store).
    """
