"""``Checkpointer``: the interface every tenxstore checkpointer has.

:class:`~tenxstore.CheckpointRepository`, :class:`~tenxstore.CachedCheckpointer` and
the presets satisfy it (checked by mypy where they are used as one); the cache
decorator wraps any object that does, and the LangGraph saver and the archive
functions accept any. It is a :class:`typing.Protocol`: satisfy it by shape, no
inheritance needed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from .langgraph.values import AllowedTypes
from .lifecycle import DEFAULT_BATCH_SIZE, DEFAULT_SAMPLE, BatchHook, DeleteResult, ProgressHook
from .stats import StoreStats
from .types import (
    Commit,
    Health,
    Imported,
    ImportOutcome,
    OnConflict,
    StateSnapshot,
    ThreadExport,
    ThreadInfo,
    ToolExecution,
)
from .validate import IdType

if TYPE_CHECKING:
    # named for the types of three properties only: the protocol imports no implementation
    from .crypto import KeyRing
    from .langgraph.tables import LangGraphTables
    from .store import Store

__all__ = ["Checkpointer"]


class Checkpointer(Protocol):
    """Durable, versioned, per-user thread storage (see the repository for each method)."""

    @property
    def state_history_limit(self) -> int:
        """State versions retained per thread."""

    @property
    def enforce_user_isolation(self) -> bool:
        """Whether calls are scoped to ``config["user_id"]`` unless an AuthPolicy says not."""

    @property
    def tool_lease_seconds(self) -> float:
        """Lease of a tool-call claim."""

    @property
    def id_type(self) -> IdType:
        """Type of ``thread_id``."""

    @property
    def user_id_type(self) -> IdType:
        """Type of ``user_id``."""

    @property
    def keys(self) -> KeyRing | None:
        """The key ring payloads are sealed with, or None (stored in clear)."""

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine (of the running event loop), for instrumentation."""

    @property
    def store(self) -> Store:
        """What the checkpointer's collaborators share: the backend, the statements and
        the steps of every write (for tenxstore's own modules, not applications)."""

    @property
    def langgraph(self) -> LangGraphTables:
        """The tables of the LangGraph saver."""

    def setup(self) -> None:
        """Migrate the schema to head, from sync or async code."""

    async def asetup(self) -> None:
        """Migrate the schema to head."""

    async def astore_id(self) -> str:
        """The random id naming this database and schema."""

    async def acheck(self) -> Health:
        """Check the database, its schema and the cache (never raises for what it finds)."""

    async def aclose(self) -> None:
        """Close what this checkpointer created."""

    async def aput_checkpoint(
        self,
        config: dict[str, Any],
        state: dict[str, Any],
        messages: Iterable[dict[str, Any]] = (),
        *,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Durable compare-and-swap write of a state and new messages."""

    async def acommit(
        self,
        config: dict[str, Any],
        state: dict[str, Any],
        messages: Iterable[dict[str, Any]] = (),
        *,
        meta: dict[str, Any] | None = None,
    ) -> Commit:
        """``aput_checkpoint`` returning what it did."""

    async def aput_state(
        self, config: dict[str, Any], state: dict[str, Any], *, meta: dict[str, Any] | None = None
    ) -> int:
        """Durable write without messages."""

    async def aget_state(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The latest durable state."""

    async def aget_state_cache(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The latest state, from the cache first when there is one."""

    async def aput_state_cache(
        self, config: dict[str, Any], state: dict[str, Any], version: int
    ) -> bool:
        """Cache-only write, guarded against older versions."""

    async def alist_states(
        self, config: dict[str, Any], limit: int | None = None
    ) -> list[StateSnapshot]:
        """Retained history, newest first."""

    async def aget_messages(
        self, config: dict[str, Any], limit: int | None = None, after_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Messages in insertion order."""

    async def aput_thread(
        self,
        config: dict[str, Any],
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ThreadInfo:
        """Create or update the thread record."""

    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """The thread record."""

    async def alist_threads(
        self, config: dict[str, Any], limit: int | None = 50, offset: int = 0
    ) -> list[ThreadInfo]:
        """The caller's threads, most recently updated first."""

    async def aclean_thread(self, config: dict[str, Any]) -> bool:
        """Delete the thread and everything of it."""

    async def adelete(self, config: dict[str, Any]) -> Commit | None:
        """``aclean_thread`` returning what was deleted."""

    async def abegin_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, tool_name: str, args: dict[str, Any]
    ) -> ToolExecution:
        """Claim a tool call."""

    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any, *, attempt: int | None = None
    ) -> ToolExecution:
        """Record a tool call's result."""

    async def afail_tool_execution(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        error: str | BaseException,
        *,
        attempt: int | None = None,
    ) -> ToolExecution:
        """Record a tool call's failure."""

    async def aget_tool_execution(
        self, config: dict[str, Any], tool_call_id: str
    ) -> ToolExecution | None:
        """The ledger record of a tool call."""

    async def arun_tool_once(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        tool_name: str,
        args: dict[str, Any],
        fn: Callable[..., Any],
    ) -> Any:
        """Replay-safe tool call."""

    async def alist_tool_executions(self, config: dict[str, Any]) -> list[ToolExecution]:
        """Every tool call of a thread."""

    def aiter_threads(self, batch: int = 500) -> AsyncIterator[ThreadInfo]:
        """Every thread of every user."""

    async def aexport_thread(self, config: dict[str, Any]) -> ThreadExport | None:
        """Everything stored of one thread."""

    async def aimport_thread(
        self,
        export: ThreadExport,
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> ImportOutcome:
        """Write an exported thread back."""

    async def aimport_threads(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[ImportOutcome]:
        """Write exported threads back, all or nothing."""

    async def aimport(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """``aimport_threads`` returning what each import did."""

    async def aimport_stream(
        self,
        source: Callable[[], Iterable[tuple[str | None, ThreadExport]]],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """Import exports read twice from ``source``: checked, then written, all or
        nothing, memory bounded by the largest thread."""

    async def adelete_user(
        self,
        user_id: Any,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        sample: int = DEFAULT_SAMPLE,
        on_batch: ProgressHook | None = None,
        before_commit: BatchHook | None = None,
    ) -> DeleteResult:
        """Erase every thread and memory of a user, in batches."""

    async def aprune_idle(
        self,
        older_than: timedelta,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        sample: int = DEFAULT_SAMPLE,
        on_batch: ProgressHook | None = None,
        before_commit: BatchHook | None = None,
        include_memories: bool = False,
    ) -> DeleteResult:
        """Delete the threads (``include_memories``: and memories) not used for
        ``older_than``, in batches."""

    async def astats(self, *, top: int = 10, exact: bool = False) -> StoreStats:
        """What the store holds."""
