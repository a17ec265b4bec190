"""tenxstore: durable, versioned, per-user persistence for AI-agent threads."""

import logging as _logging
from importlib import metadata as _metadata

from .backends import transaction_pooling_args
from .cache import CachedCheckpointer
from .crypto import KeyRing
from .errors import (
    CacheUnreachable,
    ConfigError,
    ConnectionLost,
    DatabaseUnavailable,
    DecryptionError,
    ImportConflict,
    LockTimeout,
    SchemaNotReady,
    SerializationError,
    StaleStateError,
    StatementCancelled,
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
    "DecryptionError",
    "DeleteResult",
    "Health",
    "ImportConflict",
    "Imported",
    "InMemoryCheckpointer",
    "KeyRing",
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
    "StatementCancelled",
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

# A library never configures logging: its records go wherever the application sends
# them, and nowhere ("No handlers could be found") when it sends them nowhere.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

try:
    __version__ = _metadata.version("tenxstore")
except _metadata.PackageNotFoundError:  # pragma: no cover - a checkout never installed
    __version__ = "0+unknown"
