"""User isolation, hostile ids and bad input (every backend)."""

from __future__ import annotations

from typing import Any

import pytest

from tenxstore import (
    AuthPolicy,
    CheckpointRepository,
    ConfigError,
    MissingThreadId,
    SerializationError,
    ThreadOwnershipError,
)
from tests.conftest import Backend, cfg

HOSTILE_IDS = [
    "a'b",
    'a"b',
    "%",
    "_",
    "a%_b",
    "back\\slash",
    "new\nline",
    "tab\there",
    "🧵👩‍💻",
    "' OR 1=1 --",
    "x" * 255,
    "*",
    "a:b",
    " ",
]


async def test_another_users_thread_reads_as_absent_everywhere(cp: CheckpointRepository) -> None:
    await cp.aput_checkpoint(cfg(), {"secret": 1}, [{"id": "m1", "content": "private"}])
    await cp.aput_thread(cfg(), name="mine")
    mallory = cfg(user="mallory")
    assert await cp.aget_state(mallory) is None
    assert mallory["_checkpoint_version"] == 0
    assert await cp.aget_state_cache(cfg(user="mallory")) is None
    assert await cp.alist_states(cfg(user="mallory")) == []
    assert await cp.aget_messages(cfg(user="mallory")) == []
    assert await cp.aget_thread(cfg(user="mallory")) is None
    assert await cp.alist_threads({"user_id": "mallory"}) == []
    assert [t.thread_id for t in await cp.alist_threads({"user_id": "alice"})] == ["t1"]


async def test_writes_and_deletes_to_another_users_thread_raise(cp: CheckpointRepository) -> None:
    await cp.aput_state(cfg(), {"v": 1})
    for call in (
        cp.aput_state(cfg(user="mallory"), {"v": "hijack"}),
        cp.aput_checkpoint(cfg(user="mallory"), {"v": 2}, [{"id": "x"}]),
        cp.aput_thread(cfg(user="mallory"), name="mine now"),
        cp.aclean_thread(cfg(user="mallory")),
    ):
        with pytest.raises(ThreadOwnershipError):
            await call
    assert await cp.aget_state(cfg()) == {"v": 1}
    assert await cp.aget_messages(cfg()) == []
    info = await cp.aget_thread(cfg())
    assert info is not None and info.name is None and info.version == 1


async def test_auth_policy_overrides_isolation_per_call(cp: CheckpointRepository) -> None:
    await cp.aput_state(cfg(), {"v": 1})
    admin = {"thread_id": "t1", "auth_policy": AuthPolicy(enforce_user_isolation=False)}
    assert await cp.aget_state(admin) == {"v": 1}
    assert {t.thread_id for t in await cp.alist_threads(admin)} == {"t1"}
    strict = cfg(user="mallory", auth_policy=AuthPolicy(enforce_user_isolation=True))
    assert await cp.aget_state(strict) is None
    with pytest.raises(ConfigError):
        await cp.aget_state({"thread_id": "t1", "auth_policy": AuthPolicy(True)})


async def test_isolation_off_shares_threads(backend: Backend) -> None:
    cp = await backend.make(enforce_user_isolation=False)
    await cp.aput_state({"thread_id": "shared"}, {"v": 1})
    await cp.aput_state({"thread_id": "shared", "user_id": "bob"}, {"v": 2})
    assert await cp.aget_state({"thread_id": "shared", "user_id": "carol"}) == {"v": 2}
    assert [t.thread_id for t in await cp.alist_threads({})] == ["shared"]
    with pytest.raises(ConfigError):
        await cp.aget_state({"thread_id": "shared", "auth_policy": AuthPolicy(True)})


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
async def test_ids_are_data(cp: CheckpointRepository, hostile: str) -> None:
    await cp.aput_checkpoint(cfg("plain", "plain"), {"who": "plain"}, [{"id": "p"}])
    config = cfg(hostile, hostile)
    await cp.aput_checkpoint(config, {"who": hostile}, [{"id": hostile, "c": hostile}])
    assert await cp.aget_state(cfg(hostile, hostile)) == {"who": hostile}
    assert await cp.aget_messages(cfg(hostile, hostile), after_id=hostile) == []
    assert [m["id"] for m in await cp.aget_messages(cfg(hostile, hostile))] == [hostile]
    [info] = await cp.alist_threads({"user_id": hostile})
    assert (info.thread_id, info.user_id) == (hostile, hostile)
    assert await cp.aget_state(cfg("plain", hostile)) is None
    assert await cp.aget_state(cfg(hostile, "plain")) is None
    assert await cp.aget_state(cfg("plain", "plain")) == {"who": "plain"}
    assert await cp.aclean_thread(cfg(hostile, hostile)) is True
    assert await cp.aget_state(cfg("plain", "plain")) == {"who": "plain"}


