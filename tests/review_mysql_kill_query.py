"""Review: KILL QUERY (1317) of a CALL blocked after its START TRANSACTION."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tenxstore import CheckpointRepository
from tests import services
from tests.conftest import cfg, mysql_admin, new_mysql_database
from tests.contract.test_mysql import admin_connection


@pytest.fixture
async def mysql_db() -> AsyncIterator[tuple[str, str]]:
    url, name = await new_mysql_database()
    yield url, name
    await mysql_admin(services.mysql_url(), f"DROP DATABASE `{name}`")


async def _fetch(conn, sql, args=()):
    async with conn.cursor() as cursor:
        await cursor.execute(sql, args)
        rows = await cursor.fetchall()
    await conn.commit()
    return rows


async def test_kill_query_inside_the_procedure_never_reports_an_uncommitted_write(
    mysql_db: tuple[str, str],
) -> None:
    """The CALL has done its UPDATE and state INSERT and waits on a message key another
    transaction holds; KILL QUERY interrupts it. Whatever the call says must be what
    the database holds afterwards."""
    url, name = mysql_db
    repo = CheckpointRepository(url, lock_timeout=20)
    admin = await admin_connection(name)
    killer = await admin_connection(name)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        await repo.aput_state(config, {"n": 1})
        async with admin.cursor() as cursor:  # holds the key (t, m1), uncommitted
            await cursor.execute("SET foreign_key_checks = 0")  # no lock on the thread row
            await cursor.execute("BEGIN")
            await cursor.execute(
                "INSERT INTO messages (thread_id, message_id, role, payload, created_at) "
                "VALUES ('t', 'm1', 'user', '{}', NOW(6))"
            )
        write = asyncio.ensure_future(
            repo.aput_checkpoint(config, {"n": 2}, [{"id": "m1", "role": "user", "content": 2}])
        )
        victim = None
        for _ in range(200):
            rows = await _fetch(
                killer,
                "SELECT ID, INFO FROM information_schema.PROCESSLIST WHERE DB = %s "
                "AND INFO LIKE %s AND ID <> CONNECTION_ID()",
                (name, "INSERT INTO messages%JSON_TABLE%"),
            )
            if rows:
                victim = rows[0][0]
                break
            await asyncio.sleep(0.05)
        if victim is None:
            print(await _fetch(killer, "SELECT ID, COMMAND, STATE, INFO FROM information_schema.PROCESSLIST WHERE DB = %s", (name,)))
            print(await _fetch(killer, "SELECT * FROM messages"))
        assert victim is not None, "the CALL never reached the message insert"
        await _fetch(killer, f"KILL QUERY {int(victim)}")
        outcome: object
        try:
            outcome = await asyncio.wait_for(write, 30)
        except Exception as exc:  # noqa: BLE001
            outcome = exc
        await admin.rollback()  # the key frees
        await asyncio.sleep(0.5)
        version = (await _fetch(killer, "SELECT version FROM threads WHERE thread_id='t'"))[0][0]
        states = await _fetch(killer, "SELECT version, write_id FROM states WHERE thread_id='t'")
        trx = await _fetch(
            killer,
            "SELECT trx_mysql_thread_id, trx_state FROM information_schema.INNODB_TRX",
        )
        print("outcome:", repr(outcome), "version:", version, "states:", states, "trx:", trx)
        if outcome == 3:
            assert version == 3, f"the call said version 3 was written; the database holds {version}"
        else:
            assert version == 2
        assert await repo.aget_state(config) == ({"n": 2} if outcome == 3 else {"n": 1})
    finally:
        admin.close()
        killer.close()
        await repo.aclose()
