"""What a one-step state write whose connection broke mid-flight did.

A one-step write (:meth:`~tenxstore.backends.base.Backend.commit_head`: one round trip
that commits) whose link breaks may have committed or not. Each stores a random
``write_id`` in the state row it inserts; once the server session that ran it is
ended and gone (so it cannot commit later), the backend reads, on a fresh connection,
the thread's head and whether the version after the one the write expected is the
row holding that ``write_id`` — and :func:`after_a_lost_write` says what that means.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from .. import telemetry
from ..errors import ConnectionLost
from .failures import log
from .records import Head, HeadWrite

if TYPE_CHECKING:
    from .failures import Failures

__all__ = ["after_a_lost_write", "new_write_id", "to_the_end", "unknown_outcome"]

_T = TypeVar("_T")


def new_write_id() -> int:
    """A random positive 63-bit number: one write's mark in the row it stores."""
    return secrets.randbits(63)


def unknown_outcome() -> ConnectionLost:
    """The error of a write whose outcome cannot be told."""
    return ConnectionLost(
        "the connection was lost while the write ran, and what it did cannot be told: "
        "it may have been applied; re-read the thread before writing again",
        committed=None,
    )


def after_a_lost_write(failures: Failures, write: HeadWrite, seen: Any) -> Head | None:
    """The outcome of a lost one-step write, from ``seen``: the thread's (version,
    incarnation, owner, whether its own state row is there), read once the session
    that ran it is gone; None when the thread is not there.

    Its row there: it committed (later writes may have followed), and its head is
    returned. Not there, and the thread still at the version it expected in the same
    life: ConnectionLost with ``committed=False`` (never replayed: the caller decides).
    Not there, and the thread moved so far that its row may have been pruned since:
    the outcome is unknown (``committed=None``). Otherwise (another writer came first,
    the thread was replaced or is gone) None: the repository's locked path then raises
    the precise error.
    """
    expected = write.expected
    assert expected is not None
    if seen is None:
        return None  # the thread is gone
    version, incarnation, owner, applied = seen
    if applied:
        telemetry.connection_lost(log, failures.name, True)
        return Head(expected + 1, incarnation, owner, None)
    same_life = write.incarnation is None or incarnation == write.incarnation
    if version == expected and same_life:
        raise failures.lost(
            ConnectionLost(
                "the connection was lost while the write ran; it was not applied: "
                "nothing was written",
                committed=False,
            )
        )
    if same_life and version - write.history_limit >= expected + 1:
        raise failures.lost(unknown_outcome())  # its row may have been pruned since
    return None


async def to_the_end(work: Awaitable[_T]) -> _T:
    """``work`` run to its end even when the caller is cancelled meanwhile; the
    cancellation is raised once it has ended. What makes sure a write cannot commit
    after its call has ended (ending its server session, looking at what it did, a
    ROLLBACK) must not itself be cut short by the caller's cancellation."""
    task = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            cancelled = exc
        except Exception:
            break  # its own error: raised below
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is what the caller gets
        raise cancelled
    return task.result()
