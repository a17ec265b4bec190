"""MariaDB's one-CALL write, ``tenx_commit_head`` (migration 0013), where it meets the
server's own rules: a database whose default character set is not the tables' (a
routine's text takes the database's), values near ``max_allowed_packet`` (the binary
protocol sends them unescaped), and ``KILL QUERY`` halfway through the procedure."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import make_url

from tenxstore import CheckpointRepository, StatementCancelled
from tests import services
from tests.conftest import cfg, mysql_admin
from tests.contract.test_mysql import admin_connection


@pytest.fixture(params=["latin1", "utf8mb3"])
async def odd_db(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A database whose default character set cannot hold every character."""
    base = make_url(services.mysql_url())
    name = f"{base.database or 'test'}_{uuid.uuid4().hex[:12]}"
    await mysql_admin(str(base), f"CREATE DATABASE `{name}` DEFAULT CHARACTER SET {request.param}")
    yield base.set(database=name).render_as_string(hide_password=False)
    await mysql_admin(str(base), f"DROP DATABASE `{name}`")


async def test_any_text_round_trips_whatever_the_database_default(odd_db: str) -> None:
    repo = CheckpointRepository(odd_db)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        text = "Grüße 😀 Привет 日本"
        messages = [{"id": "id-" + text, "role": "r-" + text, "content": text}]
        assert await repo.aput_checkpoint(config, {"s": text}, messages) == 2
        assert await repo.aget_state(config) == {"s": text}
        got = await repo.aget_messages(config)
        assert [(m.get("id"), m.get("role"), m["content"]) for m in got] == [
            ("id-" + text, "r-" + text, text)
        ]
    finally:
        await repo.aclose()


async def test_distinct_message_ids_are_never_merged(odd_db: str) -> None:
    """Two ids that differ only in a character the database's default set lacks."""
    repo = CheckpointRepository(odd_db)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        messages = [
            {"id": "a😀", "role": "user", "content": "first"},
            {"id": "a😁", "role": "user", "content": "second"},
        ]
        await repo.aput_checkpoint(config, {"n": 1}, messages)
        assert [m["content"] for m in await repo.aget_messages(config)] == ["first", "second"]
    finally:
        await repo.aclose()


async def test_a_write_under_max_allowed_packet_is_stored(mysql_db: tuple[str, str]) -> None:
    """2.5 MB of quotes in one message: ~5 MB as stored, ~10 MB as the CALL's JSON
    array, under max_allowed_packet (16 MB here) — stored, as the locked path stores
    it (an estimate of text-protocol escaping refused it)."""
    repo = CheckpointRepository(mysql_db[0])
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        content = '"' * 2_500_000
        assert (
            await repo.aput_checkpoint(config, {"n": 1}, [{"role": "user", "content": content}])
            == 2
        )
        assert (await repo.aget_messages(config))[0]["content"] == content
    finally:
        await repo.aclose()


async def rows(conn: Any, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    async with conn.cursor() as cursor:
        await cursor.execute(sql, args)
        found = list(await cursor.fetchall())
    await conn.commit()  # a fresh read view next time
    return found


async def test_kill_query_halfway_through_the_procedure_writes_nothing(
    mysql_db: tuple[str, str],
) -> None:
    """The CALL has moved the version and inserted the state, and waits for a message
    key another transaction holds; KILL QUERY interrupts it: StatementCancelled, and
    the database holds nothing of it (the procedure's handler rolled it back)."""
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
        for _ in range(1000):
            found = await rows(
                killer,
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s "
                "AND INFO LIKE %s AND ID <> CONNECTION_ID()",
                (name, "INSERT INTO messages%JSON_TABLE%"),
            )
            if found:
                victim = found[0][0]
                break
            await asyncio.sleep(0.01)  # polling for the CALL to reach the key, not a race
        assert victim is not None, "the CALL never reached the message insert"
        await rows(killer, f"KILL QUERY {int(victim)}")
        with pytest.raises(StatementCancelled) as err:
            await asyncio.wait_for(write, 30)
        assert err.value.committed is False
        await admin.rollback()  # the key frees
        assert (await rows(killer, "SELECT version FROM threads WHERE thread_id = 't'")) == [(2,)]
        assert len(await rows(killer, "SELECT version FROM states WHERE thread_id = 't'")) == 2
        assert await repo.aget_state(config) == {"n": 1}
    finally:
        admin.close()
        killer.close()
        await repo.aclose()


@pytest.mark.parametrize("path", ["one CALL", "locked"])
async def test_writers_of_different_threads_never_deadlock_in_a_new_database(
    mysql_db: tuple[str, str], path: str
) -> None:
    """Many conversations at once in a database just made: its tables' statistics are
    young, and a prune that scanned the whole of ``states`` (not the key of its own
    thread) waited on other threads' rows — concurrent writers deadlocked, on the
    one-CALL write (a config that recorded its version) and on the locked path (a
    config that did not) alike."""
    repo = CheckpointRepository(mysql_db[0], state_history_limit=2)
    try:
        await repo.asetup()

        async def conversation(n: int) -> int:
            config = cfg(f"t{n}", "u")
            version = 0
            for turn in range(25):
                if path == "locked":
                    config = cfg(f"t{n}", "u")  # no version recorded: the locked path
                version = await repo.aput_checkpoint(
                    config, {"turn": turn, "pad": "x" * 2000}, [{"role": "user", "content": turn}]
                )
            return version

        assert await asyncio.gather(*(conversation(n) for n in range(16))) == [25] * 16
    finally:
        await repo.aclose()
