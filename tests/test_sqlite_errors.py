"""SQLite's errors are told apart on every Python: by their code (3.11+) or, where
Python gives none (3.10), by SQLite's own message. A busy database must become
LockTimeout and an unopenable file DatabaseUnavailable on both."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tenxstore import CheckpointRepository, DatabaseUnavailable, LockTimeout
from tenxstore.backends.codes import SQLITE_BUSY, SQLITE_CANTOPEN, SQLITE_LOCKED, sqlite_code
from tests.conftest import cfg

SQLITE_ERROR = 1  # SQLite's generic error: a statement it refused


def raised(action: Callable[[], object]) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as caught:
        action()
    return caught.value


@pytest.fixture
def table(tmp_path: Path) -> Iterator[tuple[sqlite3.Connection, sqlite3.Connection]]:
    """Two connections to one file with a table of ten rows; no busy wait."""
    path = tmp_path / "errors.db"
    first = sqlite3.connect(path, isolation_level=None, timeout=0)
    second = sqlite3.connect(path, isolation_level=None, timeout=0)
    first.execute("CREATE TABLE t (x)")
    first.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
    yield first, second
    first.close()
    second.close()


def errors(
    tmp_path: Path, first: sqlite3.Connection, second: sqlite3.Connection
) -> list[tuple[sqlite3.Error, int | None]]:
    """Real errors from this interpreter's sqlite3, each with the code SQLite gave it."""
    first.execute("BEGIN IMMEDIATE")
    busy = raised(lambda: second.execute("BEGIN IMMEDIATE"))  # another holds the write lock
    first.execute("ROLLBACK")
    reading = first.execute("SELECT x FROM t")
    reading.fetchone()
    locked = raised(lambda: first.execute("DROP TABLE t"))  # a statement still reads it
    reading.close()
    cantopen = raised(lambda: sqlite3.connect(tmp_path / "no" / "such" / "x.db"))
    other = raised(lambda: first.execute("SELECT nope FROM t"))
    return [
        (busy, SQLITE_BUSY),
        (locked, SQLITE_LOCKED),
        (cantopen, SQLITE_CANTOPEN),
        (other, None),  # SQLITE_ERROR: a code tenxstore does not act on
    ]


def without_code(exc: sqlite3.Error) -> sqlite3.Error:
    """The same error as Python 3.10 raises it: its class and SQLite's message only."""
    bare = type(exc)(*exc.args)
    assert not hasattr(bare, "sqlite_errorcode")
    return bare


def test_each_code_is_read_from_the_error_or_its_message(
    tmp_path: Path, table: tuple[sqlite3.Connection, sqlite3.Connection]
) -> None:
    for exc, code in errors(tmp_path, *table):
        if hasattr(exc, "sqlite_errorcode"):  # Python 3.11+: the code itself
            assert sqlite_code(exc) == (SQLITE_ERROR if code is None else code), exc
        assert sqlite_code(without_code(exc)) == code, exc


def test_an_extended_code_is_its_primary_code() -> None:
    snapshot = sqlite3.OperationalError("database is locked")
    snapshot.sqlite_errorcode = SQLITE_BUSY | (2 << 8)  # type: ignore[attr-defined]  # SQLITE_BUSY_SNAPSHOT
    assert sqlite_code(snapshot) == SQLITE_BUSY


def test_what_is_not_a_sqlite_error_has_no_code() -> None:
    assert sqlite_code(None) is None
    assert sqlite_code(OSError("database is locked")) is None
    assert sqlite_code(sqlite3.OperationalError("the database is locked, says someone")) is None


async def test_a_busy_file_is_a_lock_timeout_on_every_path(tmp_path: Path) -> None:
    """The one-hop write, the SQLAlchemy transactions and the ledger all wait out
    ``lock_timeout`` and then raise LockTimeout, never sqlite3's own error."""
    path = tmp_path / "busy.db"
    repo = CheckpointRepository(f"sqlite:///{path}", lock_timeout=0.2)
    try:
        await repo.asetup()
        await repo.aput_state(cfg("t", "u"), {"n": 1})
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            calls = {
                "aput_state": repo.aput_state(cfg("t", "u"), {"n": "blocked"}),
                "aput_thread": repo.aput_thread(cfg("t", "u"), name="blocked"),
                "aclean_thread": repo.aclean_thread(cfg("t", "u")),
                "abegin_tool_execution": repo.abegin_tool_execution(
                    cfg("t", "u"), "call-1", "tool", {}
                ),
            }
            for name, call in calls.items():
                with pytest.raises(LockTimeout):
                    await asyncio.wait_for(call, 10)
                    pytest.fail(f"{name} was not refused")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert await repo.aget_state(cfg("t", "u")) == {"n": 1}  # nothing of them was written
        assert await repo.aget_tool_execution(cfg("t", "u"), "call-1") is None
    finally:
        await repo.aclose()


async def test_a_file_sqlite_cannot_open_is_database_unavailable(tmp_path: Path) -> None:
    """A directory where the file should be: SQLite's own "unable to open" refusal."""
    repo = CheckpointRepository(f"sqlite:///{tmp_path}")
    try:
        with pytest.raises(DatabaseUnavailable, match="SQLite cannot open the file"):
            await repo.asetup()
    finally:
        await repo.aclose()


async def test_a_file_that_fails_to_open_leaves_no_driver_thread_behind(tmp_path: Path) -> None:
    """aiosqlite's clean-up of a connection that failed to open stops its thread, which
    then posts to the caller's event loop: the open waits for that thread, so none is
    left to post to a loop that has closed (``Event loop is closed`` in the thread,
    which pytest charged to a later test or to the end of the whole run).

    Whether the thread got to run before the error reached the caller is a race, so
    the open fails 20 times, with this thread never made to yield its turn; without
    the wait, most of the 20 found the driver's thread still running."""

    def driver_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if "_connection_worker_thread" in t.name}

    before = driver_threads()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(10)  # the driver's thread runs only when this one waits
    try:
        for _ in range(20):
            repo = CheckpointRepository(f"sqlite:///{tmp_path}")  # a folder, not a file
            try:
                with pytest.raises(DatabaseUnavailable, match="SQLite cannot open the file"):
                    await repo.asetup()
                assert [t for t in driver_threads() - before if t.is_alive()] == []
            finally:
                await repo.aclose()
    finally:
        sys.setswitchinterval(interval)
