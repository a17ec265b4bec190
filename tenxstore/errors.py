"""The tenxstore error tree.

Every error the library raises on purpose derives from :class:`TenxStoreError`.
Errors that describe bad input also derive from the matching built-in class
(``ValueError``, ``TypeError``, ``PermissionError``, ``LookupError``) so callers
that already catch those keep working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CacheUnreachable",
    "ConfigError",
    "ConnectionLost",
    "DatabaseError",
    "DatabaseUnavailable",
    "Deadlock",
    "DecryptionError",
    "EmbeddingError",
    "ImportConflict",
    "LockTimeout",
    "MemoryNotFound",
    "MissingExtra",
    "MissingThreadId",
    "SchemaNotReady",
    "SerializationError",
    "StaleStateError",
    "StatementCancelled",
    "TenxStoreError",
    "ThreadOwnershipError",
    "ToolExecutionClaimLost",
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

        replaced: The thread was deleted (and written again) or replaced by an import
            since the run read it: its versions are a new life's, whatever they are.

    ``message`` replaces the standard message when the caller knows more.

    For LangGraph checkpoints (:mod:`tenxstore.langgraph`) the two are checkpoint ids:
    the head the run saw when it read (or the parent it wrote from), and the
    namespace's newest checkpoint.
    """

    def __init__(
        self,
        thread_id: Any,
        expected_version: int | str,
        actual_version: int | str,
        replaced: bool = False,
        *,
        message: str | None = None,
    ) -> None:
        checkpoints = isinstance(expected_version, str) or isinstance(actual_version, str)
        if message is not None:
            pass  # said by the caller, who knows more (a checkpoint pruned, not replaced)
        elif replaced:
            message = (
                f"thread {thread_id!r} was deleted or replaced after this run read it at "
                f"{'checkpoint' if checkpoints else 'version'} {expected_version}; it is "
                f"now another thread: re-read before writing"
            )
        elif checkpoints:
            message = (
                f"thread {thread_id!r}: another run committed checkpoint {actual_version} "
                f"after this run read the thread at {expected_version}; two runs from one "
                "head cannot both commit: run again with the same input, its messages "
                "carrying ids (tenxstore.langgraph.ainvoke_retrying does both), so each "
                "message is stored once"
            )
        else:
            message = (
                f"thread {thread_id!r} is at version {actual_version}, not "
                f"{expected_version}: another run committed first; re-read and retry"
            )
        super().__init__(message)
        self.thread_id = thread_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        self.replaced = replaced

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.thread_id, self.expected_version, self.actual_version, self.replaced)
        return (_rebuild_stale, (*args, str(self)))


class ConfigError(TenxStoreError, ValueError):
    """A run config, id or constructor argument is missing or invalid."""


class MissingExtra(ConfigError, ImportError):
    """What was asked for needs an optional extra that is not installed.

    Raised where it is asked for (a ``mysql://`` URL, ``keys=``, the LangGraph saver's
    import...), before any I/O. An ``ImportError`` too, so that code which imported an
    optional part inside ``try: ... except ImportError`` keeps working.

    Attributes:
        extra: The extra that brings it (``pip install "tenxstore[<extra>]"``).
        modules: The modules that could not be found.
    """

    def __init__(self, message: str, extra: str = "", modules: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.extra = extra
        self.modules = modules

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.extra, self.modules))


class MissingThreadId(ConfigError, KeyError):
    """A config with no usable ``thread_id`` was given to a call that acts on a thread.

    Raised before any I/O: nothing was read or written. "No usable" covers a key that
    is absent, ``None`` or empty, and — for the LangGraph saver — one given only where
    LangGraph does not read it (outside ``config["configurable"]``). A ``KeyError``
    too, as LangGraph's own savers raise ``KeyError('thread_id')`` for it.

    Attributes:
        key: The missing key (``"thread_id"``).
    """

    def __init__(self, message: str, key: str = "thread_id") -> None:
        super().__init__(message)
        self.key = key

    def __str__(self) -> str:
        # KeyError's str() is the repr of its argument (quoted); this is a sentence.
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.key))


class MemoryNotFound(TenxStoreError, KeyError):
    """:meth:`~tenxstore.MemoryStore.aupdate` of a memory that is not there: never
    stored, deleted, expired, or another user's (which reads as absent).

    Attributes:
        key: The memory's key.
        namespace: Its namespace.
    """

    def __init__(self, key: Any, namespace: tuple[str, ...] = ("memories",)) -> None:
        super().__init__(f"no memory {key!r} in namespace {namespace!r}")
        self.key = key
        self.namespace = namespace

    def __str__(self) -> str:
        # KeyError's str() is the repr of its argument (quoted); this is a sentence.
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.namespace))


class SchemaNotReady(ConfigError):
    """The database has no tenxstore schema, or an older one than this release needs.

    Run ``await checkpointer.asetup()`` (or ``checkpointer.setup()``, or
    ``tenxstore upgrade --url ...``) once before the first call.
    """


class DatabaseUnavailable(TenxStoreError, ConnectionError):
    """The database could not be reached or refused the connection; nothing was written.

    The message names host, port and database (never the password) and what failed:
    refused, unknown host, authentication, no such database, timed out.
    """


