"""Hostile input, property-based, on every backend; and a stateful model comparison.

Hypothesis drives synchronous tests, so each backend lives on an event loop of its
own in a background thread for the whole module, and every example works in fresh
thread ids so examples never see each other's data.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import tenxstore
from tenxstore import (
    SerializationError,
    StaleStateError,
    ThreadOwnershipError,
)
from tests import services
from tests.contract.test_data import json_values, same

T = TypeVar("T")
BACKENDS = ["memory", "sqlite", "postgresql", "postgresql+redis"]


class Loop:
    """An event loop in a background thread; ``run`` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Store:
    """One backend for the module, driven from synchronous code."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name, self.loop = name, Loop()
        self.schema: str | None = None
        if name == "memory":
            self.cp: Any = tenxstore.InMemoryCheckpointer()
        elif name == "sqlite":
            self.cp = tenxstore.SqliteCheckpointer(directory / "props.db")
        else:
            self.schema = f"p_{uuid.uuid4().hex[:12]}"
            self.cp = tenxstore.CheckpointRepository(services.pg_url(), schema=self.schema)
            if name.endswith("+redis"):
                self.cp = tenxstore.CachedCheckpointer(
                    self.cp, redis_url=services.redis_url(), key_prefix=self.schema
                )
        self.run(self.cp.asetup())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run(coro)

    def close(self) -> None:
        self.run(self.cp.aclose())
        self.loop.close()
        if self.schema:
            from tests.conftest import drop_schema

            asyncio.run(drop_schema(services.pg_url(), self.schema))


@pytest.fixture(scope="module", params=BACKENDS)
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    s = Store(request.param, tmp_path_factory.mktemp(request.param.replace("+", "_")))
    yield s
    s.close()


def fresh(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


ids = st.text(min_size=1, max_size=120).filter(lambda s: "\x00" not in s)
PROPS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@PROPS
@given(value=json_values)
def test_any_json_value_round_trips_everywhere(store: Store, value: Any) -> None:
    config = {"thread_id": fresh(), "user_id": "u"}

    async def go() -> None:
        await store.cp.aput_checkpoint(config, {"v": value}, [{"id": "m", "v": value}])
        await store.cp.aput_thread(config, metadata={"v": value})
        got = await store.cp.arun_tool_once(config, "c", "echo", {"v": value}, lambda v: v)
        assert same(got, value)
        reader = {"thread_id": config["thread_id"], "user_id": "u"}
        assert same(await store.cp.aget_state(reader), {"v": value})
        assert same(await store.cp.aget_state_cache(dict(reader)), {"v": value})
        [message] = await store.cp.aget_messages(reader)
        assert same(message, {"id": "m", "v": value})
        info = await store.cp.aget_thread(reader)
        assert info is not None and same(info.metadata, {"v": value})
        record = await store.cp.aget_tool_execution(reader, "c")
        assert record is not None and same(record.result, value) and same(record.args, {"v": value})

    store.run(go())


@PROPS
@given(thread=ids, user=ids, other=ids, message_id=ids)
def test_any_ids_round_trip_and_stay_private(
    store: Store, thread: str, user: str, other: str, message_id: str
) -> None:
    assume(user != other)
    thread = f"{uuid.uuid4().hex}{thread}"
    mine = {"thread_id": thread, "user_id": user}
    theirs = {"thread_id": thread, "user_id": other}

    async def go() -> None:
        await store.cp.aput_checkpoint(mine, {"owner": user}, [{"id": message_id}])
        await store.cp.arun_tool_once(mine, message_id, "t", {}, lambda: user)
        assert await store.cp.aget_state(dict(mine)) == {"owner": user}
        assert [m["id"] for m in await store.cp.aget_messages(mine)] == [message_id]
        assert await store.cp.aget_messages(mine, after_id=message_id) == []
        info = await store.cp.aget_thread(mine)
        assert info is not None and (info.thread_id, info.user_id) == (thread, user)
        assert await store.cp.aget_state(dict(theirs)) is None
        assert await store.cp.aget_state_cache(dict(theirs)) is None
        assert await store.cp.aget_messages(theirs) == []
        assert await store.cp.alist_states(theirs) == []
        assert await store.cp.aget_thread(theirs) is None
        assert await store.cp.aget_tool_execution(theirs, message_id) is None
        assert thread not in {t.thread_id for t in await store.cp.alist_threads(theirs)}
        with pytest.raises(ThreadOwnershipError):
            await store.cp.aput_state(dict(theirs), {"owner": other})
        assert await store.cp.aget_state(dict(mine)) == {"owner": user}

    store.run(go())


lone_surrogates = st.text(
    alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=3
).flatmap(lambda bad: st.text(max_size=20).map(lambda ok: ok + bad))
bad_ids = st.one_of(
    lone_surrogates,
    st.just(""),
    st.text(min_size=256, max_size=300),
    st.text(max_size=20).map(lambda ok: ok + "\x00"),
    st.integers(),
    st.floats(),
    st.binary(),
    st.booleans(),
    st.lists(st.text(max_size=3), max_size=2),
)
out_of_range = st.one_of(st.integers(min_value=2**63), st.integers(max_value=-1))


@PROPS
@given(bad=bad_ids, where=st.sampled_from(["thread", "user", "call", "tool", "after"]))
def test_bad_ids_are_config_errors_before_any_io(store: Store, bad: Any, where: str) -> None:
    thread = fresh()
    config = {"thread_id": bad if where == "thread" else thread}
    config["user_id"] = bad if where == "user" else "u"
    call = bad if where == "call" else "c"
    tool = bad if where == "tool" else "t"

    async def go() -> None:
        cp = store.cp
        attempts: list[Any] = [lambda: cp.arun_tool_once(dict(config), call, tool, {}, lambda: 1)]
        if where in ("thread", "user"):
            attempts += [
                lambda: cp.aput_state(dict(config), {"x": 1}),
                lambda: cp.aget_state(dict(config)),
                lambda: cp.aput_thread(dict(config), name="n"),
                lambda: cp.aclean_thread(dict(config)),
            ]
        if where == "after":
            attempts = [lambda: cp.aget_messages(dict(config), after_id=bad)]
        for attempt in attempts:
            with pytest.raises(tenxstore.ConfigError):
                await attempt()
        assert await store.cp.aget_thread({"thread_id": thread, "user_id": "u"}) is None

    store.run(go())


@PROPS
@given(count=out_of_range)
def test_counts_beyond_the_database_range_are_config_errors(store: Store, count: int) -> None:
    config = {"thread_id": fresh(), "user_id": "u"}

    async def go() -> None:
        for attempt in (
            store.cp.alist_states(dict(config), limit=count),
            store.cp.aget_messages(dict(config), limit=count),
            store.cp.alist_threads({"user_id": "u"}, limit=count),
            store.cp.alist_threads({"user_id": "u"}, offset=count),
            store.cp.aput_state({**config, "_checkpoint_version": count}, {"x": 1}),
        ):
            with pytest.raises(tenxstore.ConfigError):
                await attempt

    store.run(go())


class Opaque:
    """Not JSON."""


unserializable = st.sampled_from([Opaque(), {1, 2}, 1 + 2j, b"raw", (lambda: 0), {3: "int key"}])


@PROPS
@given(value=json_values, bad=unserializable, where=st.sampled_from(["state", "message", "meta"]))
def test_unserializable_values_write_nothing(
    store: Store, value: Any, bad: Any, where: str
) -> None:
    config = {"thread_id": fresh(), "user_id": "u"}
    poisoned = [value, {"deep": [bad]}]

    async def go() -> None:
        with pytest.raises(SerializationError):
            if where == "state":
                await store.cp.aput_checkpoint(config, {"v": poisoned}, [{"id": "m"}])
            elif where == "message":
                await store.cp.aput_checkpoint(config, {"v": value}, [{"id": "m", "v": poisoned}])
            else:
                await store.cp.aput_thread(config, metadata={"v": poisoned})
        with pytest.raises(SerializationError):
            await store.cp.arun_tool_once(config, "c", "t", {}, lambda: poisoned)
        reader = {"thread_id": config["thread_id"], "user_id": "u"}
        assert await store.cp.aget_state(reader) is None
        assert await store.cp.aget_messages(reader) == []
        record = await store.cp.aget_tool_execution(reader, "c")
        # The body ran: recorded as done, without a result, and never run again.
        assert record is not None and (record.status, record.result) == ("succeeded", None)
        with pytest.raises(SerializationError):
            await store.cp.arun_tool_once(config, "c", "t", {}, lambda: pytest.fail("ran"))

    store.run(go())


# -- a stateful comparison with an obviously correct model ---------------------------


class Model:
    """What the store must hold, in plain Python."""

    def __init__(self) -> None:
        self.owner: dict[str, str] = {}
        self.version: dict[str, int] = {}
        self.state: dict[str, Any] = {}
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.name: dict[str, str | None] = {}
        self.tools: dict[tuple[str, int], Any] = {}


THREADS = st.sampled_from(["a", "b", "c"])
USERS = st.sampled_from(["u1", "u2"])


def machine_for(store: Store) -> type[RuleBasedStateMachine]:
    class StoreMachine(RuleBasedStateMachine):
        @initialize()
        def start(self) -> None:
            self.prefix = uuid.uuid4().hex[:8]
            self.model = Model()
            self.ran: list[tuple[str, int, int]] = []  # thread, its life, tool
            self.life: dict[str, int] = {}  # a cleaned thread starts a new life

        def config(self, thread: str, user: str) -> dict[str, Any]:
            return {"thread_id": f"{self.prefix}-{thread}", "user_id": user}

        def visible(self, thread: str, user: str) -> bool:
            return self.model.owner.get(thread) == user

        @rule(
            thread=THREADS,
            user=USERS,
            value=json_values,
            stale=st.booleans(),
            read_first=st.booleans(),
            message=st.sampled_from(["m1", "m2", "m3", None]),
        )
        def write(
            self,
            thread: str,
            user: str,
            value: Any,
            stale: bool,
            read_first: bool,
            message: str | None,
        ) -> None:
            config = self.config(thread, user)
            current = self.model.version.get(thread, 0)
            if read_first:
                config["_checkpoint_version"] = max(0, current - 1) if stale else current
            messages = [] if message is None else [{"id": message, "v": value}]
            owned_by_other = thread in self.model.owner and self.model.owner[thread] != user
            conflict = read_first and config["_checkpoint_version"] != current
            try:
                version = store.run(store.cp.aput_checkpoint(config, {"v": value}, messages))
            except ThreadOwnershipError:
                assert owned_by_other
                return
            except StaleStateError as exc:
                assert conflict and not owned_by_other
                assert (exc.expected_version, exc.actual_version) == (
                    config["_checkpoint_version"],
                    current,
                )
                return
            assert not owned_by_other and not conflict
            assert version == current + 1
            self.model.owner.setdefault(thread, user)
            self.model.name.setdefault(thread, None)
            self.model.version[thread] = version
            self.model.state[thread] = {"v": value}
            stored = self.model.messages.setdefault(thread, [])
            for m in messages:
                if all(s["id"] != m["id"] for s in stored):
                    stored.append(m)

        @rule(thread=THREADS, user=USERS, cached=st.booleans())
        def read(self, thread: str, user: str, cached: bool) -> None:
            config = self.config(thread, user)
            read = store.cp.aget_state_cache if cached else store.cp.aget_state
            got = store.run(read(config))
            if self.visible(thread, user):
                assert same(got, self.model.state.get(thread))
                assert config["_checkpoint_version"] == self.model.version.get(thread, 0)
            else:
                assert got is None and config["_checkpoint_version"] == 0

        @rule(thread=THREADS, user=USERS, limit=st.none() | st.integers(0, 3))
        def messages(self, thread: str, user: str, limit: int | None) -> None:
            got = store.run(store.cp.aget_messages(self.config(thread, user), limit=limit))
            expected = self.model.messages.get(thread, []) if self.visible(thread, user) else []
            assert same(got, expected[:limit] if limit is not None else expected)

        @rule(thread=THREADS, user=USERS, name=st.text(max_size=10))
        def rename(self, thread: str, user: str, name: str) -> None:
            config = self.config(thread, user)
            if thread in self.model.owner and self.model.owner[thread] != user:
                with pytest.raises(ThreadOwnershipError):
                    store.run(store.cp.aput_thread(config, name=name))
                return
            info = store.run(store.cp.aput_thread(config, name=name))
            self.model.owner.setdefault(thread, user)
            self.model.version.setdefault(thread, 0)
            self.model.name[thread] = name
            assert (info.name, info.version) == (name, self.model.version[thread])

        @rule(thread=THREADS, user=USERS)
        def clean(self, thread: str, user: str) -> None:
            config = self.config(thread, user)
            if thread in self.model.owner and self.model.owner[thread] != user:
                with pytest.raises(ThreadOwnershipError):
                    store.run(store.cp.aclean_thread(config))
                return
            assert store.run(store.cp.aclean_thread(config)) == (thread in self.model.owner)
            for table in (
                self.model.owner,
                self.model.version,
                self.model.state,
                self.model.messages,
                self.model.name,
            ):
                table.pop(thread, None)  # type: ignore[attr-defined]
            self.model.tools = {k: v for k, v in self.model.tools.items() if k[0] != thread}
            self.life[thread] = self.life.get(thread, 0) + 1

        @rule(thread=THREADS, user=USERS, k=st.integers(0, 2))
        def tool(self, thread: str, user: str, k: int) -> None:
            config = self.config(thread, user)

            def body() -> list[Any]:
                self.ran.append((thread, self.life.get(thread, 0), k))
                return [thread, k, len(self.ran)]

            if thread in self.model.owner and self.model.owner[thread] != user:
                with pytest.raises(ThreadOwnershipError):
                    store.run(store.cp.arun_tool_once(config, f"c{k}", "t", {}, body))
                return
            got = store.run(store.cp.arun_tool_once(config, f"c{k}", "t", {}, body))
            self.model.owner.setdefault(thread, user)
            self.model.version.setdefault(thread, 0)
            self.model.name.setdefault(thread, None)
            expected = self.model.tools.setdefault((thread, k), got)
            assert got == expected  # the first result, replayed

        @rule(user=USERS)
        def listing(self, user: str) -> None:
            listed = store.run(store.cp.alist_threads({"user_id": user}, limit=1000))
            mine = {t.thread_id for t in listed if t.thread_id.startswith(self.prefix)}
            expected = {f"{self.prefix}-{t}" for t, o in self.model.owner.items() if o == user}
            assert mine == expected

        @invariant()
        def tools_ran_at_most_once_per_life(self) -> None:
            assert len(self.ran) == len(set(self.ran))

    return StoreMachine


def test_the_store_behaves_like_the_model(store: Store) -> None:
    run_state_machine_as_test(
        machine_for(store),
        settings=settings(
            max_examples=15,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
