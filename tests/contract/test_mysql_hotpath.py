"""MariaDB's hot path (``tenxstore/backends/mysql_hotpath.py``): the steady read and
write are one prepared statement each on the wire, and a write whose link broke, that
was cancelled, or that found no procedure says truthfully what it did — and never
commits after the call has ended."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tenxstore import CheckpointRepository, ConnectionLost
from tests.conftest import cfg
from tests.contract.test_mysql import admin_connection, connection_id, waiting_on_a_lock
from tests.servers import TcpProxy

COM_QUERY, COM_STMT_PREPARE, COM_STMT_EXECUTE = 0x03, 0x16, 0x17


def command(chunk: bytes) -> int | None:
    """The command byte of a client packet that starts ``chunk`` (after the 3-byte
    length and the sequence number), or None."""
    return chunk[4] if len(chunk) > 4 else None


class Wire:
    """Client packets by command, and a cut of the next execution: its request dropped
    before the server sees it, or its answer dropped after the server sent it."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.armed: str | None = None  # "request" or "reply"
        self.replied_to_drop = False
        self.fired = False
        self.when: tuple[bytes, Callable[[], Any]] | None = None  # (text, call) once

    def request(self, chunk: bytes) -> bool:
        kind = command(chunk)
        if kind is not None:
            self.sent.append(kind)
        if self.when is not None and self.when[0] in chunk:
            call, self.when = self.when[1], None
            asyncio.get_running_loop().call_soon(call)  # as the server gets it
        if self.armed and kind == COM_STMT_EXECUTE:
            where, self.armed, self.fired = self.armed, None, True
            if where == "request":
                return True
            self.replied_to_drop = True
        return False

    def reply(self, chunk: bytes) -> bool:
        if self.replied_to_drop:
            self.replied_to_drop = False
            return True
        return False


@asynccontextmanager
async def through_proxy(
    mysql_db: tuple[str, str], **options: Any
) -> AsyncIterator[tuple[CheckpointRepository, TcpProxy, Wire]]:
    """A migrated repository whose connections go through a proxy that can cut them."""
    url, _ = mysql_db
    from sqlalchemy import make_url

    parsed = make_url(url)
    wire = Wire()
    link = await TcpProxy(parsed.port or 3306, drop=wire.request, drop_reply=wire.reply).start()
    repo = CheckpointRepository(
        parsed.set(host="127.0.0.1", port=link.port).render_as_string(hide_password=False),
        **options,
    )
    try:
        await repo.asetup()
        yield repo, link, wire
    finally:
        link.restore()
        await repo.aclose()
        await link.close()


async def version_of(admin: Any, thread: str) -> int:
    async with admin.cursor() as cursor:
        await cursor.execute("SELECT version FROM threads WHERE thread_id = %s", (thread,))
        row = await cursor.fetchone()
    await admin.commit()  # a fresh read view next time
    return int(row[0])


async def test_the_steady_read_and_write_are_one_execution_each(
    mysql_db: tuple[str, str],
) -> None:
    async with through_proxy(mysql_db) as (repo, _link, wire):
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        for n in (1, 2):  # the first prepares the statements on the connection
            await repo.aput_checkpoint(config, {"n": n}, [{"role": "user", "content": n}])
            await repo.aget_state(config)
        wire.sent.clear()
        await repo.aput_checkpoint(config, {"n": 3}, [{"role": "user", "content": "three"}])
        assert wire.sent == [COM_STMT_EXECUTE]  # the CALL: one round trip
        wire.sent.clear()
        assert await repo.aget_state(config) == {"n": 3}
        assert wire.sent == [COM_STMT_EXECUTE]  # the SELECT: one round trip
        assert [m["content"] for m in await repo.aget_messages(config)] == [1, 2, "three"]


