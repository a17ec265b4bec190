"""tenxstore: durable, versioned, per-user persistence for AI-agent threads.

``import tenxstore`` loads the errors and the value types; every other public name is
imported from its module when first asked for, so that a program pays for what it
uses: SQLAlchemy and its driver when it opens a store, Redis when it asks for the
cache, the memory store and LangGraph when it uses them, Alembic when it migrates.
"""

from __future__ import annotations

import logging as _logging
from typing import TYPE_CHECKING

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
from .lazy import lazy_names
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

if TYPE_CHECKING:
    from .backends import transaction_pooling_args
    from .backends.retry import RetryPolicy
    from .cache import CachedCheckpointer
    from .config import read_source
    from .crypto import KeyRing, Life
    from .lifecycle import DeleteResult, parse_duration
    from .memory.bulk import NewMemory
    from .memory.store import MemoryStore
    from .presets import InMemoryCheckpointer, PgCheckpointer, SqliteCheckpointer
    from .protocol import Checkpointer
    from .repository import CheckpointRepository
    from .stats import StoreStats, TableStats, UserStats

# Each lazily loaded public name, and the module it lives in.
_ROOMS = {
    "CachedCheckpointer": "cache",
    "CheckpointRepository": "repository",
    "Checkpointer": "protocol",
    "DeleteResult": "lifecycle",
    "InMemoryCheckpointer": "presets",
    "KeyRing": "crypto",
    "Life": "crypto",
    "MemoryStore": "memory.store",
    "NewMemory": "memory.bulk",
    "PgCheckpointer": "presets",
    "RetryPolicy": "backends.retry",
    "SqliteCheckpointer": "presets",
    "StoreStats": "stats",
    "TableStats": "stats",
    "UserStats": "stats",
    "parse_duration": "lifecycle",
    "read_source": "config",
    "transaction_pooling_args": "backends",
}

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


def _version() -> str:
    """The installed distribution's version (read when first asked for)."""
    from importlib import metadata

    try:
        return metadata.version("tenxstore")
    except metadata.PackageNotFoundError:  # pragma: no cover - a checkout never installed
        return "0+unknown"


if TYPE_CHECKING:
    __version__: str
else:
    __getattr__, __dir__ = lazy_names(__name__, _ROOMS, globals(), {"__version__": _version})

# A library never configures logging: its records go wherever the application sends
# them, and nowhere ("No handlers could be found") when it sends them nowhere.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())
