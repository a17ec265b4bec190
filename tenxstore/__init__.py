"""tenxstore: durable, versioned, per-user persistence for AI-agent threads."""

from importlib import metadata as _metadata

from .backends import transaction_pooling_args
from .cache import CachedCheckpointer
from .errors import (
    CacheUnreachable,
    ConfigError,
    ConnectionLost,
    DatabaseUnavailable,
    ImportConflict,
    LockTimeout,
    SchemaNotReady,
    SerializationError,
    StaleStateError,
    TenxStoreError,
    ThreadOwnershipError,
    ToolExecutionClaimLost,
    ToolExecutionInProgress,
    ToolExecutionMismatch,
    ToolExecutionNotFound,
)
from .lifecycle import DeleteResult, parse_duration
from .presets import InMemoryCheckpointer, PgCheckpointer, SqliteCheckpointer
from .protocol import Checkpointer
from .repository import CheckpointRepository
from .stats import StoreStats, TableStats, UserStats
from .types import (
    AuthPolicy,
    Commit,
    Health,
    Imported,
    LangGraphBlob,
    LangGraphCheckpoint,
    LangGraphWrite,
    MessageRecord,
    StateSnapshot,
    ThreadExport,
    ThreadInfo,
    ToolExecution,
)

__all__ = [
    "AuthPolicy",
    "CacheUnreachable",
    "CachedCheckpointer",
    "CheckpointRepository",
    "Checkpointer",
    "Commit",
    "ConfigError",
    "ConnectionLost",
    "DatabaseUnavailable",
    "DeleteResult",
    "Health",
    "ImportConflict",
    "Imported",
    "InMemoryCheckpointer",
    "LangGraphBlob",
    "LangGraphCheckpoint",
    "LangGraphWrite",
    "LockTimeout",
    "MessageRecord",
    "PgCheckpointer",
    "SchemaNotReady",
    "SerializationError",
    "SqliteCheckpointer",
    "StaleStateError",
    "StateSnapshot",
    "StoreStats",
    "TableStats",
    "TenxStoreError",
    "ThreadExport",
    "ThreadInfo",
    "ThreadOwnershipError",
    "ToolExecution",
    "ToolExecutionClaimLost",
    "ToolExecutionInProgress",
    "ToolExecutionMismatch",
    "ToolExecutionNotFound",
    "UserStats",
    "parse_duration",
    "transaction_pooling_args",
]

try:
    __version__ = _metadata.version("tenxstore")
except _metadata.PackageNotFoundError:  # pragma: no cover - a checkout never installed
    __version__ = "0+unknown"
