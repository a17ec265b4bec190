"""A deadlock the server breaks is ``LockTimeout``: the victim's transaction was
rolled back whole (nothing written, retrying is safe), the other one commits.

Two writes lock two threads in opposite orders (tenxstore itself never does: writers
of several threads lock them in id order). PostgreSQL reports SQLSTATE 40P01 after
``deadlock_timeout``, InnoDB error 1213 at once; each was once a raw driver error, then
an unknown fault (``DatabaseError``, "whether a write was applied is not known").
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import update

from tenxstore import Deadlock, LockTimeout
from tests.conftest import backend_for, cfg


@pytest.mark.parametrize("name", ["postgresql", "pgbouncer", "mariadb"])
async def test_a_deadlock_is_a_lock_timeout_and_the_other_write_commits(
    name: str, tmp_path: Path
) -> None:
    async with backend_for(name, tmp_path) as backend:
        repo = await backend.make()
        for thread in "ab":
            await repo.aput_state(cfg(thread, "u"), {"n": 0})
        store = repo.store
        threads = store.tables.threads
        holding = [asyncio.Event(), asyncio.Event()]

        async def write(me: int, first: str, second: str) -> None:
            async with store.backend.write(store.sql.lock, {"b_thread": first}) as (conn, _):
                holding[me].set()
                await holding[1 - me].wait()  # each holds its first lock: now cross
                await conn.execute(store.sql.lock, {"b_thread": second})
                await conn.execute(
                    update(threads).where(threads.c.thread_id == first).values(name=f'"{me}"')
                )

        done = await asyncio.wait_for(
            asyncio.gather(write(0, "a", "b"), write(1, "b", "a"), return_exceptions=True), 20
        )
        assert sorted(type(d).__name__ for d in done) == ["Deadlock", "NoneType"], done
        loser = next(i for i, d in enumerate(done) if isinstance(d, Deadlock))
        assert isinstance(done[loser], LockTimeout)  # a Deadlock is a LockTimeout
        assert "nothing was written" in str(done[loser])
        names = {}
        for thread in "ab":
            info = await repo.aget_thread(cfg(thread, "u"))
            assert info is not None
            names[thread] = info.name
        assert names["ab"[loser]] is None and names["ab"[1 - loser]] == str(1 - loser)
