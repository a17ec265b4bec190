"""MySQL's and MariaDB's hot path: the head read and the common state write, each ONE
prepared statement on a connection borrowed from SQLAlchemy's pool (asyncmy's binary
protocol: no client-side escaping of a state, no execution layer).

* The write is ``CALL tenx_commit_head(...)`` (the procedure migration 0013 creates):
  the compare-and-swap under the thread's row lock, the state (with a random
  ``write_id``), the new messages (one JSON array), the prune and COMMIT in one round
  trip; when the thread does not match, nothing is written and the repository takes
  its locked path (which creates threads and raises the precise error).
* Borrowed connections run in autocommit (set once as they are borrowed, unset before
  the pool gets them back): the read needs no COMMIT of its own, and the procedure
  opens and commits its transaction itself.
* A write whose link breaks mid-flight is looked into on a fresh connection: its
  server session is ended (``KILL``) and made sure of gone, then its ``write_id`` is
  looked for (:mod:`.lost_writes`): ``committed`` True (the call succeeds), False, or
  None when it cannot be told. A cancelled write ends its session the same way before
  the cancellation goes on: it cannot commit after the call has ended.
* A statement the server interrupted (``KILL QUERY``, ``max_statement_time``) is
  looked into on its own connection, since the procedure may have committed just
  before: the call then succeeds, or raises StatementCancelled (nothing written).
* No procedure (dropped, or left out of a dump restored without ``--routines``): logged
  once, and every write takes the locked path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import timezone
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import ConnectionLost
from .connections import Borrowed, DriverOps, borrow
from .driver import DriverStatement
from .lost_writes import after_a_lost_write, new_write_id, to_the_end, unknown_outcome
from .records import Head, HeadWrite

if TYPE_CHECKING:
    from .mysql import MysqlBackend

__all__ = ["MYSQL", "MysqlDriverOps", "MysqlHotPath"]

log = logging.getLogger("tenxstore.backends.base")  # one logger for a backend's messages

_COMMIT_HEAD = "CALL tenx_commit_head(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_NO_SUCH_PROCEDURE = 1305
#: Seconds a look into a lost write waits for the server to end its session.
END_WAIT_S = 5.0
_PREPARED = "_tenxstore_prepared"
_BOOTED = "tenxstore_booted"  # the server's start (epoch seconds) seen by a connection
_THREAD = "tenxstore_thread"
_SERVER = "tenxstore_server"  # the server as it names itself (a proxy may reach others)


class MysqlDriverOps(DriverOps):
    """asyncmy's connections, borrowed for hot statements in autocommit."""

    def closed(self, driver: Any) -> bool:
        return not driver.connected

    def in_transaction(self, driver: Any) -> bool:
        return bool(driver.get_transaction_status())

    async def lend(self, driver: Any) -> None:
        await driver.autocommit(True)

    async def back(self, driver: Any) -> None:
        await driver.autocommit(False)

    async def settle(self, driver: Any) -> None:
        # Never left mid-statement (a cancelled hot call ends its session instead).
        raise ConnectionLost("a MySQL connection is not reused after a cancelled statement")


MYSQL = MysqlDriverOps()


def _server_code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _link_broke(exc: BaseException, driver: Any) -> bool:
    """Whether the connection may be gone, or its statement's fate is not known: every
    error but one the server sent back (1000-1999, 3000 and up: the client library's
    own are 2000-2999), which leaves the connection as it was."""
    code = _server_code(exc)
    answered = code is not None and (1000 <= code < 2000 or code >= 3000)
    return not answered or not driver.connected


