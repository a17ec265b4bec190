"""The plain values a backend and the repository hand each other: a head write, a
thread's head, the tables' sizes, a state write's parameters; and what a backend's
one-round-trip LangGraph paths promise (:class:`LangGraphFastPath`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from .driver import DriverStatement

__all__ = ["Footprint", "Head", "HeadWrite", "LangGraphFastPath", "StateWrite", "TableSizes"]


@dataclass(frozen=True, slots=True)
class HeadWrite:
    """A state write that a backend's hot path may commit in one step.

    It commits only the common case — the thread exists, ``user_id`` owns it exactly
    (when ``owned``: None is a thread of no user), its version is ``expected`` and its
    incarnation ``incarnation`` (when given) — and otherwise writes nothing: the
    repository then takes the locked path, which creates threads and raises the precise
    error. A sealed write is ``owned`` whether isolation applies or not: its payloads
    were sealed for that owner and that incarnation before the write began, so they
    may be stored only in the thread's life that has both.
    """

    thread_id: Any
    user_id: Any
    owned: bool
    expected: int | None
    incarnation: int | None
    state: str
    meta: str | None
    now: datetime
    messages: list[dict[str, Any]]
    history_limit: int


class Head(NamedTuple):
    """A thread's head: version, incarnation, owner (the row's ``user_id``), and the
    state's text (None when it has no state, or when not read)."""

    version: int
    incarnation: int
    user_id: Any
    state: str | None


class TableSizes(NamedTuple):
    """One table as the database accounts for it (None: it cannot say)."""

    rows: int | None
    table_bytes: int | None
    index_bytes: int | None
    dead_rows: int | None


class Footprint(NamedTuple):
    """The store's tables on disk (see
    :meth:`~tenxstore.backends.base.Backend.footprint`)."""

    tables: dict[str, TableSizes]
    database_bytes: int | None
    free_bytes: int | None


StateWrite = dict[str, Any]
"""Parameters of one state write: ``b_thread``, ``b_version``, ``b_state``, ``b_meta``,
``b_now``, ``b_upto`` and ``messages`` (rows of ``message_id``, ``role``, ``payload``)."""


class LangGraphFastPath(Protocol):
    """A backend's one-round-trip LangGraph paths (see :meth:`Backend.langgraph_fast_path`):
    each commits only the common case, or writes nothing and says so, and the portable
    locked path of :mod:`tenxstore.langgraph.tables` then does the work."""

    @property
    def available(self) -> bool:
        """Whether the paths may be taken now."""

    async def put(self, scoped: bool, values: dict[str, Any]) -> tuple[int, Any] | None:
        """A checkpoint put: ``(incarnation, the checkpoint probed or None)``, or None
        when it wrote nothing."""

    async def put_writes(self, scoped: bool, values: dict[str, Any]) -> bool:
        """A task's writes: whether they were stored."""

    async def read(self, scoped: bool, values: dict[str, Any]) -> Mapping[str, Any] | None:
        """One checkpoint with its writes and value chains, or None."""

    async def fetch(self, stmt: DriverStatement, values: Mapping[str, Any]) -> Sequence[Any]:
        """The rows of one read-only statement, in one round trip."""
