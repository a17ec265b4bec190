"""The plain values a backend and the repository hand each other: a head write, a
thread's head, the tables' sizes, a state write's parameters; and what a backend's
one-round-trip LangGraph paths promise (:class:`LangGraphFastPath`), and its one-step
memory put and get (:class:`MemoryFastPath`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from .driver import DriverStatement

__all__ = [
    "Footprint",
    "Head",
    "HeadWrite",
    "LangGraphFastPath",
    "MemoryFastPath",
    "MemoryPut",
    "MemoryRecord",
    "PutOutcome",
    "StateWrite",
    "TableSizes",
]


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


class MemoryRecord(NamedTuple):
    """A ``memories`` row as a backend's memory fast path returns it (its columns)."""

    id: int
    uid: str
    user_id: Any
    namespace: str
    memory_key: str
    content: str
    metadata: str
    terms: str | None
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class MemoryPut:
    """A memory's put (``astore``) that a backend's fast path may commit in one step.

    It commits only the common cases: no memory under the key (version 1 is made, with
    ``uid``, when ``make``: a uid new to the store), or a live one (its next version:
    ``created_at`` kept, the version it replaces moved to its history when
    ``history_limit`` is over 1, the versions beyond the limit deleted). Either way the
    memory's vector becomes ``vector`` (None: deleted; ``vector_type``: pgvector's
    column, written beside the bytes) and its scope's revision ``revision``. Content
    and metadata are sealed for ``uid`` when ``sealed``: a live memory of another uid
    is then not written, unless the path can seal them for it itself (``reseal``: the
    content and metadata sealed for a uid). Anything else (an expired memory there, a
    writer that committed meanwhile) writes nothing, and the locked path does the work.
    """

    user_id: Any
    namespace: str
    key: str
    uid: str
    make: bool
    sealed: bool
    content: str
    metadata: str
    terms: str | None
    now: datetime
    expires_at: datetime | None
    history_limit: int
    revision: int
    vector: bytes | None
    model_id: str | None
    dims: int | None
    vector_type: str | None
    reseal: Callable[[str], tuple[str, str]] | None = None


class PutOutcome(NamedTuple):
    """What a fast put did: the row as written; or nothing (``written`` None), and
    ``uid`` when that is because the live memory there has this other uid (seal for
    it and put again), None when the locked path must do the work."""

    written: MemoryRecord | None
    uid: str | None


class MemoryFastPath(Protocol):
    """A backend's one-step memory put and get (see :meth:`Backend.memory_fast_path`)."""

    @property
    def available(self) -> bool:
        """Whether the paths may be taken now."""

    async def put(self, put: MemoryPut) -> PutOutcome:
        """Commit the put in one step, or write nothing and say why (see :class:`MemoryPut`)."""

    async def get(
        self, user_id: Any, namespace: str, key: str, now: datetime
    ) -> MemoryRecord | None:
        """The user's memory under ``key`` in ``namespace`` unless expired at ``now``."""
