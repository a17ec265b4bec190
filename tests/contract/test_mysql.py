"""What only MySQL/MariaDB needs tested: whole-second lock waits, a writer killed while it
waits, ids compared byte for byte, concurrent set-up under GET_LOCK, the URLs and options
it takes or refuses. (The contract suite itself runs on it as the ``mariadb`` backend.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import pytest
from sqlalchemy import make_url

from tenxstore import (
    CheckpointRepository,
    ConfigError,
    ConnectionLost,
    LockTimeout,
    StatementCancelled,
)
from tenxstore.backends import async_url
from tenxstore.backends.mysql import MysqlBackend, lock_wait_seconds
from tests import services
from tests.conftest import cfg, mysql_admin, mysql_admin_args


async def admin_connection(database: str) -> Any:
    import asyncmy  # type: ignore[import-untyped]

    return await asyncmy.connect(**mysql_admin_args(services.mysql_url()), db=database)


async def connection_id(connection: Any) -> int:
    async with connection.cursor() as cursor:
        await cursor.execute("SELECT CONNECTION_ID()")
        return int((await cursor.fetchone())[0])


async def waiting_on_a_lock(admin: Any, database: str, holder: int) -> int:
    """The connection id of the one writer of ``database`` that waits for a row lock.

    ``holder`` (the connection holding the lock) is left out by id: PROCESSLIST's INFO
    can still show its finished ``SELECT ... FOR UPDATE`` for a moment on a loaded
    machine, and a KILL aimed at it left the writer waiting out its whole 30 s lock
    timeout (CI, once). InnoDB's own lock-wait list (INNODB_TRX) is no help: it is a
    cache refreshed only after 100 ms without a read, which a poll never gives it.
    """
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        async with admin.cursor() as cursor:
            await cursor.execute(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND "
                "COMMAND IN ('Query', 'Execute') AND (INFO LIKE %s OR INFO LIKE %s) "
                "AND ID NOT IN (CONNECTION_ID(), %s)",
                # the locked path's SELECT ... FOR UPDATE, or the one-step write's
                # UPDATE inside tenx_commit_head
                (database, "%FOR UPDATE%", "UPDATE threads SET version%", holder),
            )
            rows = await cursor.fetchall()
        if rows:
            assert len(rows) == 1, rows
            return int(rows[0][0])
        await asyncio.sleep(0.01)  # polling for the writer to reach the lock, not a race
    raise AssertionError("the writer never waited on the lock")


def test_urls_select_the_mysql_backend() -> None:
    for url in ("mysql://u@h/db", "mysql+asyncmy://u@h/db", "mariadb://u@h/db"):
        assert async_url(url).drivername == "mysql+asyncmy"
    repo = CheckpointRepository("mariadb://root@127.0.0.1/x")
    assert isinstance(repo.backend, MysqlBackend) and repo.dialect == "mysql"
    with pytest.raises(ConfigError, match="schema"):
        CheckpointRepository("mysql://root@127.0.0.1/x", schema="s")
    with pytest.raises(ConfigError, match="transaction"):
        CheckpointRepository("mysql://root@127.0.0.1/x", pool_mode="transaction")
    assert [lock_wait_seconds(t) for t in (0.2, 1.0, 1.5, None)] == [1, 1, 2, 1073741824]


async def test_ids_differ_by_case_and_trailing_space(mysql_db: tuple[str, str]) -> None:
    repo = CheckpointRepository(mysql_db[0])
    try:
        await repo.asetup()
        for n, thread in enumerate(("a", "A", "a ", "á")):
            await repo.aput_state(cfg(thread, "u"), {"n": n})
        for n, thread in enumerate(("a", "A", "a ", "á")):
            assert await repo.aget_state(cfg(thread, "u")) == {"n": n}
    finally:
        await repo.aclose()


async def test_the_langgraph_key_limits_are_the_key_columns_lengths(
    mysql_db: tuple[str, str],
) -> None:
    """What LangGraph keys are checked against (``KeyLimits``, read off the tables) is
    what the key columns hold on MySQL: 191 characters (InnoDB's 3072-byte keys in
    utf8mb4); the other databases hold 255."""
    url, database = mysql_db
    repo = CheckpointRepository(url)
    try:
        await repo.asetup()
        limits = repo.langgraph.limits
        assert (limits.namespace, limits.channel, limits.task_id) == (191, 191, 191)
        admin = await admin_connection(database)
        try:
            async with admin.cursor() as cursor:
                await cursor.execute(
                    "SELECT CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = %s AND (COLUMN_NAME IN ('checkpoint_ns', "
                    "'task_id') OR (TABLE_NAME = 'lg_blobs' AND COLUMN_NAME = 'channel'))",
                    (database,),
                )
                lengths = [int(row[0]) for row in await cursor.fetchall()]
        finally:
            admin.close()
        assert len(lengths) == 6 and set(lengths) == {limits.channel}
    finally:
        await repo.aclose()


async def test_setup_logs_no_server_warning(
    mysql_db: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A fresh database's setup() draws no warning from the server (the driver logs
    each one): no named primary key, Alembic's version table included."""
    repo = CheckpointRepository(mysql_db[0])
    try:
        with caplog.at_level(logging.WARNING, logger="asyncmy"):
            await repo.asetup()
        assert [r.getMessage() for r in caplog.records if r.name.startswith("asyncmy")] == []
        assert await repo.aput_state(cfg("t", "u"), {"n": 1}) == 1
    finally:
        await repo.aclose()


