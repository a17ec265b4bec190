"""The memory store on every backend of the contract suite (bare and cached, plain and
encrypted): a store made from the backend's checkpointer, sharing its database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tenxstore import MemoryStore
from tenxstore.store import Store
from tests.conftest import Backend, _with_encryption, backend_for

# The LangGraph store's suites: one backend per database (the Redis cache and the
# pooler change nothing a memory does), plain and encrypted as the run asks.
STORE_BACKENDS = _with_encryption(["memory", "sqlite", "postgresql", "mariadb"])


@pytest.fixture
async def memories(backend: Backend) -> Any:
    """A store on a migrated database (the backend's pooled store), its tables empty."""
    cp = await backend.make()
    store = MemoryStore(cp)
    yield store
    await store.aclose()  # leaves the checkpointer to the backend, which closes it


@pytest.fixture(params=STORE_BACKENDS)
async def store_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """One backend per database kind (see STORE_BACKENDS)."""
    async with backend_for(request.param, tmp_path) as b:
        yield b


@pytest.fixture
async def lg_memories(store_backend: Backend) -> AsyncIterator[MemoryStore]:
    """A memory store for the LangGraph store's suites, its tables empty."""
    store = MemoryStore(await store_backend.make())
    yield store
    await store.aclose()


class Clock:
    """The stores' clock, moved forward by a test instead of waited out.

    Every time a store stamps or compares (``Store.now``: expiries, ``updated_at``,
    idle cutoffs) reads this host's clock plus what the test has added, so a TTL of a
    minute expires on ``advance(61)`` at once, and a memory that must still be alive is
    never expired by a slow machine.
    """

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        """This host's time, moved forward by every ``advance``."""
        return datetime.now(timezone.utc) + self.offset

    def advance(self, seconds: float) -> None:
        """Move every store's time forward by ``seconds``."""
        self.offset += timedelta(seconds=seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Every store's clock, for this test only (see :class:`Clock`)."""
    c = Clock()
    monkeypatch.setattr(Store, "now", staticmethod(c.now))
    return c
