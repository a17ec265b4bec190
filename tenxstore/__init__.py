"""tenxstore: durable, versioned, per-user persistence for AI-agent threads."""

import logging as _logging
from importlib import metadata as _metadata

from .backends import transaction_pooling_args
from .backends.retry import RetryPolicy
from .cache import CachedCheckpointer
from .config import read_source
from .crypto import KeyRing, Life
from .errors import (
    CacheUnreachable,
    ConfigError,
    ConnectionLost,
    DatabaseError,
    DatabaseUnavailable,
    Deadlock,
    DecryptionError,
    EmbeddingError,
    ImportConflict,
    LockTimeout,
    MemoryNotFound,
    MissingExtra,
    MissingThreadId,
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
from .memory.bulk import NewMemory
from .memory.store import MemoryStore
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
    Memory,
    MemoryHit,
    MessageRecord,
    ReadSource,
    ReplicaHealth,
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
    "DatabaseError",
    "DatabaseUnavailable",
    "Deadlock",
    "DecryptionError",
    "DeleteResult",
    "EmbeddingError",
    "Health",
    "ImportConflict",
    "Imported",
    "InMemoryCheckpointer",
    "KeyRing",
    "LangGraphBlob",
    "LangGraphCheckpoint",
    "LangGraphWrite",
    "Life",
    "LockTimeout",
    "Memory",
    "MemoryHit",
    "MemoryNotFound",
    "MemoryStore",
    "MessageRecord",
    "MissingExtra",
    "MissingThreadId",
    "NewMemory",
    "PgCheckpointer",
    "ReadSource",
    "ReplicaHealth",
    "RetryPolicy",
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
    "read_source",
    "transaction_pooling_args",
]

# A library never configures logging: its records go wherever the application sends
# them, and nowhere ("No handlers could be found") when it sends them nowhere.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

try:
    __version__ = _metadata.version("tenxstore")
except _metadata.PackageNotFoundError:  # pragma: no cover - a checkout never installed
    __version__ = "0+unknown"