# One of each kind here, where nothing must be written either; every rejected value
# against every call (and the cache) is tests/unit/test_validation.py.
BAD_IDS = ["", 12]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
async def test_bad_ids_are_config_errors_before_any_io(cp: CheckpointRepository, bad: Any) -> None:
    calls = [
        lambda c: cp.aget_state(c),
        lambda c: cp.aput_state(c, {"x": 1}),
        lambda c: cp.aput_checkpoint(c, {"x": 1}, [{"id": "m"}]),
        lambda c: cp.alist_states(c),
        lambda c: cp.aget_messages(c),
        lambda c: cp.aput_thread(c, name="n"),
        lambda c: cp.aget_thread(c),
        lambda c: cp.aclean_thread(c),
    ]
    for call in calls:
        for config in (cfg(thread=bad), cfg(user=bad)):
            if bad is None and config.get("thread_id") is not None:
                continue  # a missing user_id is tested below
            with pytest.raises(ConfigError):
                await call(config)
    with pytest.raises(ConfigError):
        await cp.alist_threads({"user_id": bad} if bad is not None else {})
    assert await cp.alist_threads({"user_id": "alice"}) == []


async def test_missing_ids_are_value_errors(cp: CheckpointRepository) -> None:
    for config in ({}, {"user_id": "u"}, {"thread_id": "t"}, {"configurable": {}}):
        with pytest.raises(ValueError):
            await cp.aput_state(config, {"x": 1})
    with pytest.raises(ValueError):
        await cp.aget_state("not a dict")  # type: ignore[arg-type]
    assert await cp.alist_threads({"user_id": "u"}) == []


# Configs that name no thread: absent, None, empty, at either level.
NO_THREAD = [
    {"user_id": "alice"},
    {"thread_id": None, "user_id": "alice"},
    {"thread_id": "", "user_id": "alice"},
    {"configurable": {"thread_id": "", "user_id": "alice"}},
    {"configurable": {"thread_id": None}, "user_id": "alice"},
    {"configurable": {"user_id": "alice", "checkpoint_ns": ""}},
]


async def test_a_call_that_names_no_thread_is_missing_thread_id(cp: CheckpointRepository) -> None:
    """Every call that acts on a thread (states, threads, the ledger, export; through
    the cache too) refuses a config without one, before any I/O, as MissingThreadId —
    a ConfigError and a KeyError — and a number where a string id belongs is a plain
    ConfigError. Nothing is written; the listing still works without a thread."""
    await cp.aput_state(cfg("other"), {"x": 0})
    calls = [
        lambda c: cp.aget_state(c),
        lambda c: cp.aget_state_cache(c),
        lambda c: cp.aput_state(c, {"x": 1}),
        lambda c: cp.aput_checkpoint(c, {"x": 1}, [{"id": "m"}]),
        lambda c: cp.aput_state_cache(c, {"x": 1}, 1),
        lambda c: cp.alist_states(c),
        lambda c: cp.aget_messages(c),
        lambda c: cp.aput_thread(c, name="n"),
        lambda c: cp.aget_thread(c),
        lambda c: cp.aclean_thread(c),
        lambda c: cp.abegin_tool_execution(c, "call", "tool", {}),
        lambda c: cp.acomplete_tool_execution(c, "call", 1),
        lambda c: cp.afail_tool_execution(c, "call", "boom"),
        lambda c: cp.aget_tool_execution(c, "call"),
        lambda c: cp.arun_tool_once(c, "call", "tool", {}, lambda: 1),
        lambda c: cp.alist_tool_executions(c),
        lambda c: cp.aexport_thread(c),
    ]
    for call in calls:
        for config in NO_THREAD:
            with pytest.raises(MissingThreadId) as raised:
                await call(config)
            assert isinstance(raised.value, KeyError) and isinstance(raised.value, ConfigError)
            assert "thread_id" in str(raised.value) and not str(raised.value).startswith("'")
        with pytest.raises(ConfigError, match="not int") as wrong_type:
            await call(cfg(thread=7))
        assert not isinstance(wrong_type.value, MissingThreadId)
    listed = await cp.alist_threads({"user_id": "alice", "thread_id": ""})
    assert [t.thread_id for t in listed] == ["other"]  # nothing created
    assert await cp.aget_state(cfg("other")) == {"x": 0}