class MysqlHotPath:
    """The head read and the one-step state write of a :class:`MysqlBackend`."""

    def __init__(self, backend: MysqlBackend, sql: Any) -> None:
        self.backend = backend
        dialect = backend.engine.dialect
        self._read_any = _qmarks(DriverStatement(sql.head_state, dialect))
        self._read_own = _qmarks(DriverStatement(sql.head_state_of_user, dialect))
        t, s = sql.tables.threads, sql.tables.states
        self._look_sql = (
            f"SELECT t.version, t.incarnation, t.user_id, EXISTS (SELECT 1 FROM {s.name} s "
            "WHERE s.thread_id = t.thread_id AND s.version = %s AND s.write_id = %s) "
            f"FROM {t.name} t WHERE t.thread_id = %s"
        )
        self.procedure = True  # False once the server said it has none

    async def read_head(self, thread_id: Any, user_id: Any) -> Head | None:
        """One prepared SELECT (sent again once on a connection found broken)."""
        if user_id is None:
            rows = await self._run(self._read_any, (thread_id,), write=None)
        else:
            rows = await self._run(self._read_own, (thread_id, user_id), write=None)
        if not rows:
            return None
        row = rows[0]
        return Head(row[0], row[1], row[3], row[2])

    async def commit_head(self, write: HeadWrite) -> Head | None:
        """The common write as one prepared CALL, or None (the locked path then runs)."""
        if write.expected is None or not self.procedure:
            return None
        try:
            messages = orjson.dumps(
                [[m["message_id"], m["role"], m["payload"]] for m in write.messages]
            ).decode()
        except (TypeError, orjson.JSONEncodeError):
            return None  # the locked path refuses it as it refuses it everywhere
        now = write.now
        if now.tzinfo is not None:
            now = now.astimezone(timezone.utc).replace(tzinfo=None)
        args = (
            write.thread_id,
            write.user_id,
            int(write.owned),
            write.expected,
            write.incarnation,
            write.state,
            write.meta,
            now,
            messages,
            write.history_limit,
            new_write_id(),
        )
        rows = await self._run(_COMMIT_HEAD, args, write=write)
        if not rows:
            return None
        version, incarnation, owner = rows[0]
        return Head(version, incarnation, owner, None)

    async def _run(self, sql: str, args: tuple[Any, ...], *, write: HeadWrite | None) -> Any:
        """``sql`` prepared on a borrowed connection; its rows. A read is sent again once
        when its connection broke; a write never (see the module)."""
        backend = self.backend
        borrowed = (await backend._engines.get()).borrowed
        for attempt in backend.retry.tries():
            taken = await borrow(backend, borrowed, attempt, (Exception,))
            if taken is None:
                continue
            fairy, since = taken
            driver = fairy.driver_connection
            if write is not None:
                if _over_packet(fairy.info, args):
                    await borrowed.give(fairy, since)
                    return None  # the locked path sends it (or refuses it) as it always did
                # A write is never sent twice: let the loop take in what the server said
                # meanwhile (a restart, a killed session) before it is sent at all.
                await _yield_or_give_back(borrowed, fairy, since)
            try:
                backend._sent(sql)
            except BaseException:  # a listener's error, before anything was sent
                await borrowed.give(fairy, since)
                raise
            try:
                statement = await _prepared(driver, sql)
                rows = (await statement.execute(args)).rows
            except asyncio.CancelledError:
                session = _session(fairy)
                borrowed.discard(fairy)
                if write is not None:  # it must not commit after the call has ended
                    await to_the_end(self._ended(session))
                raise
            except Exception as exc:
                found = await self._failed(exc, borrowed, fairy, since, attempt, write, args)
                if found is _AGAIN:
                    continue
                return found
            await borrowed.give(fairy, since)
            return rows
        raise AssertionError("unreachable")

    async def _failed(
        self,
        exc: Exception,
        borrowed: Borrowed,
        fairy: Any,
        since: float,
        attempt: int,
        write: HeadWrite | None,
        args: tuple[Any, ...],
    ) -> Any:
        """After the statement failed: its rows after all (a write that committed),
        :data:`_AGAIN` (send it again), or raises tenxstore's error."""
        backend = self.backend
        driver = fairy.driver_connection
        if _server_code(exc) == _UNSENT:  # found closed as it was sent: nothing went out
            borrowed.discard(fairy)
            borrowed.after_disconnect()
            if await backend.retry.again(attempt, log, backend.name, "a connection was closed"):
                return _AGAIN
            raise backend.lost(ConnectionLost("every connection tried was closed")) from exc
        if _link_broke(exc, driver):
            session = _session(fairy)
            borrowed.discard(fairy)
            borrowed.after_disconnect()
            if write is None:
                if await backend.retry.again(attempt, log, backend.name, "a connection broke"):
                    return _AGAIN
                raise backend.lost(ConnectionLost("the connection was lost")) from exc
            # ended and looked into even if the caller is cancelled meanwhile
            return await to_the_end(self._after_a_lost_write(session, write, args, exc))
        code = _server_code(exc)
        if write is not None and code == _NO_SUCH_PROCEDURE:
            await borrowed.give(fairy, since)
            self.procedure = False
            log.warning(
                "the database %s has no procedure tenx_commit_head (dropped, or a dump "
                "restored without --routines; migration 0013 makes it): every state write "
                "takes the locked path",
                backend.describe(),
            )
            return None
        if write is not None and code in _CANCELLED:
            return await to_the_end(self._after_a_kill(borrowed, fairy, since, write, args, exc))
        await borrowed.give(fairy, since)  # the server's own error: the procedure rolled back
        error = backend.hot_error(code)
        if error is not None:
            raise error from exc
        if write is not None:
            return None  # the locked path raises it as SQLAlchemy reports it
        raise exc

    async def _after_a_kill(
        self,
        borrowed: Borrowed,
        fairy: Any,
        since: float,
        write: HeadWrite,
        args: tuple[Any, ...],
        exc: Exception,
    ) -> Any:
        """The server interrupted the CALL (``KILL QUERY``, a statement timeout): it may
        have committed just before, so look, on its own connection (which the server
        kept); its rows when it did, else StatementCancelled (nothing written)."""
        backend = self.backend
        try:
            async with fairy.driver_connection.cursor() as cursor:
                await cursor.execute(self._look_sql, self._look_args(write, args))
                seen = await cursor.fetchone()
        except Exception as failed:
            borrowed.discard(fairy)
            raise backend.lost(unknown_outcome()) from failed
        await borrowed.give(fairy, since)
        if seen is not None and seen[3]:
            return [(write.expected + 1, seen[1], seen[2])]  # type: ignore[operator]
        raise backend.cancelled(committing=False) from exc

    async def _after_a_lost_write(
        self,
        session: tuple[Any, Any, Any],
        write: HeadWrite,
        args: tuple[Any, ...],
        exc: Exception,
    ) -> Any:
        """Rows as the write's own, when it committed; else raises (see the module)."""
        try:
            ended = await self._ended(session)
            seen = await self._look(write, args) if ended else None
        except Exception as failed:
            raise self.backend.lost(unknown_outcome()) from failed
        if not ended:
            raise self.backend.lost(unknown_outcome()) from exc
        head = after_a_lost_write(self.backend, write, seen)
        return None if head is None else [(head.version, head.incarnation, head.user_id)]

    def _look_args(self, write: HeadWrite, args: tuple[Any, ...]) -> tuple[Any, ...]:
        assert write.expected is not None
        return (write.expected + 1, args[-1], write.thread_id)

    async def _look(self, write: HeadWrite, args: tuple[Any, ...]) -> Any:
        """(version, incarnation, owner, whether the write's row is there), on a fresh
        connection of SQLAlchemy's."""
        async with self.backend.connect() as conn:
            return (
                await conn.exec_driver_sql(self._look_sql, self._look_args(write, args))
            ).first()

    async def _ended(self, session: tuple[Any, Any, Any]) -> bool:
        """End a server session (its number, the server's name for itself and when it
        started, as its connection saw them) and make sure it is gone, waiting up to
        :data:`END_WAIT_S`; False when that cannot be made sure of — among them, when
        the fresh connection reached another server (a proxy in front of several, a
        cluster): there the number is another's. A server restarted since has ended
        it already (and a session of the same number there now is another's: it is
        not killed)."""
        thread, server, booted = session
        if thread is None or booted is None:
            return False
        try:
            async with self.backend.connect() as conn:
                here: Any = (await conn.exec_driver_sql(f"SELECT {_SERVER_FACTS}")).one()
                if here[0] != server:
                    return False  # another server answers: the session cannot be reached
                if abs(float(here[1]) - float(booted)) > 2:
                    return True  # restarted: whatever ran there is over
                with contextlib.suppress(Exception):  # already gone: 1094
                    await conn.exec_driver_sql(f"KILL CONNECTION {int(thread)}")
                return await _gone(conn, int(thread))
        except Exception:
            log.debug("could not end a lost session", exc_info=True)
            return False


