"""What a driver's failure means to the caller: a connection that could not be
opened, a connection lost before or during COMMIT, a lock wait that ran out, a
deadlock, a cancelled statement, a write refused by a read-only server — each as
tenxstore's typed error, saying whether anything was written, logged and counted.

:class:`Failures` is a part of every :class:`~tenxstore.backends.base.Backend`; each
database mode says which of its driver's errors are which (``is_lock_timeout``,
``is_deadlock``, ``is_cancelled``, ``is_read_only``).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import ClassVar

from sqlalchemy.exc import DBAPIError

from .. import telemetry
from ..errors import (
    ConnectionLost,
    DatabaseUnavailable,
    Deadlock,
    LockTimeout,
    StatementCancelled,
    TenxStoreError,
)
from .codes import refusal

__all__ = ["Failures"]

log = logging.getLogger("tenxstore.backends.base")  # one logger for a backend's messages


class Failures(ABC):
    """How a backend's driver errors become tenxstore's (see the module)."""

    name: ClassVar[str]
    lock_timeout: float | None

    @abstractmethod
    def describe(self) -> str:
        """The database's URL without its password or driver, for messages."""

    def opening_failed(self, exc: BaseException) -> TenxStoreError:
        """A failure to open a connection as tenxstore's error, by class and SQLSTATE."""
        where = self.describe()
        why = refusal(exc)
        if why is None:
            return ConnectionLost(
                f"the connection to {where} broke while it was being opened "
                f"({type(exc).__name__}); nothing was written"
            )
        log.warning("cannot use the database %s: %s", where, why)
        return DatabaseUnavailable(f"cannot use the database {where}: {why}")

    @abstractmethod
    def is_lock_timeout(self, exc: DBAPIError) -> bool:
        """Whether a driver error is a lock wait that ran out."""

    def translate(self, exc: DBAPIError, committing: bool) -> Exception:
        """A driver error as the caller's error, by class and SQLSTATE/SQLite code."""
        if exc.connection_invalidated:
            if committing:
                return self.lost(
                    ConnectionLost(
                        "the connection was lost during COMMIT; the write may have been "
                        "applied: re-read the thread before writing again",
                        committed=None,
                    )
                )
            return self.lost(
                ConnectionLost("the connection was lost before COMMIT; nothing was written")
            )
        if self.is_deadlock(exc) and not committing:
            return self.deadlocked()
        if self.is_read_only(exc):
            return self.read_only()
        if self.is_lock_timeout(exc):
            return self.lock_timed_out()
        if self.is_cancelled(exc):
            return self.cancelled(committing)
        return exc

    def is_deadlock(self, exc: DBAPIError) -> bool:
        """Whether the server broke a deadlock by rolling this transaction back."""
        return False

    def is_read_only(self, exc: DBAPIError) -> bool:
        """Whether the server refused a write because it is read-only (a standby)."""
        return False

    def read_only(self) -> DatabaseUnavailable:
        """A write refused by a read-only server (logged as a WARNING)."""
        where = self.describe()
        log.warning("the database %s is read-only (a standby?): a write was refused", where)
        return DatabaseUnavailable(
            f"cannot write to the database {where}: it is read-only (a standby, or a primary "
            "being demoted); nothing was written. Point the URL at the primary, or name every "
            "node with target_session_attrs=read-write (postgresql://u@h1:5432,h2:5432/db)"
        )

    def deadlocked(self) -> Deadlock:
        """A deadlock: the server rolled the transaction back (nothing was written)."""
        log.warning("a write on %s was chosen as a deadlock victim", self.describe())
        return Deadlock(
            "the write deadlocked with another one and was rolled back; nothing was "
            "written: retrying is safe"
        )

    def is_cancelled(self, exc: DBAPIError) -> bool:
        """Whether the server cancelled the statement (an operator's cancel or kill of
        the query, a statement timeout) and kept the connection."""
        return False

    def cancelled(self, committing: bool) -> StatementCancelled:
        """The error of a statement the server cancelled (logged as a WARNING)."""
        log.warning("the database %s cancelled a statement", self.describe())
        if committing:
            return StatementCancelled(
                "the database cancelled COMMIT; the write may have been applied: re-read "
                "the thread before writing again",
                committed=None,
            )
        return StatementCancelled(
            "the database cancelled the statement (a kill of the query, a statement "
            "timeout); nothing was written: retrying is safe"
        )

    def lost(self, error: ConnectionLost) -> ConnectionLost:
        """``error``, logged (a WARNING: a connection the database or the network
        dropped) and counted."""
        telemetry.connection_lost(log, self.name, error.committed)
        return error

    def lock_timed_out(self) -> LockTimeout:
        """The error of a write that waited longer than ``lock_timeout``."""
        wait = "forever" if self.lock_timeout is None else f"{self.lock_timeout:g}s"
        telemetry.lock_timed_out(log, self.name, wait)
        return LockTimeout(
            f"waited more than {wait} for the lock of the thread or memory it writes "
            "(another writer holds it); nothing was written"
        )
