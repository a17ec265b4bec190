"""Bad input is refused before any I/O: every rejected value, against every call.

The checkpointers here point at a database and a Redis that nobody listens at: any
I/O would raise ``DatabaseUnavailable`` (or fail open on Redis), so a ``ConfigError``
or ``SerializationError`` proves the value was refused before the call went out. The
contract suite keeps one representative of each rejection on every backend, where
it also checks that nothing was written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tenxstore import (
    AuthPolicy,
    CachedCheckpointer,
    CheckpointRepository,
    ConfigError,
    MissingThreadId,
    RetryPolicy,
    SerializationError,
)
from tests.conftest import cfg

OFFLINE = "postgresql://127.0.0.1:1/nowhere"


@pytest.fixture(params=["repository", "cached"])
def offline(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A checkpointer whose every I/O would fail: validation must come first."""
    repository = CheckpointRepository(OFFLINE)
    if request.param == "repository":
        yield repository
    else:
        yield CachedCheckpointer(repository, redis_url="redis://127.0.0.1:1/0")


def thread_calls(cp: Any) -> list[Callable[[Any], Any]]:
    """Every call that acts on one thread, given a config."""
    return [
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


BAD_IDS = ["", "x" * 256, "nul\x00", "\ud800", 12, 1.5, None, b"bytes", True, ["t"]]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
async def test_bad_ids_are_config_errors_before_any_io(offline: Any, bad: Any) -> None:
    for call in thread_calls(offline):
        for config in (cfg(thread=bad), cfg(user=bad)):
            if bad is None and config.get("thread_id") is not None:
                continue  # a missing user_id: below
            with pytest.raises(ConfigError):
                await call(config)
    with pytest.raises(ConfigError):
        await offline.alist_threads({"user_id": bad} if bad is not None else {})


NO_THREAD = [
    {"user_id": "alice"},
    {"thread_id": None, "user_id": "alice"},
    {"thread_id": "", "user_id": "alice"},
    {"configurable": {"thread_id": "", "user_id": "alice"}},
    {"configurable": {"thread_id": None}, "user_id": "alice"},
    {"configurable": {"user_id": "alice", "checkpoint_ns": ""}},
]


@pytest.mark.parametrize("config", NO_THREAD, ids=repr)
async def test_a_call_that_names_no_thread_is_missing_thread_id(offline: Any, config: Any) -> None:
    for call in thread_calls(offline):
        with pytest.raises(MissingThreadId) as raised:
            await call(dict(config))
        assert isinstance(raised.value, KeyError) and isinstance(raised.value, ConfigError)
        assert "thread_id" in str(raised.value) and not str(raised.value).startswith("'")


async def test_a_number_where_a_string_id_belongs_says_how_to_fix_it(offline: Any) -> None:
    for call in thread_calls(offline):
        with pytest.raises(ConfigError, match="not int") as wrong_type:
            await call(cfg(thread=7))
        assert not isinstance(wrong_type.value, MissingThreadId)


async def test_missing_ids_are_value_errors(offline: Any) -> None:
    for config in ({}, {"user_id": "u"}, {"thread_id": "t"}, {"configurable": {}}):
        with pytest.raises(ValueError):
            await offline.aput_state(config, {"x": 1})
    with pytest.raises(ValueError):
        await offline.aget_state("not a dict")


UNSERIALIZABLE = [object(), {1, 2}, lambda: None, 1 + 2j, b"bytes", {1: "int key"}, "\ud800"]


@pytest.mark.parametrize("bad", UNSERIALIZABLE, ids=lambda v: type(v).__name__)
async def test_unserializable_values_are_refused_before_any_io(offline: Any, bad: Any) -> None:
    config = cfg(_checkpoint_version=0)
    with pytest.raises(SerializationError):
        await offline.aput_checkpoint(config, {"bad": bad}, [{"id": "ok", "c": 1}])
    with pytest.raises(SerializationError):
        await offline.aput_checkpoint(config, {"ok": 1}, [{"id": "m", "bad": bad}])
    with pytest.raises(SerializationError):
        await offline.aput_thread(config, metadata={"bad": bad})
    with pytest.raises(SerializationError):
        await offline.abegin_tool_execution(config, "call", "tool", {"bad": bad})


@pytest.mark.parametrize(
    "state",
    [[1], "s", None, 3, {"__checkpoint_version__": 1}],
    ids=["list", "str", "None", "int", "reserved"],
)
async def test_a_state_must_be_a_dict_without_the_reserved_key(offline: Any, state: Any) -> None:
    with pytest.raises(SerializationError):
        await offline.aput_state(cfg(), state)


@pytest.mark.parametrize(
    "messages",
    [["str"], [1], "abc", {"id": "x"}, [{"id": ""}], [{"id": 5}], [{"id": "a\x00"}]],
    ids=repr,
)
async def test_bad_messages_are_refused_before_any_io(offline: Any, messages: Any) -> None:
    with pytest.raises(SerializationError):
        await offline.aput_checkpoint(cfg(), {"ok": 1}, messages)


async def test_bad_arguments(offline: Any) -> None:
    for call in (
        offline.alist_states(cfg(), limit=-1),
        offline.aget_messages(cfg(), limit=-1),
        offline.alist_threads({"user_id": "alice"}, limit=-1),
        offline.alist_threads({"user_id": "alice"}, offset="1"),
        offline.aput_state(cfg(_checkpoint_version="1"), {"x": 2}),
        offline.aget_messages(cfg(), after_id=""),
        offline.aget_state(cfg(auth_policy=object())),
    ):
        with pytest.raises(ConfigError):
            await call
    with pytest.raises(SerializationError):
        await offline.aput_thread(cfg(), name=5)


NOT_A_POLICY = [
    {"enforce_user_isolation": False},
    {"enforce_user_isolation": "false"},
    False,
    0,
    "off",
    ["enforce_user_isolation", False],
]


@pytest.mark.parametrize("policy", NOT_A_POLICY, ids=repr)
@pytest.mark.parametrize("nested", [False, True], ids=["top", "configurable"])
async def test_only_an_auth_policy_object_lifts_isolation(
    offline: Any, policy: Any, nested: bool
) -> None:
    keys = {"thread_id": "t1", "user_id": "bob", "auth_policy": policy}
    config = {"configurable": keys} if nested else keys
    for call in thread_calls(offline):
        with pytest.raises(ConfigError, match="AuthPolicy"):
            await call(dict(config))
    with pytest.raises(ConfigError, match="AuthPolicy"):
        await offline.alist_threads(dict(config))
    assert AuthPolicy(enforce_user_isolation=False).enforce_user_isolation is False


@pytest.mark.parametrize(
    "options",
    [
        {"state_history_limit": 0},
        {"state_history_limit": 1.5},
        {"id_type": "uuid"},
        {"user_id_type": "text"},
        {"tool_lease_seconds": 0},
        {"schema": ""},
    ],
    ids=repr,
)
def test_constructor_validation(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CheckpointRepository("postgresql://localhost/db", **options)


def test_constructor_refuses_unsupported_urls_and_sqlite_schemas() -> None:
    for url in ("mssql://localhost/db", "not a url", "oracle://x"):
        with pytest.raises(ValueError):
            CheckpointRepository(url)
    for url in ("sqlite:///x.db", "mysql://localhost/db"):  # the file, the database
        with pytest.raises(ValueError):
            CheckpointRepository(url, schema="s")


@pytest.mark.parametrize(
    "options",
    [{"attempts": 0}, {"attempts": 1.5}, {"attempts": True}, {"backoff": -1}, {"max_backoff": "1"}],
)
def test_a_retry_policy_out_of_range_is_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="RetryPolicy"):
        RetryPolicy(**options)


def test_a_retry_policy_waits_twice_as_long_each_time_up_to_its_bound() -> None:
    policy = RetryPolicy(attempts=5, backoff=0.1, max_backoff=0.3)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]
    assert list(policy.tries()) == [1, 2, 3, 4, 5] and policy.last(5) and not policy.last(4)
    assert RetryPolicy().delay(1) == 0.0
    with pytest.raises(ConfigError, match="retry"):
        CheckpointRepository(OFFLINE, retry=2)  # type: ignore[arg-type]
