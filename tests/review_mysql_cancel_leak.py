"""Review: a write cancelled while it looks into a KILL QUERY (1317) on its own
connection leaks that connection's slot in Borrowed: once pool_size slots leak, every
hot read and write waits forever."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import make_url

from tenxstore import CheckpointRepository
from tests import services
from tests.conftest import cfg, mysql_admin, new_mysql_database
from tests.contract.test_mysql import admin_connection, connection_id, waiting_on_a_lock


@pytest.fixture
async def mysql_db() -> AsyncIterator[tuple[str, str]]:
    url, name = await new_mysql_database()
    yield url, name
    await mysql_admin(services.mysql_url(), f"DROP DATABASE `{name}`")


class StallingProxy:
    """Forwards MariaDB traffic; holds back the server's answer to the hot path's look
    (the SELECT ... EXISTS (SELECT 1 FROM states ...)) until released."""

    def __init__(self, port: int) -> None:
        self.port_up = port
        self.seen_look = asyncio.Event()
        self.release = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.port_up)
        stalled = asyncio.Event()

        async def up() -> None:
            while data := await reader.read(65536):
                if len(data) > 4 and data[4] == 0x03 and b"EXISTS (SELECT 1 FROM states" in data:
                    stalled.set()
                    self.seen_look.set()
                up_w.write(data)
                await up_w.drain()

        async def down() -> None:
            while data := await up_r.read(65536):
                if stalled.is_set():
                    await self.release.wait()
                writer.write(data)
                await writer.drain()

        for coro in (up(), down()):
            task = asyncio.ensure_future(coro)
            self.tasks.add(task)

    async def close(self) -> None:
        self.release.set()
        for task in self.tasks:
            task.cancel()
        self.server.close()


async def test_a_write_cancelled_during_its_1317_look_gives_its_connection_back(
    mysql_db: tuple[str, str],
) -> None:
    url, name = mysql_db
    parsed = make_url(url)
    proxy = StallingProxy(parsed.port or 3306)
    port = await proxy.start()
    repo = CheckpointRepository(
        parsed.set(host="127.0.0.1", port=port).render_as_string(hide_password=False),
        lock_timeout=20,
        engine_options={"pool_size": 1, "max_overflow": 5},
    )
    admin = await admin_connection(name)
    killer = await admin_connection(name)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        await repo.aput_state(config, {"n": 1})
        async with admin.cursor() as cursor:
            await cursor.execute("BEGIN")
            await cursor.execute("SELECT 1 FROM threads WHERE thread_id = 't' FOR UPDATE")
        write = asyncio.ensure_future(repo.aput_state(config, {"n": "killed"}))
        victim = await waiting_on_a_lock(killer, name, await connection_id(admin))
        async with killer.cursor() as cursor:
            await cursor.execute(f"KILL QUERY {victim}")
        await asyncio.wait_for(proxy.seen_look.wait(), 10)
        write.cancel()  # e.g. the request's deadline, while the look runs
        with pytest.raises(asyncio.CancelledError):
            await write
        await admin.rollback()
        proxy.release.set()
        gc.collect()
        await asyncio.sleep(0.5)
        # SQLAlchemy's own pool has room (max_overflow); only the hot path's slots count
        assert await asyncio.wait_for(repo.aget_state(config), 10) == {"n": 1}
    finally:
        admin.close()
        killer.close()
        await proxy.close()
        await asyncio.wait_for(repo.aclose(), 10)
