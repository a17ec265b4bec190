"""Connections killed under the pool (PostgreSQL): reads recover, writes never replay."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError

from tenxstore import CheckpointRepository


async def kill_backends(url: str, application_name: str) -> int:
    admin = await asyncpg.connect(url)
    try:
        killed = await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = $1 AND pid <> pg_backend_pid()",
            application_name,
        )
        return len(killed)
    finally:
        await admin.close()


async def test_killed_connections(pg_url: str, pg_schema: str) -> None:
    name = f"tenx-{uuid.uuid4().hex[:8]}"
    repo = CheckpointRepository(
        pg_url,
        schema=pg_schema,
        engine_options={"connect_args": {"server_settings": {"application_name": name}}},
    )
    try:
        await repo.asetup()
        config = {"thread_id": "t", "user_id": "u"}
        await repo.aput_state(config, {"n": 1})
        assert await kill_backends(pg_url, name) >= 1
        # A read on a dead pooled connection is retried once, on a fresh connection.
        assert await repo.aget_state({"thread_id": "t", "user_id": "u"}) == {"n": 1}

        await repo.aget_state(config)
        assert await kill_backends(pg_url, name) >= 1
        # A write on a dead connection raises; it is not replayed behind the caller's back.
        with pytest.raises(DBAPIError) as err:
            await repo.aput_state(config, {"n": 2})
        assert err.value.connection_invalidated
        assert await repo.aget_state({"thread_id": "t", "user_id": "u"}) == {"n": 1}
        # The pool does not hand the dead connection out again: the next write succeeds.
        assert await repo.aput_state(config, {"n": 2}) == 2
    finally:
        await repo.aclose()
