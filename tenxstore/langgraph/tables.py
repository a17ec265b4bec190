"""The tables of :mod:`tenxstore.langgraph` (``lg_checkpoints``, ``lg_writes``).

LangGraph checkpoints and pending writes live beside tenxstore's own tables, under
the same thread row lock and ownership rules. Values arrive serialized by LangGraph's
serde; this module stores and finds them.
"""

from __future__ import annotations

from .core import (
    INTERRUPT,
    KEY,
    KeyLimits,
    Values,
    needed,
    run_id_of,
    uses_delta_channels,
)
from .histories import Histories
from .puts import Puts

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


class LangGraphTables(Puts, Histories):
    """LangGraph checkpoints and writes of a repository's threads.

    Its parts, each a module: :mod:`~tenxstore.langgraph.core` (state, sealing, key
    limits), :mod:`~tenxstore.langgraph.puts` (puts and writes),
    :mod:`~tenxstore.langgraph.reads` (reads), :mod:`~tenxstore.langgraph.histories`
    (``DeltaChannel`` histories),
    :mod:`~tenxstore.langgraph.upkeep` (pruning, deleting runs, copying) and
    :mod:`~tenxstore.langgraph.sql` (the statements built once per store).
    """
