"""Fixtures the contract modules share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests import services
from tests.conftest import mysql_admin, new_mysql_database


@pytest.fixture
async def mysql_db() -> AsyncIterator[tuple[str, str]]:
    """A fresh MariaDB database: (URL, name), dropped afterwards."""
    url, name = await new_mysql_database()
    yield url, name
    await mysql_admin(services.mysql_url(), f"DROP DATABASE `{name}`")
