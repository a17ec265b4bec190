"""Frozen value types returned by the checkpointers."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "AuthPolicy",
    "ImportOutcome",
    "MessageRecord",
    "OnConflict",
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
class ThreadExport:
    """Everything a store holds of one thread: its record, retained states (newest
    first), messages (in order) and tool ledger. ``aimport_thread`` writes it back."""

    thread: ThreadInfo
    states: tuple[StateSnapshot, ...]
    messages: tuple[MessageRecord, ...]
    tool_executions: tuple[ToolExecution, ...]
