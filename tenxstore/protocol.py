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
        """Claim a tool call (:meth:`ToolLedger.abegin_tool_execution`)."""

    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any, *, attempt: int | None = None
    ) -> ToolExecution:
        """Record a tool call's result; the first success wins. Pass the claim's
        ``attempts`` as ``attempt`` (:meth:`ToolLedger.acomplete_tool_execution`)."""

    async def afail_tool_execution(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        error: str | BaseException,
        *,
        attempt: int | None = None,
    ) -> ToolExecution:
        """Record a tool call's failure (a succeeded call keeps its success). Pass the
        claim's ``attempts`` as ``attempt`` (:meth:`ToolLedger.afail_tool_execution`)."""

    async def aget_tool_execution(
        self, config: dict[str, Any], tool_call_id: str
    ) -> ToolExecution | None:
        """The ledger record of a tool call, or None (also for another user's thread)."""

    async def arun_tool_once(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        tool_name: str,
        args: dict[str, Any],
        fn: Callable[..., Any],
    ) -> Any:
        """Run ``fn(**args)`` at most once per live claim; replay the stored result after.

        Once one run has succeeded, every later call — in any process, after any
        restart — returns the stored result without calling ``fn``. If ``fn`` raises,
        the failure is recorded and the exception re-raised; the next call claims the
        tool again. A call cancelled while ``fn`` runs gives its claim back (recorded
        as a failure) so the next call can claim at once; once ``fn`` has returned,
        its outcome is recorded even if the call is cancelled meanwhile. Across an
        expired lease the body may run again (at-least-once).

        Returns:
            The recorded result (as stored: JSON, so tuples come back as lists).

        Raises:
            ToolExecutionInProgress: Another worker is running this call now.
            ToolExecutionClaimLost: ``fn`` ran, but its lease expired and another
                worker's claim is live: that worker's outcome will be recorded.
            SerializationError: ``fn`` returned something that is not JSON. It has
                run: the call is recorded as succeeded without a result, and every
                later call raises this again without running ``fn``.
        """

    async def alist_tool_executions(self, config: dict[str, Any]) -> list[ToolExecution]:
        """Every tool call of the thread, in the order they were first claimed."""

    def aiter_threads(self, batch: int = 500) -> AsyncIterator[ThreadInfo]:
        """Every thread of every user, in ``thread_id`` order, read ``batch`` at a time."""

    async def aexport_thread(self, config: dict[str, Any]) -> ThreadExport | None:
        """Everything stored of one thread, read in one snapshot; None when absent
        (or another user's while isolation applies)."""

    async def aimport_thread(
        self,
        export: ThreadExport,
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> ImportOutcome:
        """Write an exported thread back, in one transaction (see
        :meth:`ThreadExports.aimport_thread`)."""

    async def aimport_threads(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[ImportOutcome]:
        """Write exported threads back in ONE transaction; any error writes nothing (see
        :meth:`ThreadExports.aimport_threads`)."""

    async def aimport(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """:meth:`aimport_threads`, returning what each import did (with the life it
        replaced), as a cache needs to know it."""

    async def aimport_stream(
        self,
        source: Callable[[], Iterable[tuple[str | None, ThreadExport]]],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """Import exports read twice from ``source`` — checked, then written in ONE
        transaction — with memory bounded by the largest thread (see
        :meth:`ThreadExports.aimport_stream`)."""

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
        """Erase a user: delete every thread ``user_id`` owns, with its states,
        messages, tool executions and LangGraph checkpoints, writes and values, and
        every long-term memory of the user with its history (after the threads, in
        batches of ``batch_size`` memories).

        Works in batches of ``batch_size`` threads, each its own short transaction
        that locks its threads, deletes them whole and commits: a thread is either
        whole or gone, never half deleted. After a crash, call it again: it deletes
        what is left. It ends when a pass finds no thread of the user; a thread the
        application creates for the user after that pass is a new thread (stop the
        user's sessions first). A run that read one of the threads before it was
        deleted can never write into it again (``StaleStateError``).

        Args:
            user_id: The user (validated as ``config["user_id"]`` is).
            batch_size: Threads per transaction (1 to 5000).
            dry_run: Delete nothing; count what would go, with a ``sample``.
            sample: Threads listed in a dry run's result.
            on_batch: Called after each batch commits with the totals so far (sync or
                async); if it raises, the call stops there.
            before_commit: Awaited inside each batch's transaction before it commits,
                with the threads it deletes (a cache decorator fences them here).

        Returns:
            The rows deleted, by kind (:class:`DeleteResult`).

        Raises:
            ConfigError: A bad ``user_id``, ``batch_size`` or ``sample``.
            LockTimeout: A thread stayed locked by a writer longer than
                ``lock_timeout``; the batches before it are done (call again).
        """

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
        """Retention: delete every thread (of every user) not used for ``older_than``.

        A thread is idle when neither its record nor its state was written since
        then (``updated_at``), no LangGraph checkpoint was written and no tool call
        was claimed or finished. Each batch locks its threads and asks again under
        the lock, so a thread used while the prune runs is kept (``skipped``).
        Batched, resumable and with ``on_batch`` / ``before_commit`` as
        :meth:`adelete_user`.

        Args:
            older_than: The idle time, e.g. ``timedelta(days=90)``
                (:func:`tenxstore.parse_duration` reads ``"90d"``).
            batch_size: Threads per transaction (1 to 5000).
            dry_run: Delete nothing; count what would go, with a ``sample`` of the
                least recently updated threads.
            sample: Threads listed in a dry run's result.
            on_batch: Called after each batch commits with the totals so far.
            before_commit: Awaited inside each batch's transaction before it commits.
            include_memories: Also delete the long-term memories (of every user) not
                written for ``older_than``, with their history; without it memories
                are left alone (they are meant to outlive threads).

        Raises:
            ConfigError: ``older_than`` is not a positive ``timedelta``, or a bad
                ``batch_size`` or ``sample``.
        """

    async def astats(self, *, top: int = 10, exact: bool = False) -> StoreStats:
        """What the store holds: threads, the ``top`` users by threads (with their
        states, messages, tool calls and checkpoints, counted exactly), each table's
        and its indexes' bytes, dead rows (PostgreSQL), the database's size.

        Args:
            top: How many users to list (0 to 10000).
            exact: Count each table's rows on PostgreSQL too (a scan of each table)
                instead of taking the statistics' estimate.
        """