async def test_lock_waits_are_bounded_in_whole_seconds(mysql_db: tuple[str, str]) -> None:
    url, database = mysql_db
    repo = CheckpointRepository(url, lock_timeout=0.2)  # waits 1 s: InnoDB counts seconds
    admin = await admin_connection(database)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        async with admin.cursor() as cursor:
            await cursor.execute("BEGIN")
            await cursor.execute("SELECT 1 FROM threads WHERE thread_id = 't' FOR UPDATE")
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            await asyncio.wait_for(repo.aput_state(config, {"n": "blocked"}), 10)
        assert 0.9 < time.monotonic() - started < 5
        await admin.rollback()
        assert await repo.aget_state(config) == {"n": 1}
        assert await repo.aput_state(config, {"n": 2}) == 2
    finally:
        admin.close()
        await repo.aclose()


async def test_a_writer_killed_while_waiting_on_the_lock(mysql_db: tuple[str, str]) -> None:
    url, database = mysql_db
    repo = CheckpointRepository(url)
    admin = await admin_connection(database)
    killer = await admin_connection(database)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        async with admin.cursor() as cursor:
            await cursor.execute("BEGIN")
            await cursor.execute("SELECT 1 FROM threads WHERE thread_id = 't' FOR UPDATE")
        write = asyncio.ensure_future(repo.aput_state(config, {"n": "killed"}))
        victim = await waiting_on_a_lock(killer, database, await connection_id(admin))
        async with killer.cursor() as cursor:
            await cursor.execute(f"KILL {victim}")
        with pytest.raises(ConnectionLost) as err:
            await asyncio.wait_for(write, 10)  # an error, not a hang
        assert err.value.committed is False  # lost before COMMIT
        await admin.rollback()
        assert await repo.aget_state(config) == {"n": 1}
        assert await repo.aput_state(config, {"n": 2}) == 2  # a fresh connection
    finally:
        admin.close()
        killer.close()
        await repo.aclose()


async def test_a_writer_whose_query_is_killed_gets_statement_cancelled(
    mysql_db: tuple[str, str],
) -> None:
    """KILL QUERY (a DBA, a proxy's statement timeout) of a write waiting on the
    thread's lock: StatementCancelled, nothing written, and the next write works."""
    url, database = mysql_db
    repo = CheckpointRepository(url)
    admin = await admin_connection(database)
    killer = await admin_connection(database)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        async with admin.cursor() as cursor:
            await cursor.execute("BEGIN")
            await cursor.execute("SELECT 1 FROM threads WHERE thread_id = 't' FOR UPDATE")
        write = asyncio.ensure_future(repo.aput_state(config, {"n": "killed"}))
        victim = await waiting_on_a_lock(killer, database, await connection_id(admin))
        async with killer.cursor() as cursor:
            await cursor.execute(f"KILL QUERY {victim}")
        with pytest.raises(StatementCancelled, match="nothing was written") as err:
            await asyncio.wait_for(write, 10)
        assert err.value.committed is False
        await admin.rollback()
        assert await repo.aget_state(config) == {"n": 1}
        assert await repo.aput_state(config, {"n": 2}) == 2
    finally:
        admin.close()
        killer.close()
        await repo.aclose()