def _session(fairy: Any) -> tuple[Any, Any, Any]:
    """The server session of a pooled connection: its number, the server's name for
    itself, and the server's start."""
    info = fairy.info
    return info.get(_THREAD), info.get(_SERVER), info.get(_BOOTED)


def _over_packet(info: dict[str, Any], args: tuple[Any, ...]) -> bool:
    """Whether the CALL's values would exceed the connection's ``max_allowed_packet``
    (recorded in ``info`` as it opened). The binary protocol sends each text as its
    UTF-8 bytes, unescaped: measured only when it could come near the limit."""
    limit: int | None = info.get(PACKET)
    if limit is None:
        return False
    texts = [a for a in args if isinstance(a, str)]
    if 4 * sum(len(t) for t in texts) + _CALL_BYTES < limit:
        return False
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) + _CALL_BYTES
    return size > limit


_CALL_BYTES = 1024  # the CALL's other values, types and headers: well under this
PACKET = "tenxstore_max_allowed_packet"
"""Where a connection's ``max_allowed_packet`` is recorded (its pool record's ``info``)."""
_AGAIN = object()
#: asyncmy's CR_SERVER_GONE_ERROR: raised only as it found the connection closed when it
#: was to send (nothing was sent). One lost mid-statement is 2013.
_UNSENT = 2006
_CANCELLED = (1317, 1969, 3024)
#: The server's start as epoch seconds (whole: Uptime counts seconds).
_BOOT_QUERY = (
    "SELECT UNIX_TIMESTAMP() - VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
    "WHERE VARIABLE_NAME = 'UPTIME'"
)


