"""Round trips on the hot path, counted with an engine event (PostgreSQL and SQLite).

PostgreSQL: a steady-state durable write is four round trips — BEGIN, lock the
thread row (``SELECT ... FOR UPDATE``), one statement of data-modifying CTEs that
inserts the state and the messages, bumps the head version and prunes, COMMIT. The
first write to a thread adds the thread's insert and the re-select that locks it.
A read is one statement, in autocommit.

SQLite, where a statement costs no round trip: BEGIN IMMEDIATE, the lock select,
then the insert, messages, bump and prune as separate statements.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from tenxstore import CheckpointRepository
from tests.conftest import Backend


@contextmanager
def counting(repo: CheckpointRepository) -> Iterator[list[str]]:
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    engine = repo.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)


async def test_statements_per_operation(sql_backend: Backend) -> None:
    repo = await sql_backend.make(state_history_limit=2)
    sqlite = repo.dialect == "sqlite"
    begin = 1 if sqlite else 0
    # Behind a transaction pooler: asyncpg's BEGIN/COMMIT (not counted here, but round
    # trips) and SET LOCAL lock_timeout instead of the session's setting.
    write = {"sqlite": 6, "postgresql": 4, "pgbouncer": 3}[sql_backend.name]
    config = {"thread_id": "t", "user_id": "u"}
    with counting(repo) as first:
        await repo.aput_checkpoint(config, {"n": 0}, [{"id": "m0"}])
    assert len(first) == write + (1 if sqlite else 2), first  # + thread insert, re-select
    for n in (1, 2):
        with counting(repo) as steady:
            await repo.aput_checkpoint(config, {"n": n}, [{"id": f"m{n}a"}, {"id": f"m{n}b"}])
    assert len(steady) == write, steady
    with counting(repo) as no_messages:
        await repo.aput_state(config, {"n": 3})
    assert len(no_messages) == write - (1 if sqlite else 0), no_messages
    for read in (repo.aget_state, repo.aget_messages, repo.aget_thread, repo.alist_states):
        with counting(repo) as reads:
            await read(config)  # type: ignore[operator]
        assert len(reads) == 1 + begin, (read.__name__, reads)
