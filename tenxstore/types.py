"""Frozen value types returned by the checkpointers."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "AuthPolicy",
    "Commit",
    "Health",
    "ImportOutcome",
    "Imported",
    "LangGraphBlob",
    "LangGraphCheckpoint",
    "LangGraphWrite",
    "Memory",
    "MemoryHit",
    "MessageRecord",
    "OnConflict",
    "ReadSource",
    "ReplicaHealth",
    "StateSnapshot",
    "ThreadExport",
    "ThreadInfo",
    "ToolExecution",
    "ToolStatus",
]

ToolStatus = Literal["started", "succeeded", "failed"]
OnConflict = Literal["fail", "skip", "replace"]
"""What an import does with a thread that exists with other content."""
ImportOutcome = Literal["created", "unchanged", "skipped", "replaced"]
"""What an import did with one thread."""


@dataclass(frozen=True)
class AuthPolicy:
    """Per-call authorization policy, passed as ``config["auth_policy"]``.

    Attributes:
        enforce_user_isolation: Whether the call is scoped to ``config["user_id"]``.
            Overrides the checkpointer's own ``enforce_user_isolation`` for that call.
    """

    enforce_user_isolation: bool = True


@dataclass(frozen=True)
class Commit:
    """What a committed write or delete did to a thread, as a cache needs to know it.

    Attributes:
        thread_id: The thread.
        user_id: Its owner (not the caller, when isolation was lifted for the call).
        incarnation: Which life of the thread id (see :data:`tenxstore.config.INCARNATION_KEY`).
        version: Its head version after the write (for a delete: the last one).
    """

    thread_id: Any
    user_id: Any
    incarnation: int
    version: int
    state_text: str | None = field(default=None, repr=False, compare=False)
    """The state as the store encoded it (a cache stores the same text, encoded once)."""


@dataclass(frozen=True)
class Imported:
    """What an import did to one thread, as a cache needs to know it.

    Attributes:
        outcome: ``"created"``, ``"unchanged"``, ``"skipped"`` or ``"replaced"``.
        replaced: The life it replaced (its owner may differ from the import's).
        thread_id: The imported thread.
        user_id: Its owner, as imported.
    """

    outcome: ImportOutcome
    replaced: Commit | None = None
    thread_id: Any = None
    user_id: Any = None


@dataclass(frozen=True)
class ThreadInfo:
    """The record of one thread."""

    thread_id: Any
    user_id: Any
    name: str | None
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    version: int = 0


@dataclass(frozen=True)
class StateSnapshot:
    """One retained version of a thread's state."""

    version: int
    state: dict[str, Any]
    meta: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class ToolExecution:
    """The ledger record of one tool call."""

    thread_id: Any
    tool_call_id: str
    tool_name: str
    args: dict[str, Any]
    status: ToolStatus
    result: Any
    error: str | None
    attempts: int
    started_at: datetime
    finished_at: datetime | None
    lease_expires_at: datetime | None = None


@dataclass(frozen=True)
class MessageRecord:
    """A stored message with the time it was stored."""

    message: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class LangGraphCheckpoint:
    """A LangGraph checkpoint as :mod:`tenxstore.langgraph` stores it (the value as
    LangGraph's serde wrote it: ``type`` and ``checkpoint`` bytes)."""

    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    type: str
    checkpoint: bytes
    metadata: dict[str, Any]
    created_at: datetime
    #: Its channels' versions, whose values are :class:`LangGraphBlob` s; None when
    #: the values are inline in ``checkpoint`` (written before tenxstore kept them apart).
    versions: dict[str, str] | None = None


@dataclass(frozen=True)
class LangGraphWrite:
    """A pending write of a LangGraph task, as :mod:`tenxstore.langgraph` stores it."""

    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    type: str
    value: bytes
    task_path: str


@dataclass(frozen=True)
class LangGraphBlob:
    """One version of one channel's value (as LangGraph's serde wrote it), shared by
    the checkpoints of its namespace that name that version."""

    checkpoint_ns: str
    channel: str
    version: str
    type: str
    blob: bytes


@dataclass(frozen=True)
class ThreadExport:
    """Everything a store holds of one thread: its record, retained states (newest
    first), messages (in order), tool ledger, and LangGraph checkpoints, writes and
    channel values.
    ``aimport_thread`` writes it back."""

    thread: ThreadInfo
    states: tuple[StateSnapshot, ...]
    messages: tuple[MessageRecord, ...]
    tool_executions: tuple[ToolExecution, ...]
    langgraph_checkpoints: tuple[LangGraphCheckpoint, ...] = ()
    langgraph_writes: tuple[LangGraphWrite, ...] = ()
    langgraph_blobs: tuple[LangGraphBlob, ...] = ()


@dataclass(frozen=True)
class ReadSource:
    """Where a read that tolerates lag was served from (see ``replica_urls``, and
    :func:`tenxstore.config.read_source`).

    Attributes:
        replica: The standby that answered (its URL without password), or None: the
            primary did.
        lag: An upper bound, in seconds, of how far behind the primary the answer may
            be (0.0: the primary's own).
    """

    replica: str | None
    lag: float

    @property
    def primary(self) -> bool:
        """Whether the primary answered."""
        return self.replica is None


@dataclass(frozen=True)
class ReplicaHealth:
    """What :meth:`acheck` found of one read replica (see ``replica_urls``).

    Attributes:
        replica: The standby (its URL without password).
        lag: An upper bound, in seconds, of how far behind the primary it is (None:
            not known).
        error: Why it serves no reads now (down, refused, promoted, past its lag
            bound), or None: it serves the reads that tolerate lag.
    """

    replica: str
    lag: float | None
    error: str | None


@dataclass(frozen=True)
class Health:
    """What :meth:`acheck` found: the database, its schema, and the cache.

    Attributes:
        database: Where the data lives (URL without password, and schema).
        database_error: Why the database cannot be used, or None.
        revision: The schema revision found (None: never set up, or unreachable).
        head: The revision this release needs.
        cache: The Redis server, or None without a cache.
        cache_error: Why Redis cannot be used (the cache then fails open), or None.
        cache_down_for: Seconds left in the window in which Redis is not tried.
        pending_invalidations: Cache entries to invalidate once Redis answers again.
        sealed_since: When the store was marked as holding sealed values (None: not
            marked, or not read: the schema is not at head).
        encryption_error: Why this checkpointer may not write: it has no key ring and
            the store holds sealed values (its writes raise ``ConfigError``), or None.
        replicas: Each read replica's lag and error (empty: no ``replica_urls``).
    """

    database: str
    database_error: str | None
    revision: str | None
    head: str | None
    cache: str | None = None
    cache_error: str | None = None
    cache_down_for: float = 0.0
    pending_invalidations: int = 0
    sealed_since: datetime | None = None
    encryption_error: str | None = None
    replicas: tuple[ReplicaHealth, ...] = ()

    @property
    def problems(self) -> list[str]:
        """What is wrong, one line each (empty: healthy)."""
        found = []
        if self.database_error is not None:
            found.append(f"database: {self.database_error}")
        elif self.revision != self.head:
            found.append(
                f"schema: at {self.revision or 'nothing'}, this release needs {self.head}: "
                "run `tenxstore upgrade` (or `await checkpointer.asetup()`)"
            )
        if self.encryption_error is not None:
            found.append(f"encryption: {self.encryption_error}")
        if self.cache_error is not None:
            found.append(f"cache: {self.cache_error} (calls are served by the database)")
        found.extend(
            f"replica {r.replica}: {r.error} (its reads are served by the primary)"
            for r in self.replicas
            if r.error is not None
        )
        return found

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems


@dataclass(frozen=True)
class Memory:
    """One long-term memory of a user (:class:`tenxstore.MemoryStore`), at one version.

    Attributes:
        key: Its id within its namespace (1-255 characters).
        namespace: Its labels, e.g. ``("memories",)`` or ``("memories", "work")``.
        user_id: Its owner.
        content: The text remembered.
        metadata: A JSON object stored with it (what ``filter`` looks at).
        version: 1 on creation, + 1 per write (``aupdate``, or ``astore`` of its key).
        created_at: When it was first stored (kept by every later version).
        updated_at: When this version was written.
        expires_at: When it expires (None: never); an expired memory is never returned.
    """

    key: str
    namespace: tuple[str, ...]
    user_id: Any
    content: str
    metadata: dict[str, Any]
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None


@dataclass(frozen=True)
class MemoryHit:
    """A memory found by :meth:`tenxstore.MemoryStore.asearch`.

    Attributes:
        memory: The memory.
        score: How close it is to the query, in [0, 1] (higher is closer): the
            database's rank normalised within the query (the best match has 1).
    """

    memory: Memory
    score: float
