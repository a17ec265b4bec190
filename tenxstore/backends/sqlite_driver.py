"""SQLite's driver plumbing: how aiosqlite and pysqlite connections are opened,
set up and closed, and what a SQLite error code means to the backends
(:mod:`.sqlite` and its hot path, :mod:`.sqlite_hotpath`)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import weakref
from typing import Any, cast

import aiosqlite
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine

from .base import timeout_ms
from .codes import SQLITE_BUSY, SQLITE_LOCKED, sqlite_code
from .connections import on_every_connection

__all__ = [
    "EndingConnection",
    "busy",
    "file_identity",
    "is_memory",
    "open_through_driver",
    "set_pragmas_on_connect",
]


def busy(exc: BaseException | None) -> bool:
    """Whether a SQLite error is a lock that another connection holds (busy or locked)."""
    return sqlite_code(exc) in (SQLITE_BUSY, SQLITE_LOCKED)


def is_memory(url: URL) -> bool:
    """Whether a SQLite URL names an in-memory database."""
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database


def set_pragmas_on_connect(engine: Engine, lock_timeout: float | None) -> None:
    """Every connection the engine opens: transactions ours (the driver's implicit ones
    off), foreign keys on, the busy timeout, and WAL for a file."""
    wait_ms = timeout_ms(lock_timeout)
    wal = not is_memory(engine.url)

    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={wait_ms}")
            if wal:
                _into_wal(cursor)
        finally:
            cursor.close()

    on_every_connection(engine, _on_connect)


class EndingConnection(sqlite3.Connection):
    """A pysqlite connection whose ``close()`` releases every lock it holds first.

    SQLAlchemy invalidates, and so closes, the connection of a call cancelled in the
    middle of a statement. SQLite closes a connection that still has a statement in
    progress (the cursor the cancelled call left mid-result) as a "zombie" that keeps
    its transaction, and so the file's write lock (or, in a shared-cache database, its
    table locks), until that statement is finalized: whenever the garbage collector
    frees the cursor. Every writer meanwhile waits out its ``lock_timeout``. So the
    close first resets the statements of its cursors and rolls back: the close is
    then a real one. It runs where the close runs: on the connection's own thread
    (aiosqlite's, or the hot path's worker).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cursors: weakref.WeakSet[sqlite3.Cursor] = weakref.WeakSet()

    def cursor(self, *args: Any, **kwargs: Any) -> Any:  # execute() makes its cursor here too
        made = super().cursor(*args, **kwargs)
        self._cursors.add(made)
        return made

    def close(self) -> None:
        try:
            for cursor in list(self._cursors):
                cursor.close()  # resets its statement: a read in progress holds locks too
            if self.in_transaction:
                self.rollback()
        except sqlite3.Error:
            pass  # closed already, or a broken file: close() is all that is left to do
        super().close()


def open_through_driver(engine: Engine) -> None:
    """Every aiosqlite connection the engine opens goes through :func:`_open_aiosqlite`,
    as an :class:`EndingConnection`."""

    @event.listens_for(engine, "do_connect")
    def _do_connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        cparams = {"factory": EndingConnection, **cparams}
        return dialect.dbapi.connect(*cargs, async_creator_fn=_open_aiosqlite, **cparams)


async def _open_aiosqlite(*args: Any, **kwargs: Any) -> Any:
    """An aiosqlite connection, opened; one that fails to open has ended its thread.

    aiosqlite's clean-up of a connection that failed to open (a folder where the file
    should be, a file we may not read) queues the stop of its thread without waiting:
    the thread then posts the stop's result to the caller's event loop. Raised at once,
    the error can end the caller and its loop first (a test's loop closes as the test
    ends), and the thread's post fails with "Event loop is closed" in that thread (what
    pytest reported at the end of the whole suite). So the error waits for the thread.
    """
    connection = aiosqlite.connect(*args, **kwargs)
    # The thread: aiosqlite 0.22 keeps it in ``_thread``; before, the connection was one.
    thread = cast(threading.Thread, getattr(connection, "_thread", connection))
    thread.daemon = True  # as SQLAlchemy sets it: a connection never closed ends with us
    try:
        return await connection
    except BaseException:
        if thread.is_alive():
            await asyncio.shield(asyncio.to_thread(thread.join))
        raise


def _into_wal(cursor: Any) -> None:
    """WAL is a property of the file: set it once. Switching needs the file to itself,
    so a process that races another one's switch (several processes setting up at
    once) accepts the file already in WAL rather than failing its connection."""
    if _journal_mode(cursor) == "wal":
        return
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError:
        if _journal_mode(cursor) != "wal":
            raise


def _journal_mode(cursor: Any) -> str:
    cursor.execute("PRAGMA journal_mode")
    return str(cursor.fetchone()[0]).lower()


def file_identity(path: str | None) -> str:
    """The database file's device and inode: the same by every path to it, different
    in a copy (an in-memory database has none)."""
    if not path:
        return ""
    found = os.stat(path)
    return f"{found.st_dev}:{found.st_ino}"
