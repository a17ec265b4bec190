"""What a driver error means: SQLite's result codes, PostgreSQL's SQLSTATE, and why a
connection could not be opened.

Nothing here acts on an error; the backends (:mod:`tenxstore.backends.base` and the
modes' modules) classify a driver's error with these and raise tenxstore's own.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

from sqlalchemy.exc import DBAPIError

from .driver import causes

__all__ = [
    "OPENING_ERRORS",
    "SQLITE_BUSY",
    "SQLITE_CANTOPEN",
    "SQLITE_LOCKED",
    "refusal",
    "sqlite_code",
]

# SQLite's primary result codes that tenxstore acts on, and the messages SQLite gives
# them (sqlite3_errmsg: a locked table or schema may name itself after a colon).
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_CANTOPEN = 5, 6, 14
_SQLITE_MESSAGES = (
    ("database is locked", SQLITE_BUSY),
    ("database table is locked", SQLITE_LOCKED),
    ("database schema is locked", SQLITE_LOCKED),
    ("unable to open database file", SQLITE_CANTOPEN),
)
# What opening a connection may raise, whatever the driver (a mode adds its driver's
# own: SQLAlchemy 2.0, the line Python 3.10 gets, lets asyncpg's through unwrapped).
# The drivers are not imported here: a process imports only its database's, and an
# error of a driver it never imported cannot reach it (see _driver).
OPENING_ERRORS: tuple[type[BaseException], ...] = (DBAPIError, OSError, asyncio.TimeoutError)


def _driver(name: str) -> Any:
    """The driver module ``name`` if this process imported it, else None."""
    return sys.modules.get(name)


def sqlite_code(exc: BaseException | None) -> int | None:
    """SQLite's primary result code behind a :mod:`sqlite3` error, or None.

    Python 3.11+ gives it as ``sqlite_errorcode`` (perhaps extended: the low byte is
    the primary code); Python 3.10 gives only SQLite's message, which names the codes
    above exactly as SQLite words them."""
    sqlite3 = _driver("sqlite3")
    if sqlite3 is None or not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    message = str(exc)
    for words, primary in _SQLITE_MESSAGES:
        if message.startswith(words):
            return primary
    return None


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, wherever SQLAlchemy's wrapping put it."""
    for seen in causes(exc):
        code = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if isinstance(code, str):
            return code
    return None


_REFUSALS = {
    "3D000": "no such database: create it, or fix the database name in the URL",
    "28000": "authentication failed: no such role, or it may not log in (check the user)",
    "28P01": "authentication failed: wrong password",
    "57P03": "the server is starting up or shutting down: try again shortly",
    "53300": "the server has no connection slot left (max_connections): use a pooler",
}


def refusal(exc: BaseException) -> str | None:
    """Why a connection could not be opened, in words; None when an opened connection
    broke instead (that is ConnectionLost, not DatabaseUnavailable)."""
    if isinstance(exc, socket.gaierror):
        return "unknown host: check the host name in the URL"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused: is the server running, and on this host and port?"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timed out: the server does not answer (a firewall, a wrong host?)"
    asyncpg = _driver("asyncpg")
    if asyncpg is not None and any(
        isinstance(seen, asyncpg.TargetServerAttributeNotMatched) for seen in causes(exc)
    ):
        return (
            "no host of the URL is what target_session_attrs asks for (no primary now: "
            "a failover under way?): try again shortly"
        )
    state = _sqlstate(exc)
    if state in _REFUSALS:
        return _REFUSALS[state]
    if sqlite_code(getattr(exc, "orig", None)) == SQLITE_CANTOPEN:
        return "SQLite cannot open the file: does its directory exist, and may we write it?"
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
        return f"cannot connect ({exc.strerror or exc})"
    return None
