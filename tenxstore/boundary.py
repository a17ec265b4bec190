"""The one error boundary: what leaves a public call is tenxstore's error, or yours.

Every public call of a checkpointer and of the LangGraph saver goes through
:func:`guard` (``telemetry.traced`` applies it). A failure of the database layer —
an error of SQLAlchemy or of a driver (asyncpg, sqlite3/aiosqlite, asyncmy) that the
backend did not translate, a broken socket — becomes
:class:`~tenxstore.errors.DatabaseError`, the original as its ``__cause__`` and
``cause``. What passes through as it is:

* tenxstore's own errors (the precise ones: ``ConnectionLost``, ``LockTimeout``...);
* the caller's own exceptions: a tool body's in ``arun_tool_once``, a progress or
  batch hook's — marked by :func:`callers_own` where they are raised;
* cancellation, ``KeyboardInterrupt`` and ``SystemExit``;
* anything else: an exception that is neither the database's nor the caller's is a
  bug of tenxstore, and a bug is not hidden behind a wrapper.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

from .errors import DatabaseError, TenxStoreError

__all__ = ["callers_own", "guard", "guard_iter", "translated"]

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])
_MARK = "_tenxstore_callers_own"


def callers_own(exc: BaseException) -> BaseException:
    """Mark an exception the caller's code raised (a tool body's, a hook's): the
    boundary lets it through unchanged, whatever its class. Returns it."""
    with contextlib.suppress(AttributeError, TypeError):  # every exception takes one
        setattr(exc, _MARK, True)
    return exc


def _of_the_database(exc: BaseException) -> bool:
    if isinstance(exc, TenxStoreError):
        return False
    if isinstance(exc, OSError):  # a socket broke under the driver
        return True
    # Here, not at the top: the backends import this boundary (through telemetry), and
    # a program may import the boundary first (the LangGraph saver does).
    from .backends.driver import DRIVER_PACKAGES

    module = type(exc).__module__ or ""
    return module.split(".", 1)[0] in DRIVER_PACKAGES


def translated(exc: BaseException) -> BaseException:
    """``exc`` as it may leave a public call (see the module)."""
    if not isinstance(exc, Exception) or getattr(exc, _MARK, False):
        return exc
    if _of_the_database(exc):
        return DatabaseError(exc)
    return exc


def guard(fn: _F) -> _F:
    """Wrap a public async method in the boundary."""

    @functools.wraps(fn)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(self, *args, **kwargs)
        except Exception as exc:
            out = translated(exc)
            if out is exc:
                raise
            raise out from exc

    return cast(_F, call)


_G = TypeVar("_G", bound=Callable[..., AsyncIterator[Any]])


def guard_iter(fn: _G) -> _G:
    """Wrap a public async generator method in the boundary."""

    @functools.wraps(fn)
    async def call(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        try:
            async for item in fn(self, *args, **kwargs):
                yield item
        except Exception as exc:
            out = translated(exc)
            if out is exc:
                raise
            raise out from exc

    return cast(_G, call)