@pytest.mark.parametrize("where", ["request", "reply"])
async def test_a_link_cut_mid_write_is_told_truthfully(
    mysql_db: tuple[str, str], where: str
) -> None:
    """The CALL lost before the server saw it: ``committed=False``. Its answer lost
    after the server committed: the look finds the write's own row, and the call
    succeeds. Either way the version is what the call said, and stays so."""
    async with through_proxy(mysql_db) as (repo, _link, wire):
        admin = await admin_connection(mysql_db[1])
        try:
            config = cfg("t", "u")
            await repo.aput_state(config, {"n": 0})
            await repo.aput_state(config, {"n": 1})  # prepared on its connection
            wire.armed = where
            if where == "request":
                with pytest.raises(ConnectionLost) as err:
                    await repo.aput_state(config, {"n": "lost"})
                assert err.value.committed is False
                expected, state = 2, {"n": 1}
            else:
                assert await repo.aput_state(config, {"n": "answered"}) == 3
                expected, state = 3, {"n": "answered"}
            assert wire.fired
            assert await version_of(admin, "t") == expected
            assert await repo.aget_state(config) == state
            assert await repo.aput_state(config, {"n": "next"}) == expected + 1
        finally:
            admin.close()


async def locked_and_waiting(
    repo: CheckpointRepository, database: str, admin: Any, killer: Any
) -> tuple[asyncio.Future[Any], int]:
    """Thread ``t`` at version 2, its row lock held by ``admin``, and a write of it
    waiting for that lock inside its CALL: (the write, its server session)."""
    config = cfg("t", "u")
    await repo.aput_state(config, {"n": 0})
    await repo.aput_state(config, {"n": 1})
    async with admin.cursor() as cursor:
        await cursor.execute("BEGIN")
        await cursor.execute("SELECT 1 FROM threads WHERE thread_id = 't' FOR UPDATE")
    write = asyncio.ensure_future(repo.aput_state(config, {"n": "waiting"}))
    return write, await waiting_on_a_lock(killer, database, await connection_id(admin))


async def session_count(killer: Any, session: int) -> int:
    async with killer.cursor() as cursor:
        await cursor.execute(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (session,)
        )
        return int((await cursor.fetchone())[0])


@pytest.mark.parametrize("reachable", [True, False], ids=["looked", "unreachable"])
async def test_a_write_cut_while_waiting_for_the_lock_never_commits_afterwards(
    mysql_db: tuple[str, str], reachable: bool
) -> None:
    """The link breaks while the CALL waits for the thread's row lock; the server does
    not notice (the write would commit once the lock frees). tenxstore ends that
    session before it looks (``committed=False``, and nothing commits when the lock
    frees); when it cannot reach the server to do so, the outcome is unknown."""
    async with through_proxy(mysql_db, lock_timeout=20) as (repo, link, _wire):
        admin = await admin_connection(mysql_db[1])
        killer = await admin_connection(mysql_db[1])
        try:
            write, orphan = await locked_and_waiting(repo, mysql_db[1], admin, killer)
            link.cut()
            if reachable:
                link.restore()
            with pytest.raises(ConnectionLost) as err:
                await asyncio.wait_for(write, 30)
            if reachable:
                assert err.value.committed is False
                assert await session_count(killer, orphan) == 0  # ended before the look
            else:
                assert err.value.committed is None
                async with killer.cursor() as cursor:  # what tenxstore could not do
                    await cursor.execute(f"KILL {orphan}")
            await admin.rollback()  # the lock frees: an orphaned write would commit now
            link.restore()
            assert await version_of(killer, "t") == 2
            assert await repo.aget_state(cfg("t", "u")) == {"n": 1}
        finally:
            admin.close()
            killer.close()


async def test_a_cancelled_write_never_commits_after_the_call(
    mysql_db: tuple[str, str],
) -> None:
    """A write cancelled while its CALL waits for the row lock: its session is ended
    before the cancellation goes on, so the lock freeing later commits nothing."""
    async with through_proxy(mysql_db, lock_timeout=20) as (repo, _link, _wire):
        admin = await admin_connection(mysql_db[1])
        killer = await admin_connection(mysql_db[1])
        try:
            write, orphan = await locked_and_waiting(repo, mysql_db[1], admin, killer)
            write.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(write, 30)
            assert await session_count(killer, orphan) == 0
            await admin.rollback()
            assert await version_of(killer, "t") == 2
            assert await repo.aput_state(cfg("t", "u"), {"n": 2}) == 3
        finally:
            admin.close()
            killer.close()


