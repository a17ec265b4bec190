"""TenxStore: one store with two faces, users kept apart, TTLs, hostile labels, sync
calls, event loops, cancellation and big values (every database), and the rejections
(no database)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from langgraph.store.base import GetOp, InvalidNamespaceError, PutOp, SearchOp

from tenxstore import AuthPolicy, ConfigError, MemoryStore, SchemaNotReady, SerializationError
from tenxstore.langgraph import TenxStore
from tenxstore.langgraph.items import VALUE_TAG
from tenxstore.memory.sync import blocking as run_blocking
from tests.memory.conftest import Clock

NS = ("prefs",)


def test_the_langgraph_names_import_together() -> None:
    from tenxstore.langgraph import MemoryConfig, TenxCheckpointSaver, TenxStore, memory_tools

    assert {c.__name__ for c in (MemoryConfig, TenxCheckpointSaver, TenxStore)} == {
        "MemoryConfig",
        "TenxCheckpointSaver",
        "TenxStore",
    }
    assert callable(memory_tools)


BAD: list[tuple[str, Any, type[Exception]]] = [
    ("empty namespace", lambda s: s.put((), "k", {}), InvalidNamespaceError),
    ("dotted label", lambda s: s.put(("a.b",), "k", {}), InvalidNamespaceError),
    ("empty label", lambda s: s.put(("a", ""), "k", {}), InvalidNamespaceError),
    ("NUL label", lambda s: s.put(("a\x00",), "k", {}), InvalidNamespaceError),
    ("int label", lambda s: s.put((1,), "k", {}), InvalidNamespaceError),
    ("langgraph root", lambda s: s.put(("langgraph", "x"), "k", {}), InvalidNamespaceError),
    ("batch: empty", lambda s: s.batch([PutOp((), "k", {})]), InvalidNamespaceError),
    ("batch: dotted", lambda s: s.batch([PutOp(("a.b",), "k", {})]), InvalidNamespaceError),
    ("get dotted", lambda s: s.get(("a.b",), "k"), InvalidNamespaceError),
    ("search dotted", lambda s: s.search(("a.b",)), InvalidNamespaceError),
    ("list dotted", lambda s: s.list_namespaces(prefix=("a.b",)), InvalidNamespaceError),
    ("suffix empty", lambda s: s.list_namespaces(suffix=("a", "")), InvalidNamespaceError),
    ("long namespace", lambda s: s.put(("a" * 200, "b" * 60), "k", {}), ConfigError),
    ("surrogate label", lambda s: s.put(("\ud800",), "k", {}), ConfigError),
    ("empty key", lambda s: s.put(NS, "", {}), ConfigError),
    ("long key", lambda s: s.put(NS, "k" * 256, {}), ConfigError),
    ("NUL key", lambda s: s.get(NS, "a\x00"), ConfigError),
    ("int key in an op", lambda s: s.batch([GetOp(NS, 7)]), ConfigError),
    ("value not a dict", lambda s: s.put(NS, "k", ["x"]), SerializationError),
    ("value not JSON", lambda s: s.put(NS, "k", {"x": object()}), SerializationError),
    ("int keys", lambda s: s.put(NS, "k", {1: "x"}), SerializationError),
    ("surrogate value", lambda s: s.put(NS, "k", {"x": "\udfff"}), SerializationError),
    ("huge value", lambda s: s.put(NS, "k", {"x": "y" * (2 * 1024 * 1024)}), SerializationError),
    (
        "huge metadata",
        lambda s: s.put(NS, "k", {"content": "c", "metadata": {"m": "y" * 300_000}}),
        SerializationError,
    ),
    ("ttl negative", lambda s: s.put(NS, "k", {}, ttl=-1), ConfigError),
    ("ttl zero", lambda s: s.put(NS, "k", {}, ttl=0), ConfigError),
    ("ttl text", lambda s: s.put(NS, "k", {}, ttl="5"), ConfigError),
    ("index type", lambda s: s.put(NS, "k", {}, index="text"), ConfigError),
    ("filter operator", lambda s: s.search(NS, filter={"n": {"$regex": "."}}), ConfigError),
    ("filter order", lambda s: s.search(NS, filter={"n": {"$gt": [1]}}), ConfigError),
    ("filter $in", lambda s: s.search(NS, filter={"n": {"$in": 3}}), ConfigError),
    ("limit", lambda s: s.search(NS, limit=-1), ConfigError),
    ("offset", lambda s: s.search(NS, offset=-1), ConfigError),
    ("query type", lambda s: s.search(NS, query=3), ConfigError),
    ("max_depth", lambda s: s.list_namespaces(max_depth=0), ConfigError),
    ("unknown op", lambda s: s.batch(["get"]), ConfigError),
    ("ops as a str", lambda s: s.batch("ops"), ConfigError),
]


def test_rejections_come_before_any_io(tmp_path: Path) -> None:
    """A store never set up: any I/O would raise SchemaNotReady, so each rejection
    below happened before it."""
    memories = MemoryStore(f"sqlite:///{tmp_path / 'never-set-up.db'}")
    store = TenxStore(memories, user_id="alice")
    with pytest.raises(SchemaNotReady):
        store.get(NS, "k")
    for case, call, error in BAD:
        with pytest.raises(error):
            call(store)
        assert isinstance(error, type), case
    unbound = TenxStore(memories)
    with pytest.raises(ConfigError, match="for_user"):
        unbound.get(NS, "k")  # isolation applies and no run names a user
    with pytest.raises(ConfigError, match="acts for user 'alice'"):
        store.owner({"configurable": {"user_id": "bob"}})
    with pytest.raises(ConfigError, match="AuthPolicy"):
        store.owner({"configurable": {"auth_policy": {"enforce_user_isolation": False}}})
    for ttl in ({"omit_expired": False}, {"default_tll": 1}, {"default_ttl": -1}, "5"):
        with pytest.raises(ConfigError):
            TenxStore(memories, ttl=ttl)  # type: ignore[arg-type]
    indexed = TenxStore(memories, index={"dims": 2, "embed": lambda t: [[0.0, 1.0]]})
    assert indexed.index_config is not None and indexed.index_config["dims"] == 2  # no I/O
    with pytest.raises(ConfigError, match="dims"):
        TenxStore(memories, index={"embed": lambda t: [[0.0, 1.0]]})  # a function needs dims
    with pytest.raises(ConfigError):
        TenxStore(object())  # type: ignore[arg-type]
    memories.close()


async def test_one_store_two_faces(lg_memories: MemoryStore) -> None:
    store = TenxStore(lg_memories, user_id="alice")
    written = await lg_memories.astore(
        "alice", "Prefers window seats", metadata={"kind": "travel"}, namespace=NS, key="seat"
    )
    item = await store.aget(NS, "seat")
    assert item is not None and item.key == "seat" and item.namespace == NS
    assert item.value == {"content": "Prefers window seats", "metadata": {"kind": "travel"}}
    assert (item.created_at, item.updated_at) == (written.created_at, written.updated_at)
    [hit] = await store.asearch(NS, query="window")
    assert hit.key == "seat" and hit.score == 1.0

    # any other value: its JSON text, tagged; read back as it was put
    value = {"theme": "dark", "n": 2**70, "nested": {"z": [1, 2.5, None, "\x00"]}, "b": True}
    await store.aput(NS, "ui", value)
    assert (await store.aget(NS, "ui")).value == value  # type: ignore[union-attr]
    stored = await lg_memories.aget("alice", "ui", namespace=NS)
    assert stored is not None and stored.metadata == {VALUE_TAG: {"json": True}}
    assert [h.memory.key for h in await lg_memories.asearch("alice", "dark", namespace=NS)] == [
        "ui"
    ]
    # the memory shape through the store: a memory as the documents' API writes it
    await store.aput(NS, "tea", {"content": "Drinks green tea", "metadata": {"k": 1}})
    tea = await lg_memories.aget("alice", "tea", namespace=NS)
    assert tea is not None and (tea.content, tea.metadata) == ("Drinks green tea", {"k": 1})
    # lossless at the edges: the tag inside a memory-shaped value, a foreign tag
    edge = {"content": "c", "metadata": {VALUE_TAG: {"json": True}}}
    await store.aput(NS, "edge", edge)
    assert (await store.aget(NS, "edge")).value == edge  # type: ignore[union-attr]
    await lg_memories.astore("alice", "{}", metadata={VALUE_TAG: "mine"}, namespace=NS, key="f")
    assert (await store.aget(NS, "f")).value == {  # type: ignore[union-attr]
        "content": "{}",
        "metadata": {VALUE_TAG: "mine"},
    }
    tagged = {VALUE_TAG: {"json": True}}  # the tag over text that is not JSON: its text
    await lg_memories.astore("alice", "not json", metadata=tagged, namespace=NS, key="t")
    assert (await store.aget(NS, "t")).value == {"content": "not json", "metadata": {}}  # type: ignore[union-attr]
    # a put is the memory's next version; created_at stays
    await store.aput(NS, "seat", {"content": "Prefers aisle seats", "metadata": {}})
    again = await lg_memories.aget("alice", "seat", namespace=NS)
    assert again is not None and again.version == 2 and again.created_at == written.created_at
    await store.adelete(NS, "seat")
    assert await lg_memories.aget("alice", "seat", namespace=NS) is None


async def test_users_never_see_each_other(lg_memories: MemoryStore) -> None:
    alice, bob = TenxStore(lg_memories).for_user("alice"), TenxStore(lg_memories, user_id="bob")
    await alice.aput(NS, "k", {"who": "alice", "word": "secret"})
    await bob.aput(NS, "k", {"who": "bob"})
    await alice.aput(("alice-only", "x"), "k", {"who": "alice"})
    assert (await bob.aget(NS, "k")).value == {"who": "bob"}  # type: ignore[union-attr]
    assert [i.value["who"] for i in await bob.asearch((), query="secret alice")] == ["bob"]
    assert [i.value["who"] for i in await bob.asearch((), filter={"who": "alice"})] == []
    assert await bob.alist_namespaces() == [NS]
    assert await bob.alist_namespaces(prefix=("alice-only",)) == []
    await bob.adelete(NS, "k")
    assert (await alice.aget(NS, "k")).value["who"] == "alice"  # type: ignore[union-attr]
    # the user from the run config, when the store has none of its own
    unbound = TenxStore(lg_memories)
    assert unbound.owner({"configurable": {"user_id": "bob"}}) == "bob"
    # without isolation, one store every run shares
    shared = TenxStore(lg_memories, auth_policy=AuthPolicy(enforce_user_isolation=False))
    await shared.aput(NS, "k", {"who": "everyone"})
    operator = AuthPolicy(enforce_user_isolation=False)  # '*' is no user's: see below
    everyone = await lg_memories.aget("*", "k", namespace=NS, auth_policy=operator)
    assert everyone is not None and everyone.content == '{"who":"everyone"}'
    assert (await alice.aget(NS, "k")).value["who"] == "alice"  # type: ignore[union-attr]


async def test_ttl_in_minutes_refreshed_on_read_without_a_new_version(
    lg_memories: MemoryStore, clock: Clock
) -> None:
    store = TenxStore(lg_memories, user_id="alice", ttl={"default_ttl": 10})
    before = datetime.now(timezone.utc)
    await store.aput(NS, "k", {"v": 1})  # the default TTL: 10 minutes
    await store.aput(NS, "forever", {"v": 2}, ttl=None)
    first = await lg_memories.aget("alice", "k", namespace=NS)
    assert first is not None and first.expires_at is not None
    assert timedelta(minutes=9) < first.expires_at - before < timedelta(minutes=11)
    await store.aget(NS, "k", refresh_ttl=False)
    assert (await lg_memories.aget("alice", "k", namespace=NS)) == first
    clock.advance(1)
    await store.aget(NS, "k")  # refresh_on_read defaults to True
    moved = await lg_memories.aget("alice", "k", namespace=NS)
    assert moved is not None and moved.expires_at > first.expires_at  # type: ignore[operator]
    assert (moved.version, moved.updated_at, moved.content) == (1, first.updated_at, first.content)
    clock.advance(1)
    await store.asearch(NS)
    searched = await lg_memories.aget("alice", "k", namespace=NS)
    assert searched.expires_at > moved.expires_at  # type: ignore[operator,union-attr]
    assert (await lg_memories.aget("alice", "forever", namespace=NS)).expires_at is None  # type: ignore[union-attr]

    # refresh_on_read off: reads leave the expiry alone unless asked
    still = TenxStore(lg_memories, user_id="alice", ttl={"refresh_on_read": False})
    await still.aget(NS, "k")
    await still.asearch(NS)
    assert await lg_memories.aget("alice", "k", namespace=NS) == searched
    await still.aget(NS, "k", refresh_ttl=True)
    assert (await lg_memories.aget("alice", "k", namespace=NS)).version == 1  # type: ignore[union-attr]

    # expiry mid-run: gone from every read, swept later
    await store.aput(NS, "brief", {"v": 3}, ttl=1)  # a minute on the stores' clock
    assert (await store.aget(NS, "brief")) is not None
    clock.advance(61)
    assert await store.aget(NS, "brief") is None
    assert "brief" not in [i.key for i in await store.asearch(NS, query="3")]
    await store.aput(("brief-ns",), "b", {"v": 4}, ttl=1)
    clock.advance(61)
    assert ("brief-ns",) not in await store.alist_namespaces()
    assert await store.asweep_ttl() == 2
    await store.aput(NS, "brief", {"v": 5})  # a new life of the key
    assert (await lg_memories.aget("alice", "brief", namespace=NS)).version == 1  # type: ignore[union-attr]


def test_the_sweeper_thread_sweeps_and_stops() -> None:
    memories = MemoryStore("memory")
    memories.setup()
    store = TenxStore(memories, user_id="alice", ttl={"sweep_interval_minutes": 0.002})
    store.put(NS, "k", {"v": 1}, ttl=0.001)  # 60 ms; a sweep every 120 ms

    def rows() -> list[Any]:
        return run_blocking(memories.base.read(memories.rows.m.select()), "read")

    future = store.start_ttl_sweeper()
    deadline = time.monotonic() + 10
    while rows() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rows() == []  # the row itself is gone: swept
    assert store.stop_ttl_sweeper(timeout=5) is True
    assert future.done() and store.stop_ttl_sweeper() is True
    assert TenxStore(memories, user_id="a").start_ttl_sweeper().done()  # no TTL config
    memories.close()


async def test_hostile_labels_match_only_themselves(lg_memories: MemoryStore) -> None:
    store = TenxStore(lg_memories, user_id="alice")
    spaces = [("%",), ("a_b",), ("axb",), ("ab",), ("*",), ("\\",), ("'; --",), ("a\n",), ("a",)]
    spaces += [("ü", "日本"), ("a", "*", "c"), ("a", "b", "c"), ("x" * 120, "y" * 134)]
    for n, ns in enumerate(spaces):
        await store.aput(ns, "k", {"n": n})
    assert [i.namespace for i in await store.asearch(("%",))] == [("%",)]
    assert [i.namespace for i in await store.asearch(("a_b",))] == [("a_b",)]
    assert [i.namespace for i in await store.asearch(("*",))] == [("*",)]  # literal here
    assert {i.namespace for i in await store.asearch(("a",))} == {
        ("a",),
        ("a", "*", "c"),
        ("a", "b", "c"),
    }
    assert await store.alist_namespaces(prefix=("a_b",)) == [("a_b",)]
    assert await store.alist_namespaces(prefix=("a\n",)) == [("a\n",)]
    # in a listing's condition "*" is LangGraph's wildcard: any one label
    assert await store.alist_namespaces(prefix=("a", "*", "c")) == [
        ("a", "*", "c"),
        ("a", "b", "c"),
    ]
    assert await store.alist_namespaces(suffix=("*",), max_depth=1, limit=3) == [
        ("%",),
        ("'; --",),
        ("*",),
    ]
    # LangGraph's own root is refused by put, and open to batches (as in its stores)
    await store.abatch([PutOp(("langgraph", "x"), "k", {"v": 1})])
    assert (await store.aget(("langgraph", "x"), "k")).value == {"v": 1}  # type: ignore[union-attr]
    assert (await store.aget(("x" * 120, "y" * 134), "k")).value == {"n": 12}  # type: ignore[union-attr]


async def test_sync_calls_from_a_running_loop_and_across_loops(lg_memories: MemoryStore) -> None:
    store = TenxStore(lg_memories, user_id="alice")
    store.put(NS, "k", {"v": 1})  # blocks this loop while it runs elsewhere, as MemoryStore's twins
    assert store.get(NS, "k").value == {"v": 1}  # type: ignore[union-attr]
    assert (await store.aget(NS, "k")).value == {"v": 1}  # type: ignore[union-attr]

    def on_new_loops() -> list[Any]:
        async def use(n: int) -> Any:
            await store.aput(NS, f"loop{n}", {"n": n})
            return (await store.aget(NS, "k")).value  # type: ignore[union-attr]

        return [asyncio.run(use(n)) for n in range(2)]

    if lg_memories.repository.store.backend.name != "memory":  # an in-memory db is one loop's
        assert await asyncio.to_thread(on_new_loops) == [{"v": 1}, {"v": 1}]
        assert {i.key for i in await store.asearch(NS)} == {"k", "loop0", "loop1"}


async def test_a_cancelled_batch_writes_all_its_puts_or_none(lg_memories: MemoryStore) -> None:
    """The puts of a batch are one transaction: cancelled once it has sent some of
    them, none is kept."""
    store = TenxStore(lg_memories, user_id="alice")
    ops = [PutOp(NS, f"k{n}", {"n": n, "pad": "x" * 1000}) for n in range(3000)]
    loop = asyncio.get_running_loop()
    sent = asyncio.Event()

    def seen(sql: str) -> None:
        if "INSERT INTO" in sql and "memories" in sql:
            loop.call_soon_threadsafe(sent.set)

    stop = lg_memories.backend.on_statement(seen)
    try:
        task = asyncio.ensure_future(store.abatch(ops))
        await sent.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        stop()
    assert await store.asearch(NS, limit=1000) == []
    await store.aput(NS, "after", {"ok": True})  # the store goes on
    assert (await store.aget(NS, "after")).value == {"ok": True}  # type: ignore[union-attr]


async def test_a_big_value_round_trips(lg_memories: MemoryStore) -> None:
    store = TenxStore(lg_memories, user_id="alice")
    value = {"text": "é" * 600_000, "list": list(range(20_000))}  # ~1.3 MB of JSON
    [_, got] = await store.abatch([PutOp(NS, "big", value), GetOp(NS, "big")])
    assert got is None  # the batch's read came first
    assert (await store.aget(NS, "big")).value == value  # type: ignore[union-attr]
    [found] = await store.abatch([SearchOp(NS, filter={"list": list(range(20_000))})])
    assert [i.key for i in found] == ["big"]  # type: ignore[union-attr]


async def test_no_end_user_owns_the_shared_items(lg_memories: MemoryStore) -> None:
    """The owner of a shared store's items and of an agent's memories ('*', 0 for int
    ids) is reserved: an end user given that id reads, lists and deletes nothing of
    theirs, while the shared store, the agent's tools and the operator still reach
    them."""
    from langchain_core.messages import HumanMessage

    from tenxstore.langgraph import SHARED_USER, MemoryConfig

    shared = TenxStore(lg_memories, auth_policy=AuthPolicy(enforce_user_isolation=False))
    await shared.aput(("config",), "api", {"secret": "shared-only"})
    memory = MemoryConfig(TenxStore(lg_memories), agent_scoped_tool=True, agent_id="helper")
    tools = {t.name: t for t in memory.tools()}
    run = {"configurable": {"user_id": "alice"}}
    await tools["save_agent_memory"].ainvoke({"content": "discount code Z9"}, config=run)
    await tools["save_memory"].ainvoke({"content": "alice likes codes"}, config=run)

    with pytest.raises(ConfigError, match="reserved"):
        TenxStore(lg_memories).for_user(SHARED_USER)
    star = {"configurable": {"user_id": SHARED_USER}}
    with pytest.raises(ConfigError, match="reserved"):
        await tools["search_memory"].ainvoke({"query": "code"}, config=star)
    for call in (
        lambda: lg_memories.aget(SHARED_USER, "api", namespace=("config",)),
        lambda: lg_memories.alist(SHARED_USER, namespace=()),
        lambda: lg_memories.asearch(SHARED_USER, "code", namespace=()),
        lambda: lg_memories.ahistory(SHARED_USER, "api", namespace=("config",)),
        lambda: lg_memories.aupdate(SHARED_USER, "api", content="x", namespace=("config",)),
        lambda: lg_memories.adelete(SHARED_USER, "api", namespace=("config",)),
        lambda: lg_memories.astore(SHARED_USER, "planted", namespace=("agents", "helper")),
        lambda: lg_memories.alist_namespaces(SHARED_USER),
    ):
        with pytest.raises(ConfigError, match="reserved"):
            await call()

    # nothing was written or deleted; the shared store, the agent and the operator see it all
    assert await shared.aget(("config",), "api") is not None
    found = await tools["search_agent_memory"].ainvoke({"query": "discount code"}, config=run)
    assert "Z9" in found
    hits = await memory.aretrieve([HumanMessage("any discount code?")], run)
    assert {h.memory.content for h in hits} >= {"discount code Z9"}
    operator = AuthPolicy(enforce_user_isolation=False)
    every = await lg_memories.alist(None, namespace=(), auth_policy=operator)
    assert sorted(m.namespace for m in every if m.user_id == SHARED_USER) == [
        ("agents", "helper"),
        ("config",),
    ]
    kept = await lg_memories.ahistory(
        SHARED_USER, "api", namespace=("config",), auth_policy=operator
    )
    assert len(kept) == 1
    assert [m.content for m in await lg_memories.alist("alice", namespace=())] == [
        "alice likes codes"
    ]
