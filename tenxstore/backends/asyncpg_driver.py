"""asyncpg itself: its connections opened whole even when the caller is cancelled, and
what an asyncpg error says (its own exception under SQLAlchemy's, a statement it
refused to send, a connection that broke mid-statement)."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from .driver import causes

__all__ = ["asyncpg_error", "lost_error", "open_uninterrupted", "unsent_error"]


async def _open_asyncpg(*args: Any, **kwargs: Any) -> Any:
    """An asyncpg connection whose opening a cancelled caller never interrupts.

    asyncpg first asks the server for TLS (``sslmode=prefer``, its default); an
    opening cancelled once the TCP connection is made leaves asyncpg's future of that
    answer with an error nobody retrieves: asyncio logs "Future exception was never
    retrieved ... unexpected connection_lost() call" for each (hundreds under calls
    cancelled by ``wait_for``). So the opening runs to its end in a task of its own:
    the cancelled caller leaves at once, and the connection it no longer wants is
    closed as soon as it is open.
    """
    import asyncpg

    opening = asyncio.ensure_future(asyncpg.connect(*args, **kwargs))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_drop_opened)
        raise


def _drop_opened(opening: asyncio.Future[Any]) -> None:
    """Close a connection opened for a caller that was cancelled meanwhile."""
    if not opening.cancelled() and opening.exception() is None:  # failed: nothing to close
        opening.result().terminate()  # never used: nothing to end on the server first


def open_uninterrupted(engine: Engine) -> None:
    """Every asyncpg connection the engine opens goes through :func:`_open_asyncpg`."""

    @event.listens_for(engine, "do_connect")
    def _do_connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        return dialect.dbapi.connect(*cargs, async_creator_fn=_open_asyncpg, **cparams)


def asyncpg_error(exc: DBAPIError) -> BaseException | None:
    """asyncpg's own exception behind SQLAlchemy's (it sits under the adapter's)."""
    return next((e for e in causes(exc.orig, 4) if type(e).__module__.startswith("asyncpg")), None)


def unsent_error(exc: BaseException) -> bool:
    """asyncpg refused to send: its client-side InterfaceError (the connection was found
    closed) or InternalClientError (its protocol is not idle, as after the server
    dropped it): nothing reached the server."""
    from asyncpg.exceptions import PostgresError
    from asyncpg.exceptions._base import InterfaceError, InternalClientError

    client_side = isinstance(exc, (InterfaceError, InternalClientError))
    return client_side and not isinstance(exc, PostgresError)


def lost_error(exc: BaseException) -> bool:
    """The connection broke while a statement was in flight."""
    from asyncpg.exceptions import PostgresConnectionError

    return isinstance(exc, (PostgresConnectionError, ConnectionError, OSError))
