"""The tenxstore error tree.

Every error the library raises on purpose derives from :class:`TenxStoreError`.
Errors that describe bad input also derive from the matching built-in class
(``ValueError``, ``TypeError``, ``PermissionError``, ``LookupError``) so callers
that already catch those keep working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConfigError",
    "ConnectionLost",
    "ImportConflict",
    "LockTimeout",
    "SerializationError",
    "StaleStateError",
    "TenxStoreError",
    "ThreadOwnershipError",
    "ToolExecutionInProgress",
    "ToolExecutionMismatch",
    "ToolExecutionNotFound",
]


class TenxStoreError(Exception):
    """Base class of every error raised by tenxstore."""


class StaleStateError(TenxStoreError):
    """A compare-and-swap write found the thread at another version.

    Attributes:
        thread_id: The thread that was written.
        expected_version: The version the run recorded when it read the thread.
        actual_version: The thread's head version found under the row lock.

    For LangGraph checkpoints (:mod:`tenxstore.langgraph`) the two are checkpoint ids:
    the parent the writer started from, and the namespace's newest checkpoint.
    """

    def __init__(
        self, thread_id: Any, expected_version: int | str, actual_version: int | str
    ) -> None:
        super().__init__(
            f"thread {thread_id!r} is at version {actual_version}, "
            f"not {expected_version}: another run committed first; re-read and retry"
        )
        self.thread_id = thread_id
        self.expected_version = expected_version
        self.actual_version = actual_version

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.thread_id, self.expected_version, self.actual_version))


class ConfigError(TenxStoreError, ValueError):
    """A run config, id or constructor argument is missing or invalid."""


class ThreadOwnershipError(TenxStoreError, PermissionError):
    """A write or delete touched a thread that another user owns."""

    def __init__(self, thread_id: Any, user_id: Any = None) -> None:
        super().__init__(f"thread {thread_id!r} belongs to another user than {user_id!r}")
        self.thread_id = thread_id
        self.user_id = user_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.thread_id, self.user_id))


class SerializationError(TenxStoreError, TypeError):
    """A state, message, argument or result cannot be stored; nothing was written."""


class ConnectionLost(TenxStoreError, ConnectionError):
    """The database connection dropped in the middle of a call.

    A write is never replayed behind the caller's back. ``committed`` says what is
    known of it: ``False`` when the connection died before COMMIT was sent (nothing
    was written), ``None`` when it died during COMMIT (it may have been applied:
    re-read before deciding to write again).
    """

    def __init__(self, message: str, committed: bool | None = False) -> None:
        super().__init__(message)
        self.committed = committed

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.committed))


class LockTimeout(TenxStoreError, TimeoutError):
    """A write waited longer than ``lock_timeout`` for the thread's lock; nothing was written."""


class ImportConflict(TenxStoreError):
    """An imported thread exists with other content; nothing was written."""


class ToolExecutionInProgress(TenxStoreError):
    """Another worker holds a live claim on this tool call."""

    def __init__(self, thread_id: Any, tool_call_id: str, lease_expires_at: Any = None) -> None:
        super().__init__(
            f"tool call {tool_call_id!r} of thread {thread_id!r} is claimed by another "
            f"worker until {lease_expires_at}"
        )
        self.thread_id = thread_id
        self.tool_call_id = tool_call_id
        self.lease_expires_at = lease_expires_at

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.thread_id, self.tool_call_id, self.lease_expires_at))


class ToolExecutionMismatch(TenxStoreError, ValueError):
    """A ``tool_call_id`` was reused with another tool name or other arguments."""


class ToolExecutionNotFound(TenxStoreError, LookupError):
    """Completing or failing a tool call that was never claimed."""
