"""Review: the procedure in a database whose default character set is not the tables'."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import make_url

from tenxstore import CheckpointRepository
from tests import services
from tests.conftest import cfg, mysql_admin


@pytest.fixture(params=["latin1", "utf8mb3"])
async def odd_db(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    base = make_url(services.mysql_url())
    name = f"review_{uuid.uuid4().hex[:12]}"
    await mysql_admin(str(base), f"CREATE DATABASE `{name}` DEFAULT CHARACTER SET {request.param}")
    yield base.set(database=name).render_as_string(hide_password=False)
    await mysql_admin(str(base), f"DROP DATABASE `{name}`")


async def test_astral_and_non_latin_text_round_trips_through_the_procedure(odd_db: str) -> None:
    repo = CheckpointRepository(odd_db)
    try:
        await repo.asetup()
        config = cfg("t", "u")
        await repo.aput_state(config, {"n": 0})
        text = "Grüße 😀 Привет 日本"
        messages = [{"id": "id-" + text, "role": "r-" + text, "content": text}]
        outcome = await repo.aput_checkpoint(config, {"s": text}, messages)
        assert outcome == 2
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
        got = await repo.aget_messages(config)
        assert [m["content"] for m in got] == ["first", "second"]
    finally:
        await repo.aclose()