async def test_a_value_over_max_allowed_packet_is_refused_before_it_is_sent(
    mysql_db: tuple[str, str],
) -> None:
    """A state whose statement would exceed max_allowed_packet: SerializationError
    naming it (not a lost connection), nothing written; sealed, a state of 4/5 of the
    limit is over it too (base64: 4/3)."""
    from tenxstore import KeyRing, SerializationError

    url, database = mysql_db
    admin = await admin_connection(database)
    try:
        async with admin.cursor() as cursor:
            await cursor.execute("SELECT @@max_allowed_packet")
            limit = int((await cursor.fetchone())[0])
    finally:
        admin.close()
    sealed = KeyRing([("k1", bytes(32))])
    for thread, keys, size in (("plain", None, limit), ("sealed", sealed, limit * 4 // 5)):
        repo = CheckpointRepository(url, keys=keys)
        try:
            await repo.asetup()
            config = cfg(thread, "u")
            await repo.aput_state(config, {"n": 1})
            with pytest.raises(SerializationError, match="max_allowed_packet"):
                await repo.aput_state(config, {"big": "x" * size})
            assert await repo.aget_state(config) == {"n": 1}
            assert (await repo.aput_state(config, {"n": 2})) == 2
        finally:
            await repo.aclose()


async def test_killed_idle_connections_cost_nothing(mysql_db: tuple[str, str]) -> None:
    """Pooled connections the server ended (a restart, wait_timeout): the next read and
    write each start again on a fresh connection, nothing lost and no error."""
    url, database = mysql_db
    repo = CheckpointRepository(url)
    admin = await admin_connection(database)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 1})
        await asyncio.gather(*(repo.aget_state(config) for _ in range(4)))  # a few pooled
        async with admin.cursor() as cursor:
            await cursor.execute(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s "
                "AND ID <> CONNECTION_ID()",
                (database,),
            )
            victims = [int(row[0]) for row in await cursor.fetchall()]
            assert victims
            for victim in victims:
                await cursor.execute(f"KILL {victim}")
        assert await repo.aput_state(config, {"n": 2}) == 2
        assert await repo.aget_state(config) == {"n": 2}
    finally:
        admin.close()
        await repo.aclose()


async def test_concurrent_setups_take_turns(mysql_db: tuple[str, str]) -> None:
    """DDL commits as it goes: without GET_LOCK two set-ups would both create tables."""
    repos = [CheckpointRepository(mysql_db[0]) for _ in range(3)]
    try:
        await asyncio.gather(*(repo.asetup() for repo in repos))
        ids = {await repo.astore_id() for repo in repos}
        assert len(ids) == 1
        assert await repos[0].aput_state(cfg("t", "u"), {"n": 1}) == 1
    finally:
        for repo in repos:
            await repo.aclose()


async def test_an_unknown_database_is_unavailable() -> None:
    from tenxstore import DatabaseUnavailable

    url = make_url(services.mysql_url()).set(database="tenx_no_such_db")
    repo = CheckpointRepository(url.render_as_string(hide_password=False))
    try:
        with pytest.raises(DatabaseUnavailable, match="no such database"):
            await repo.asetup()
    finally:
        await repo.aclose()


async def test_a_migration_that_failed_halfway_is_finished_by_the_next_run(
    mysql_db: tuple[str, str],
) -> None:
    """MySQL's DDL is not transactional: a run of 0005 that died before its last step
    left its table and columns and no stamp; the next run keeps them and finishes."""
    from tenxstore import migrate

    url, database = mysql_db
    repo = CheckpointRepository(url)
    try:
        await repo.asetup()
        await repo.aput_state(cfg("t", "u"), {"n": 1})
    finally:
        await repo.aclose()
    await mysql_admin(
        services.mysql_url(),
        f"DROP INDEX ix_lg_checkpoints_run_id ON `{database}`.lg_checkpoints",
        f"UPDATE `{database}`.alembic_version SET version_num = '0004_hot_updates'",
    )
    repo = CheckpointRepository(url)
    try:
        await repo.asetup()
        assert await migrate.current_revision(repo.engine) == migrate.head_revision()
        assert await repo.aget_state(cfg("t", "u")) == {"n": 1}
        admin = await admin_connection(database)
        try:
            async with admin.cursor() as cursor:
                await cursor.execute("SHOW INDEX FROM lg_checkpoints")
                assert "ix_lg_checkpoints_run_id" in {row[2] for row in await cursor.fetchall()}
        finally:
            admin.close()
    finally:
        await repo.aclose()


async def test_0008_that_died_after_its_ddl_is_finished_by_the_next_run(
    mysql_db: tuple[str, str],
) -> None:
    """0008 created lg_heads and dropped lg_checkpoints.is_head, then died before its
    stamp: the next setup() keeps the table, skips the column already dropped, stamps."""
    from tenxstore import migrate

    url, database = mysql_db
    repo = CheckpointRepository(url)
    try:
        await repo.asetup()
        await repo.aput_state(cfg("t", "u"), {"n": 1})
    finally:
        await repo.aclose()
    await mysql_admin(
        services.mysql_url(),
        f"UPDATE `{database}`.alembic_version SET version_num = '0007_checkpoint_versions_once'",
    )
    repo = CheckpointRepository(url)
    try:
        await repo.asetup()
        assert await migrate.current_revision(repo.engine) == migrate.head_revision()
        assert await repo.aget_state(cfg("t", "u")) == {"n": 1}
    finally:
        await repo.aclose()


