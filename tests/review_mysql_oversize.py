"""Review: the hot path refuses (SerializationError) a write the locked path stores:
its size check assumes text-protocol escaping of a CALL whose messages are JSON of
JSON (escaped twice), though the prepared CALL sends values unescaped."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tenxstore import CheckpointRepository
from tests import services
from tests.conftest import cfg, mysql_admin, new_mysql_database


@pytest.fixture
async def mysql_url() -> AsyncIterator[str]:
    url, name = await new_mysql_database()
    yield url
    await mysql_admin(services.mysql_url(), f"DROP DATABASE `{name}`")


async def test_a_write_the_locked_path_stores_is_stored(mysql_url: str) -> None:
    """2.5 MB of quotes in one message: ~5 MB as stored, ~10 MB as the CALL's JSON,
    well under max_allowed_packet (16 MB here); 534cf5e stores it."""
    repo = CheckpointRepository(mysql_url)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        content = '"' * 2_500_000
        assert await repo.aput_checkpoint(config, {"n": 1}, [{"role": "user", "content": content}]) == 2
        assert (await repo.aget_messages(config))[0]["content"] == content
    finally:
        await repo.aclose()