class DatabaseError(TenxStoreError):
    """The database or its driver failed in a way tenxstore has no precise error for.

    The driver's error is ``cause`` (``__cause__`` is the exception as it arrived,
    perhaps SQLAlchemy's wrapper of it): log it. The message names only its
    class and code (a driver's message may quote the values of a statement). Whether
    a write was applied is not known (``committed`` is None): read before writing
    again.

    Attributes:
        cause: The driver's (or SQLAlchemy's) exception.
        committed: None: not known whether a write was applied.
    """

    def __init__(self, cause: BaseException) -> None:
        for _ in range(4):  # the driver's own, from under SQLAlchemy's wrappers
            inner = getattr(cause, "orig", None)
            if inner is None and type(cause).__module__.startswith("sqlalchemy"):
                inner = cause.__cause__
            if not isinstance(inner, BaseException):
                break
            cause = inner
        kind = type(cause)
        code = (
            getattr(cause, "sqlstate", None)
            or getattr(cause, "pgcode", None)
            or getattr(getattr(cause, "orig", None), "sqlstate", None)
            or getattr(cause, "sqlite_errorname", None)
            or getattr(cause, "errno", None)
        )
        where = f" ({code})" if isinstance(code, (str, int)) and code else ""
        super().__init__(
            f"the database failed: {kind.__module__}.{kind.__qualname__}{where}; whether a "
            "write was applied is not known: read the thread before writing again"
        )
        self.cause = cause
        self.committed: bool | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_database_error, (str(self),))


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


class EmbeddingError(TenxStoreError):
    """The embedding of a :class:`~tenxstore.MemoryStore` raised, or returned something
    that is not one vector of its ``dims`` finite numbers per text; nothing was written.

    Attributes:
        model_id: The embedding's model id.
    """

    def __init__(self, message: str, model_id: str = "") -> None:
        super().__init__(message)
        self.model_id = model_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.model_id))


class DecryptionError(TenxStoreError):
    """A stored value does not decrypt: tampered, sealed under a key not in the key
    ring, or moved from another thread or column. Never garbage, never plaintext.

    Attributes:
        thread_id: The thread the value was read for.
        column: Where it was read (``states.state_data``, ``cache``...).
        key_id: The key id its envelope names (None when it names none).
    """

    def __init__(self, thread_id: Any, column: str, key_id: str | None, reason: str) -> None:
        self.thread_id = thread_id
        self.column = column
        self.key_id = key_id
        super().__init__(
            f"cannot decrypt {column} of thread {thread_id!r} (key id {key_id!r}): {reason}"
        )


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
    """A write waited longer than ``lock_timeout`` for its thread's or memory's row lock;
    nothing was written."""


class Deadlock(LockTimeout):
    """The database chose the write as a deadlock's victim and rolled it back whole;
    nothing was written, and retrying is safe (the memory store's writes retry it
    themselves a few times)."""


class StatementCancelled(TenxStoreError, TimeoutError):
    """The database cancelled a statement of the call: an operator's ``KILL QUERY`` /
    ``pg_cancel_backend``, a server-side statement timeout (``statement_timeout``,
    ``max_statement_time``, ``max_execution_time``).

    The connection is fine and the call's transaction was rolled back. ``committed``
    says what is known of a write, as for :class:`ConnectionLost`: ``False`` (nothing
    was written: retrying is safe), ``None`` when COMMIT itself was cancelled (re-read
    the thread before writing again).
    """

    def __init__(self, message: str, committed: bool | None = False) -> None:
        super().__init__(message)
        self.committed = committed

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.committed))


class ImportConflict(TenxStoreError):
    """An imported thread exists with other content; nothing was written.

    Attributes:
        thread_id: The thread in conflict (None when not known).
    """

    def __init__(self, message: str, thread_id: Any = None) -> None:
        super().__init__(message)
        self.thread_id = thread_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.thread_id))


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


class ToolExecutionClaimLost(TenxStoreError):
    """An outcome arrived from a claim that is no longer the call's live claim.

    The worker's lease expired and another worker took the call over (or the call
    was claimed again after a failure), or the thread was deleted or replaced since
    the claim (``replaced``: the call now belongs to another life of the thread). The
    outcome changed nothing; a late success is still recorded when no success exists
    and no live claim would be overwritten.

    Attributes:
        thread_id: The thread.
        tool_call_id: The call.
        attempt: The claim the outcome came from.
        current_attempt: The call's claim now.
        replaced: The claim belonged to a life of the thread that is gone.
    """

    def __init__(
        self,
        thread_id: Any,
        tool_call_id: str,
        attempt: int,
        current_attempt: int,
        replaced: bool = False,
    ):
        why = (
            "the thread was deleted or replaced since that claim"
            if replaced
            else f"the call is at attempt {current_attempt}"
        )
        super().__init__(
            f"tool call {tool_call_id!r} of thread {thread_id!r}: attempt {attempt} lost its "
            f"claim ({why}); its outcome was not recorded"
        )
        self.thread_id = thread_id
        self.tool_call_id = tool_call_id
        self.attempt = attempt
        self.current_attempt = current_attempt
        self.replaced = replaced

    def __reduce__(self) -> tuple[Any, ...]:
        args = (
            self.thread_id,
            self.tool_call_id,
            self.attempt,
            self.current_attempt,
            self.replaced,
        )
        return (type(self), args)


class CacheUnreachable(TenxStoreError):
    """A bulk delete (an erase, a prune) could not fence the cache entries of a batch:
    Redis did not answer. That batch was rolled back (nothing of it deleted; the
    batches before it are done); run the call again once Redis answers."""


def _rebuild_stale(
    thread_id: Any, expected: int | str, actual: int | str, replaced: bool, message: str
) -> StaleStateError:
    """Unpickle a StaleStateError with the message it was raised with."""
    return StaleStateError(thread_id, expected, actual, replaced, message=message)


def _rebuild_database_error(message: str) -> TenxStoreError:
    """Unpickle a DatabaseError (its cause stays behind: it may not pickle)."""
    error = DatabaseError.__new__(DatabaseError)
    TenxStoreError.__init__(error, message)
    error.cause, error.committed = None, None  # type: ignore[assignment]
    return error
