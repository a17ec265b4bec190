"""tenxstore: durable, versioned, per-user persistence for AI-agent threads."""

from .cache import CachedCheckpointer
from .errors import (
    ConfigError,
    ConnectionLost,
    ImportConflict,
    LockTimeout,
    SerializationError,
    StaleStateError,
    TenxStoreError,
    ThreadOwnershipError,
    ToolExecutionInProgress,
    ToolExecutionMismatch,
    ToolExecutionNotFound,
)
from .presets import InMemoryCheckpointer, PgCheckpointer, SqliteCheckpointer
from .repository import CheckpointRepository
from .types import (
    AuthPolicy,
    MessageRecord,
    StateSnapshot,
    ThreadExport,
    ThreadInfo,
    ToolExecution,
)

__all__ = [
    "AuthPolicy",
    "CachedCheckpointer",
    "CheckpointRepository",
    "ConfigError",
    "ConnectionLost",
    "ImportConflict",
    "InMemoryCheckpointer",
    "LockTimeout",
    "MessageRecord",
    "PgCheckpointer",
    "SerializationError",
    "SqliteCheckpointer",
    "StaleStateError",
    "StateSnapshot",
    "TenxStoreError",
    "ThreadExport",
    "ThreadInfo",
    "ThreadOwnershipError",
    "ToolExecution",
    "ToolExecutionInProgress",
    "ToolExecutionMismatch",
    "ToolExecutionNotFound",
]

__version__ = "0.1.0"
