"""Ready-made checkpointers with the names and arguments of the product documents."""

from __future__ import annotations

import os
from typing import Any

from .errors import ConfigError
from .repository import CheckpointRepository

__all__ = ["InMemoryCheckpointer", "SqliteCheckpointer"]


class SqliteCheckpointer(CheckpointRepository):
    """Durable state and messages in one SQLite file, for single-machine agents.

    Args:
        path: The database file (created when absent).
        state_history_limit: State versions retained per thread.
        enforce_user_isolation: Scope every call to ``config["user_id"]``.
        tool_lease_seconds: Lease of a tool-call claim.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        state_history_limit: int = 20,
        enforce_user_isolation: bool = True,
        tool_lease_seconds: float = 900,
        **options: Any,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ConfigError(f"path must be a file path, not {path!r}")
        super().__init__(
            f"sqlite+aiosqlite:///{os.fspath(path)}",
            state_history_limit=state_history_limit,
            enforce_user_isolation=enforce_user_isolation,
            tool_lease_seconds=tool_lease_seconds,
            **options,
        )


class InMemoryCheckpointer(CheckpointRepository):
    """State in process memory (an in-memory SQLite database), for tests and development.

    Not durable: everything is lost when the process ends, and nothing is shared with
    other processes. The schema is created on first use.
    """

    def __init__(
        self,
        *,
        state_history_limit: int = 20,
        enforce_user_isolation: bool = True,
        tool_lease_seconds: float = 900,
    ) -> None:
        super().__init__(
            "sqlite+aiosqlite://",
            state_history_limit=state_history_limit,
            enforce_user_isolation=enforce_user_isolation,
            tool_lease_seconds=tool_lease_seconds,
        )
