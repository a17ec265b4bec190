"""The memory store on every backend of the contract suite (bare and cached, plain and
encrypted): a store made from the backend's checkpointer, sharing its database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tenxstore import MemoryStore
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