async def test_a_downgrade_that_failed_halfway_is_finished_by_the_next_run(
    mysql_db: tuple[str, str],
) -> None:
    """0008's downgrade added is_head back and dropped lg_heads, then died before its
    stamp: the next downgrade skips both and stamps 0007."""
    from tenxstore import migrate

    url, database = mysql_db
    repo = CheckpointRepository(url)
    try:
        await repo.asetup()
    finally:
        await repo.aclose()
    await mysql_admin(
        services.mysql_url(),
        f"ALTER TABLE `{database}`.lg_checkpoints ADD COLUMN is_head BOOL NOT NULL DEFAULT false",
        f"DROP TABLE `{database}`.lg_heads",
    )
    repo = CheckpointRepository(url)
    try:
        await migrate.downgrade(repo.backend, revision="0007_checkpoint_versions_once")
        assert await migrate.current_revision(repo.engine) == "0007_checkpoint_versions_once"
        await repo.asetup()  # and up again
        assert await migrate.current_revision(repo.engine) == migrate.head_revision()
    finally:
        await repo.aclose()


async def test_a_connection_the_server_ended_is_discarded_with_one_warning(
    mysql_db: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """KILL of a checked-out connection with nothing left to roll back: its reset on
    the way back to the pool fails. SQLAlchemy's own reset logged that at ERROR with a
    traceback; it is one WARNING line, the connection is discarded, and the next calls
    get a fresh one."""
    url, database = mysql_db
    repo = CheckpointRepository(url)
    killer = await admin_connection(database)
    try:
        await repo.asetup()
        await repo.aput_state(cfg("t", "u"), {"n": 1})
        with caplog.at_level(logging.WARNING):
            async with repo.backend.connect() as conn:
                victim = (await conn.exec_driver_sql("SELECT CONNECTION_ID()")).scalar_one()
                await conn.commit()  # the pool's reset is the only rollback left
                async with killer.cursor() as cursor:
                    await cursor.execute(f"KILL {victim}")
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
        resets = [r for r in caplog.records if "could not be reset" in r.getMessage()]
        assert len(resets) == 1, caplog.records
        assert resets[0].levelno == logging.WARNING and resets[0].exc_info is None
        assert "\n" not in resets[0].getMessage()  # 2006 or 2013: the server is gone
        assert await repo.aget_state(cfg("t", "u")) == {"n": 1}
        assert await repo.aput_state(cfg("t", "u"), {"n": 2}) == 2
    finally:
        killer.close()
        await repo.aclose()


async def test_connections_killed_under_load_raise_our_errors_and_log_warnings(
    mysql_db: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """8 conversations while an operator KILLs every connection of the database, over
    and over: each call succeeds or raises tenxstore's error (ConnectionLost), and the
    log holds WARNING lines, never an ERROR or a traceback."""
    from tenxstore import TenxStoreError

    url, database = mysql_db
    repo = CheckpointRepository(url)
    killer = await admin_connection(database)
    outcomes: list[BaseException | None] = []
    try:
        await repo.asetup()
        await repo.aget_state(cfg("warm", "u"))  # the first-use check is behind us

        async def conversation(n: int) -> None:
            for turn in range(40):
                config = cfg(f"t{n}", "u")
                try:
                    await repo.aget_state(config)
                    await repo.aput_state(config, {"turn": turn})
                    await repo.aget_messages(config)
                    outcomes.append(None)
                except Exception as exc:
                    outcomes.append(exc)

        talking = asyncio.gather(*(conversation(n) for n in range(8)))
        with caplog.at_level(logging.WARNING):
            while not talking.done():
                async with killer.cursor() as cursor:
                    await cursor.execute(
                        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s "
                        "AND ID <> CONNECTION_ID()",
                        (database,),
                    )
                    for (victim,) in await cursor.fetchall():
                        with contextlib.suppress(Exception):  # gone meanwhile
                            await cursor.execute(f"KILL {victim}")
            await talking
        raw = [o for o in outcomes if o is not None and not isinstance(o, TenxStoreError)]
        assert raw == []
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
        assert [r for r in caplog.records if r.exc_info] == []
        assert await repo.aput_state(cfg("after", "u"), {"n": 1}) == 1
    finally:
        killer.close()
        await repo.aclose()