async def test_without_the_procedure_writes_take_the_locked_path(
    mysql_db: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A database whose procedure is gone (dropped, or a migration by a user without
    CREATE ROUTINE): every write still lands, by the locked path, and it is said once."""
    async with through_proxy(mysql_db) as (repo, _link, wire):
        admin = await admin_connection(mysql_db[1])
        try:
            config = cfg("t", "u")
            await repo.aput_state(config, {"n": 0})
            async with admin.cursor() as cursor:
                await cursor.execute("DROP PROCEDURE tenx_commit_head")
            with caplog.at_level(logging.WARNING):
                for n in (1, 2, 3):
                    assert await repo.aput_state(config, {"n": n}) == n + 1
            said = [r for r in caplog.records if "tenx_commit_head" in r.getMessage()]
            assert len(said) == 1 and said[0].levelno == logging.WARNING
            wire.sent.clear()
            await repo.aput_state(config, {"n": 4})
            assert COM_STMT_EXECUTE not in wire.sent  # no CALL tried again
            assert await repo.aget_state(config) == {"n": 4}
        finally:
            admin.close()


async def test_awkward_values_round_trip_through_the_procedure(
    mysql_db: tuple[str, str],
) -> None:
    """Quotes, backslashes, NUL in text, astral characters, line separators, what looks
    like placeholders or JSON, a role of no string, and a 1 MB state: byte-exact."""
    url, _ = mysql_db
    repo = CheckpointRepository(url)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        odd = "a'b\"c\\d\x00e😀\u2028 $$ %s ? null [1] \ud7ff"
        messages = [
            {"role": None, "content": odd, "id": odd.replace("\x00", "")},
            {"role": odd, "content": "x" * 1000},
            {"content": {"nested": [odd, None, 1.5]}},
        ]
        state = {"odd": odd, "big": "y" * 1_000_000}
        assert await repo.aput_checkpoint(config, state, messages) == 2
        assert await repo.aget_state(config) == state
        got = await repo.aget_messages(config)
        assert [m["content"] for m in got] == [m["content"] for m in messages]
        assert got[0]["id"] == odd.replace("\x00", "") and got[1]["role"] == odd
    finally:
        await repo.aclose()


async def test_a_write_cancelled_while_its_lost_session_is_ended_never_commits_afterwards(
    mysql_db: tuple[str, str],
) -> None:
    """The link breaks while the CALL waits for the lock, and the caller is cancelled
    as tenxstore connects to end that session: the ending and the look go on to their end
    before the cancellation does, so the lock freeing later commits nothing."""
    async with through_proxy(mysql_db, lock_timeout=20) as (repo, link, wire):
        admin = await admin_connection(mysql_db[1])
        killer = await admin_connection(mysql_db[1])
        try:
            write, orphan = await locked_and_waiting(repo, mysql_db[1], admin, killer)
            wire.when = (b"CONCAT(@@server_id", write.cancel)  # as the look connects
            link.cut()
            link.restore()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(write, 30)
            assert wire.when is None, "the cancellation never came during the look"
            assert await session_count(killer, orphan) == 0
            await admin.rollback()  # the lock frees: an orphaned CALL would commit now
            assert await version_of(killer, "t") == 2
            assert await repo.aput_state(cfg("t", "u"), {"n": 2}) == 3
        finally:
            admin.close()
            killer.close()


async def test_a_write_cancelled_while_it_looks_into_a_kill_query_gives_its_connection_back(
    mysql_db: tuple[str, str],
) -> None:
    """KILL QUERY of a waiting CALL, and the caller cancelled while the write looks (on
    its own connection) at whether it committed: the connection still goes back, so
    the hot path's connections (one, here) are never used up."""
    async with through_proxy(
        mysql_db, lock_timeout=20, engine_options={"pool_size": 1, "max_overflow": 5}
    ) as (repo, _link, wire):
        admin = await admin_connection(mysql_db[1])
        killer = await admin_connection(mysql_db[1])
        try:
            write, victim = await locked_and_waiting(repo, mysql_db[1], admin, killer)
            wire.when = (b"EXISTS (SELECT 1 FROM states", write.cancel)
            async with killer.cursor() as cursor:
                await cursor.execute(f"KILL QUERY {victim}")
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(write, 30)
            assert wire.when is None, "the cancellation never came during the look"
            await admin.rollback()
            for n in (2, 3):  # the one hot connection is back, again and again
                assert await asyncio.wait_for(repo.aput_state(cfg("t", "u"), {"n": n}), 10) == n + 1
                assert await asyncio.wait_for(repo.aget_state(cfg("t", "u")), 10) == {"n": n}
        finally:
            admin.close()
            killer.close()