async def _gone(conn: Any, thread: int) -> bool:
    """Whether the session ``thread`` has left the server within :data:`END_WAIT_S`."""
    deadline = time.monotonic() + END_WAIT_S
    wait = 0.002
    while True:
        there = await conn.exec_driver_sql(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (thread,)
        )
        if there.scalar() == 0:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(wait)  # the server ends a killed session at its next check
        wait = min(wait * 2, 0.1)


async def _yield_or_give_back(borrowed: Borrowed, fairy: Any, since: float) -> None:
    """One turn of the event loop; cancelled meanwhile, the connection goes back."""
    try:
        await asyncio.sleep(0)
    except asyncio.CancelledError:  # nothing was sent: the connection is fine
        borrowed.give_later(fairy, since)
        raise


async def _prepared(driver: Any, sql: str) -> Any:
    """``sql`` prepared on this connection (once: kept on it)."""
    cache: dict[str, Any] | None = getattr(driver, _PREPARED, None)
    if cache is None:
        cache = {}
        setattr(driver, _PREPARED, cache)
    statement = cache.get(sql)
    if statement is None:
        statement = cache[sql] = await driver.prepare(sql)
    return statement


def _qmarks(statement: DriverStatement) -> str:
    """A statement compiled for asyncmy (``%s``) in the server's own placeholders."""
    assert "%%" not in statement.sql and "?" not in statement.sql
    return statement.sql.replace("%s", "?")


#: The server as it names itself, and when it started.
_SERVER_FACTS = f"CONCAT(@@server_id, '/', @@hostname, ':', @@port), ({_BOOT_QUERY})"
SESSION_FACTS = f"CONNECTION_ID(), {_SERVER_FACTS}"
"""What a connection records as it opens (:func:`record_session`): its session's
number and when the server started, which :meth:`MysqlHotPath._ended` needs."""


def record_session(info: dict[str, Any], thread: Any, server: Any, booted: Any) -> None:
    """Keep a new connection's :data:`SESSION_FACTS` in its pool record's ``info``."""
    info[_THREAD], info[_SERVER], info[_BOOTED] = int(thread), server, float(booted)
