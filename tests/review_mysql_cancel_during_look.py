"""Review: a write whose link broke while its CALL waited for the row lock, cancelled
while tenxstore tries to end that session: the orphaned CALL commits after the call
ended with CancelledError."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests import services
from tests.conftest import cfg, mysql_admin, new_mysql_database
from tests.contract.test_mysql import admin_connection, connection_id, waiting_on_a_lock
from tests.contract.test_mysql_hotpath import version_of
from tenxstore import CheckpointRepository
from sqlalchemy import make_url


class BlackholeProxy:
    """Forwards MariaDB traffic until ``cut()``: then every open link is closed (the
    server, waiting for a lock, does not notice) and new ones are accepted but never
    answered (a partition in which a connect hangs)."""

    def __init__(self, port: int) -> None:
        self.port_up = port
        self.cut_off = False
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        if self.cut_off:
            return  # accepted, never answered
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.port_up)
        self.writers.append(up_w)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if self.cut_off:
                    return
                dst.write(data)
                await dst.drain()

        for coro in (pipe(reader, up_w), pipe(up_r, writer)):
            task = asyncio.ensure_future(coro)
            self.tasks.add(task)

    def cut(self) -> None:
        self.cut_off = True
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for writer in self.writers:
            writer.transport.abort()
        self.server.close()


@pytest.fixture
async def mysql_db() -> AsyncIterator[tuple[str, str]]:
    url, name = await new_mysql_database()
    yield url, name
    await mysql_admin(services.mysql_url(), f"DROP DATABASE `{name}`")


async def test_a_write_cancelled_while_its_lost_session_is_ended_never_commits_afterwards(
    mysql_db: tuple[str, str],
) -> None:
    url, name = mysql_db
    parsed = make_url(url)
    link = BlackholeProxy(parsed.port or 3306)
    port = await link.start()
    repo = CheckpointRepository(
        parsed.set(host="127.0.0.1", port=port).render_as_string(hide_password=False),
        lock_timeout=20,
    )
    await repo.asetup()
    if True:
        admin = await admin_connection(mysql_db[1])
        killer = await admin_connection(mysql_db[1])
        try:
            config = cfg("t", "u")
            await repo.aput_state(config, {"n": 0})
            await repo.aput_state(config, {"n": 1})
            async with admin.cursor() as cursor:
                await cursor.execute("BEGIN")
                await cursor.execute("SELECT 1 FROM threads WHERE thread_id = 't' FOR UPDATE")
            write = asyncio.ensure_future(repo.aput_state(config, {"n": "orphan"}))
            await waiting_on_a_lock(killer, mysql_db[1], await connection_id(admin))
            link.cut()  # the server does not notice: its CALL still waits for the lock
            await asyncio.sleep(0.5)  # tenxstore now tries to reach the server to end it
            assert not write.done()
            write.cancel()  # the caller's deadline
            outcome: object
            try:
                outcome = await asyncio.wait_for(write, 30)
            except BaseException as exc:  # noqa: BLE001
                outcome = exc
            await admin.rollback()  # the lock frees
            await asyncio.sleep(1)
            version = await version_of(killer, "t")
            print("outcome", repr(outcome), "version", version)
            if isinstance(outcome, asyncio.CancelledError):
                assert version == 2, "the call was cancelled, and its write committed afterwards"
        finally:
            admin.close()
            killer.close()
            await link.close()
            await asyncio.wait_for(repo.aclose(), 20)