UNSERIALIZABLE = [object(), "\ud800"]  # all kinds: tests/unit/test_validation.py


@pytest.mark.parametrize("bad", UNSERIALIZABLE, ids=lambda v: type(v).__name__)
async def test_unserializable_values_write_nothing(cp: CheckpointRepository, bad: Any) -> None:
    config = cfg()
    await cp.aget_state(config)
    with pytest.raises(SerializationError):
        await cp.aput_checkpoint(config, {"bad": bad}, [{"id": "ok", "c": 1}])
    with pytest.raises(SerializationError):
        await cp.aput_checkpoint(config, {"ok": 1}, [{"id": "m", "bad": bad}])
    with pytest.raises(SerializationError):
        await cp.aput_thread(config, metadata={"bad": bad})
    assert await cp.aget_thread(cfg()) is None
    assert await cp.aget_messages(cfg()) == []
    assert config["_checkpoint_version"] == 0


@pytest.mark.parametrize(
    "state", [[1], {"__checkpoint_version__": 1}], ids=["list", "reserved"]
)  # every kind: tests/unit/test_validation.py
async def test_a_state_must_be_a_dict_without_the_reserved_key(
    cp: CheckpointRepository, state: Any
) -> None:
    with pytest.raises(SerializationError):
        await cp.aput_state(cfg(), state)
    assert await cp.aget_thread(cfg()) is None


@pytest.mark.parametrize(
    "messages", [{"id": "x"}, [{"id": 5}]], ids=repr
)  # every kind: tests/unit/test_validation.py
async def test_bad_messages_write_nothing(cp: CheckpointRepository, messages: Any) -> None:
    with pytest.raises(SerializationError):
        await cp.aput_checkpoint(cfg(), {"ok": 1}, messages)
    assert await cp.aget_thread(cfg()) is None


async def test_bad_arguments(cp: CheckpointRepository) -> None:
    await cp.aput_state(cfg(), {"x": 1})
    for call in (
        cp.alist_states(cfg(), limit=-1),
        cp.aget_messages(cfg(), limit=-1),
        cp.alist_threads({"user_id": "alice"}, limit=-1),
        cp.alist_threads({"user_id": "alice"}, offset="1"),  # type: ignore[arg-type]
        cp.aput_state(cfg(_checkpoint_version="1"), {"x": 2}),
    ):
        with pytest.raises(ConfigError):
            await call
    with pytest.raises(ConfigError):  # an argument, like every other id
        await cp.aget_messages(cfg(), after_id="")
    with pytest.raises(SerializationError):
        await cp.aput_thread(cfg(), name=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        await cp.aget_state(cfg(auth_policy=object()))


NOT_A_POLICY = [{"enforce_user_isolation": False}]  # every kind: tests/unit/test_validation.py


@pytest.mark.parametrize("policy", NOT_A_POLICY, ids=repr)
@pytest.mark.parametrize("nested", [False, True], ids=["top", "configurable"])
async def test_only_an_auth_policy_object_lifts_isolation(
    cp: CheckpointRepository, policy: Any, nested: bool
) -> None:
    await cp.aput_checkpoint(cfg(), {"secret": "alice's"}, [{"id": "m", "c": "private"}])
    keys = {"thread_id": "t1", "user_id": "bob", "auth_policy": policy}
    config = {"configurable": keys} if nested else keys
    for call in (
        cp.aget_state(dict(config)),
        cp.aget_state_cache(dict(config)),
        cp.aget_messages(dict(config)),
        cp.alist_states(dict(config)),
        cp.alist_threads(dict(config)),
        cp.aput_state(dict(config), {"secret": "bob's"}),
        cp.aclean_thread(dict(config)),
    ):
        with pytest.raises(ConfigError, match="AuthPolicy"):
            await call
    assert await cp.aget_state(cfg()) == {"secret": "alice's"}
