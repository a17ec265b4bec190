"""tenxstore: durable, versioned, per-user persistence for AI-agent threads."""

from .backends import transaction_pooling_args
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
from .protocol import Checkpointer
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
    "Checkpointer",
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
    "transaction_pooling_args",
]

__version__ = "0.1.0"
