"""What is Mem0Store's own (beside the contract it shares with MemoryStore): Mem0's
``add`` passed through (``infer``), what Mem0 cannot do refused by name, a sync Mem0
``Memory`` as well as an ``AsyncMemory``, Mem0's own memories kept apart, and
tenxstore without mem0 installed. Offline: no LLM, no socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tenxstore import AuthPolicy, ConfigError
from tenxstore.memory import mem0_support
from tenxstore.memory.mem0 import Mem0Store, local_mem0
from tests import services
from tests.memory.embeddings import HashingEmbedding


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any socket connection fails the test (SQLite and local Qdrant need none); and
    mem0 is required (the ``mem0`` extra: a failure under CI, else a skip)."""
    services.require_modules("mem0", "mem0")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a network connection was attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Mem0Store]:
    s = Mem0Store(local_mem0(tmp_path / "qdrant", embedding=HashingEmbedding()), infer=False)
    yield s
    await s.aclose()


async def test_add_without_infer_stores_each_message_under_its_mem0_id(store: Mem0Store) -> None:
    made = await store.aadd(
        "alice",
        [
            {"role": "system", "content": "not stored"},
            {"role": "user", "content": "I moved to Porto"},
            {"role": "assistant", "content": "Noted: Porto"},
        ],
        namespace=("memories", "chat"),
        metadata={"source": "chat"},
    )
    assert [m.content for m in made] == ["I moved to Porto", "Noted: Porto"]
    for m in made:
        assert (m.version, m.namespace, m.metadata) == (1, ("memories", "chat"), {"source": "chat"})
        assert m.created_at == m.updated_at
        assert await store.aget("alice", m.key, namespace=("memories", "chat")) == m
        assert await store.aget("bob", m.key, namespace=("memories", "chat")) is None
    hits = await store.asearch("alice", "Porto")
    assert {h.memory.key for h in hits} == {m.key for m in made}
    updated = await store.aupdate("alice", made[0].key, content="I moved to Lisbon",
                                  namespace=("memories", "chat"))  # fmt: skip
    assert updated.version == 2


async def test_add_with_infer_needs_an_llm_and_says_so(tmp_path: Path) -> None:
    memory = local_mem0(tmp_path / "q", embedding=HashingEmbedding())
    store = Mem0Store(memory)  # infer=True: Mem0's default
    with pytest.raises(ConfigError, match="no LLM"):
        await store.aadd("alice", "I like tea")
    assert memory.llm.calls == 1  # asked, refused: nothing else was called
    assert await store.alist("alice", namespace=()) == []
    await store.aclose()


async def test_what_mem0_cannot_do_is_refused_before_any_write(store: Mem0Store) -> None:
    with pytest.raises(ConfigError, match="isolation"):
        await store.aget("alice", "k", auth_policy=AuthPolicy(enforce_user_isolation=False))
    with pytest.raises(ConfigError, match="whitespace"):
        await store.astore("alice smith", "x")
    with pytest.raises(ConfigError, match="whitespace"):
        await store.aget(" alice", "k")  # Mem0 would trim it to another user's id
    with pytest.raises(ConfigError, match="embed"):
        await store.astore("alice", "x", embed=False)
    with pytest.raises(ConfigError, match="embed"):
        await store.astore("alice", "x", embed="other text")
    with pytest.raises(ConfigError, match="mode"):
        await store.asearch("alice", "x", mode="keyword")
    with pytest.raises(ConfigError):
        await store.aadd("alice", "x", infer="yes")  # type: ignore[arg-type]
    assert await store.alist("alice", namespace=()) == []
    with pytest.raises(ConfigError, match="mem0 Memory"):
        Mem0Store(object())
    with pytest.raises(ConfigError, match="infer"):
        Mem0Store(store.memory, infer=None)  # type: ignore[arg-type]


async def test_a_whitespace_query_finds_nothing(store: Mem0Store) -> None:
    await store.astore("alice", "tea", key="k")
    assert await store.asearch("alice", "   ") == []
    assert await store.asearch("alice", "") == []


async def test_mem0s_own_memories_are_not_this_stores(store: Mem0Store) -> None:
    await store.memory.add("written through Mem0 itself", user_id="alice", infer=False)
    await store.astore("alice", "written through the store", key="k")
    assert [m.key for m in await store.alist("alice", namespace=())] == ["k"]
    assert [h.memory.key for h in await store.asearch("alice", "written", namespace=())] == ["k"]


async def test_a_sync_mem0_memory_works_the_same(tmp_path: Path) -> None:
    memory = local_mem0(tmp_path / "q", embedding=HashingEmbedding(), asynchronous=False)
    store = Mem0Store(memory)
    made = await store.astore("alice", "espresso", key="k", ttl=3600)
    assert (await store.aupdate("alice", "k", metadata={"a": 1})).version == 2
    assert [h.memory.key for h in await store.asearch("alice", "espresso")] == ["k"]
    got = await store.aget("alice", "k")
    assert got is not None and got.expires_at == made.expires_at
    assert await store.adelete("alice", "k") is True
    await store.aclose()


def test_without_mem0_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "mem0", None)  # import mem0 raises ImportError
    with pytest.raises(ConfigError, match=r"tenxstore\[mem0\]"):
        local_mem0(tmp_path, embedding=HashingEmbedding())
    with pytest.raises(ConfigError, match=r"tenxstore\[mem0\]"):
        mem0_support.import_mem0()


def test_tenxstore_imports_without_importing_mem0() -> None:
    code = (
        "import sys, tenxstore, tenxstore.langgraph, tenxstore.memory.mem0; "
        "from tenxstore.memory import Mem0Store; "
        "assert 'mem0' not in sys.modules, 'mem0 was imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


class _FiltersIgnored:
    """A Mem0 memory whose searches and listings ignore every filter: each user's
    results come back (as a vector store that matched a filter otherwise would)."""

    def __init__(self, real: Any, users: list[str]) -> None:
        self.real, self.users = real, users

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def _every(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        results: list[Any] = []
        for user in self.users:
            kwargs["filters"] = {"user_id": user}
            results += (await getattr(self.real, method)(*args, **kwargs))["results"]
        return {"results": results}

    async def search(self, query: str, **kwargs: Any) -> dict[str, Any]:
        return await self._every("search", query, **kwargs)

    async def get_all(self, **kwargs: Any) -> dict[str, Any]:
        return await self._every("get_all", **kwargs)


async def test_results_are_checked_again_for_user_namespace_and_key(store: Mem0Store) -> None:
    await store.astore("alice", "green tea", key="k")
    await store.astore("alice", "green tea too", key="k", namespace=("other",))
    await store.astore("alice", "green tea again", key="j")
    await store.astore("bob", "green tea for bob", key="k")
    leaky = Mem0Store(_FiltersIgnored(store.memory, ["alice", "bob"]), infer=False)
    hits = await leaky.asearch("alice", "green tea", limit=10)
    assert {(h.memory.user_id, h.memory.namespace, h.memory.key) for h in hits} == {
        ("alice", ("memories",), "k"),
        ("alice", ("memories",), "j"),
    }
    got = await leaky.aget("bob", "k")
    assert got is not None and got.content == "green tea for bob"
    assert [m.key for m in await leaky.alist("bob")] == ["k"]
    assert await leaky.aget("carol", "k") is None
