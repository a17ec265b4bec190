"""What a LangGraph run carries from one call of a
:class:`~tenxstore.langgraph.TenxCheckpointSaver` to the next, in its context: the life
(incarnation) of each thread it read or wrote, and the namespaces it read empty.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from ..config import INCARNATION_KEY
from ..protocol import Checkpointer

__all__ = ["config_life", "found_empty", "lived", "run_life", "saw_head"]


_FOUND_EMPTY: ContextVar[frozenset[tuple[int, Any, str]]] = ContextVar(
    "tenxstore_langgraph_found_empty", default=frozenset()
)
"""(saver, thread, namespace) this run read as empty: its first checkpoint must find
it empty still (LangGraph writes it from a task that inherits this context)."""
_LIVES: ContextVar[dict[tuple[int, Any], int] | None] = ContextVar(
    "tenxstore_langgraph_lives", default=None
)
"""(store, thread) -> the life (incarnation) of the thread this run read or wrote.

One dict per run, made by the run's first read (in the run's own context) and shared
by reference with every context copied from it afterwards: the tasks LangGraph starts,
and the background task that stores its checkpoints (``durability="async"``), whose
put of the run's first checkpoint records the life the tasks then see."""


def lived(tables: Any, thread_id: Any, incarnation: int | None, *, reading: bool) -> None:
    """Record (or, None, forget) the life of a thread this run read or wrote; a read
    makes the run's dict where there is none yet."""
    lives = _LIVES.get()
    if lives is None:
        if not reading:
            return  # not in a run that read first (a put of LangGraph's own making)
        lives = {}
        _LIVES.set(lives)
    key = (id(tables), thread_id)
    if incarnation is None:
        lives.pop(key, None)
    else:
        lives[key] = incarnation


def run_life(checkpointer: Checkpointer, thread_id: Any) -> int | None:
    """The life (incarnation) of ``thread_id`` that this LangGraph run read or wrote
    through a :class:`TenxCheckpointSaver` on ``checkpointer`` (its tasks inherit the
    run's context), or None: the run has not read it, or found it empty."""
    lives = _LIVES.get()
    return None if lives is None else lives.get((id(checkpointer.langgraph), thread_id))


def config_life(tables: Any, config: Any, *, reading: bool) -> None:
    """After a synchronous call (its async twin ran on the background loop, in a
    context of its own): the life its returned config names, in the caller's run."""
    conf = (config or {}).get("configurable") or {}
    if conf.get("thread_id") is not None and conf.get(INCARNATION_KEY) is not None:
        lived(tables, conf["thread_id"], conf[INCARNATION_KEY], reading=reading)


def found_empty(tables: Any, thread_id: Any, ns: str) -> bool:
    """Whether this run read the namespace empty (and has written no head there since)."""
    return (id(tables), thread_id, ns) in _FOUND_EMPTY.get()


def saw_head(tables: Any, thread_id: Any, ns: str, *, empty: bool) -> None:
    """What this run saw of a namespace's head: none (``empty``), or one (read, or
    written by the run: the next first write needs a read)."""
    key = (id(tables), thread_id, ns)
    seen = _FOUND_EMPTY.get()
    _FOUND_EMPTY.set(seen | {key} if empty else seen - {key})
