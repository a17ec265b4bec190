"""The memory store's checks, swept without a database: every rejection raises before
any I/O (the store below points at a server that does not exist: any I/O would be a
DatabaseUnavailable, not the ConfigError asked for)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tenxstore import AuthPolicy, ConfigError, MemoryStore, SerializationError
from tenxstore.memory import search
from tenxstore.memory.validation import (
    check_content,
    check_filter,
    check_key,
    check_metadata,
    check_namespace,
    check_ttl,
    check_user,
)

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
BAD_IDS: list[Any] = [None, "", "x" * 256, "a\x00b", "\ud800", 7, 7.5, b"u", True, ["u"]]
BAD_NAMESPACES: list[Any] = [
    "memories",
    (),
    ("",),
    ("a.b",),
    ("a", 1),
    ("x" * 256,),
    ("a" * 128, "b" * 128),
    ("\x00",),
    ("\udc00",),
    None,
    {"a": 1},
]
BAD_TTLS: list[Any] = [
    0,
    -1,
    -0.5,
    math.nan,
    math.inf,
    1e300,
    10**400,  # an int past a float's range: a ConfigError, not an OverflowError
    True,
    "60",
    timedelta(0),
    timedelta(days=-1),
    timedelta.max,
]


@pytest.fixture
def unreachable() -> Iterator[MemoryStore]:
    store = MemoryStore("postgresql://nobody@127.0.0.1:1/none")
    yield store


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_bad_user_ids_and_keys(bad: Any) -> None:
    with pytest.raises(ConfigError):
        check_user(bad, "string")
    if bad is not None:
        with pytest.raises(ConfigError):
            check_key(bad)


def test_good_ids() -> None:
    assert check_user("user%", "string") == "user%"
    assert check_key(uuid.UUID(int=1)) == "00000000-0000-0000-0000-000000000001"
    assert check_user(7, "int") == 7
    assert check_user(None, "string", optional=True) is None


@pytest.mark.parametrize("bad", BAD_NAMESPACES, ids=repr)
def test_bad_namespaces(bad: Any) -> None:
    with pytest.raises(ConfigError):
        check_namespace(bad)


def test_good_namespaces() -> None:
    assert check_namespace(("a%", "_", "*", "\\")) == "a%._.*.\\"
    assert check_namespace(["memories", "x"]) == "memories.x"
    assert check_namespace((), empty=True) == ""


@pytest.mark.parametrize("bad", BAD_TTLS, ids=repr)
def test_bad_ttls(bad: Any) -> None:
    with pytest.raises(ConfigError):
        check_ttl(bad, NOW)


def test_good_ttls() -> None:
    assert check_ttl(None, NOW) is None
    assert check_ttl(60, NOW) == NOW + timedelta(minutes=1)
    assert check_ttl(0.5, NOW) == NOW + timedelta(seconds=0.5)
    assert check_ttl(timedelta(days=2), NOW) == NOW + timedelta(days=2)


@pytest.mark.parametrize(
    "bad", [None, 1, b"x", ["x"], "\ud800", "x" * (2 * 1024 * 1024 + 1), "é" * (1024 * 1024 + 1)]
)
def test_bad_content(bad: Any) -> None:
    with pytest.raises(SerializationError):
        check_content(bad)


def test_content_at_the_bound_is_stored() -> None:
    assert len(check_content("x" * (2 * 1024 * 1024))) == 2 * 1024 * 1024 + 2
    assert check_content("nul\x00") == '"nul\\u0000"'


@pytest.mark.parametrize(
    "bad", [[1], "x", {1: "a"}, {"a": object()}, {"a": "\ud800"}, {"big": "x" * 300_000}]
)
def test_bad_metadata(bad: Any) -> None:
    with pytest.raises(SerializationError):
        check_metadata(bad)


@pytest.mark.parametrize(
    "bad",
    [
        "x",
        [1],
        {1: 2},
        {"a": {"$regex": "x"}},
        {"a": {"$in": 3}},
        {"a": {"$gt": [1]}},
        {"a": {"$lt": None}},
        {"a": {"$gte": math.inf}},
        {"a": object()},
    ],
)
def test_bad_filters(bad: Any) -> None:
    with pytest.raises(ConfigError):
        check_filter(bad)


def test_filter_semantics() -> None:
    def matches(flt: dict[str, Any], meta: dict[str, Any]) -> bool:
        predicate = check_filter(flt)
        assert predicate is not None
        return predicate(meta)

    assert matches({"a": 1}, {"a": 1.0}) and not matches({"a": 1}, {"a": True})
    assert matches({"a": True}, {"a": True}) and not matches({"a": True}, {"a": 1})
    assert matches({"a": {"x": [1, 2]}}, {"a": {"x": [1, 2]}})  # a plain dict: equality
    assert not matches({"a": 1}, {}) and matches({"a": {"$ne": 1}}, {})
    assert matches({"a": {"$gt": "b"}}, {"a": "c"}) and not matches({"a": {"$gt": "b"}}, {"a": 5})
    assert matches({"a": {"$in": [1, "x"]}}, {"a": "x"}) and not matches(
        {"a": {"$in": []}}, {"a": 1}
    )
    assert check_filter(None) is None
    # an int past a float's range is a number like any other (compared exactly)
    assert matches({"a": {"$lt": 10**400}}, {"a": 1e308}) and not matches(
        {"a": {"$gt": 10**400}}, {"a": 1}
    )


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, 1e300, 10**400, 10_000 * 525_960 + 1])
def test_bad_langgraph_ttls_in_minutes(ttl: Any) -> None:
    from tenxstore.langgraph.items import check_ttl_minutes

    with pytest.raises(ConfigError):
        check_ttl_minutes(ttl)


def test_words() -> None:
    assert search.words("QX-7731, the Café_crème!") == ["qx", "7731", "the", "café", "crème"]
    # NFKC (a ligature, full-width letters), case folded
    assert search.words("\ufb01ne \uff21\uff22\uff23 Straße") == ["fine", "abc", "strasse"]
    assert search.words("नमस्ते") == ["नमस्ते"]  # combining marks stay in the word
    assert search.words("%_*\\ \x00") == []
    assert search.words("x" * 100) == ["x" * search.MAX_WORD]


CALLS: list[tuple[str, Any]] = [
    ("store: no user", lambda s: s.astore(None, "x")),
    ("store: bad namespace", lambda s: s.astore("u", "x", namespace=("a.b",))),
    ("store: bad ttl", lambda s: s.astore("u", "x", ttl=0)),
    ("get: bad key", lambda s: s.aget("u", "")),
    ("update: nothing", lambda s: s.aupdate("u", "k")),
    ("update: bad version", lambda s: s.aupdate("u", "k", content="x", expected_version="1")),
    ("delete: no user", lambda s: s.adelete("", "k")),
    ("history: bad key", lambda s: s.ahistory("u", None)),
    ("list: bad limit", lambda s: s.alist("u", limit=10_001)),
    ("list: no user", lambda s: s.alist(None)),
    ("namespaces: bad depth", lambda s: s.alist_namespaces("u", max_depth=0)),
    ("namespaces: bad prefix", lambda s: s.alist_namespaces("u", prefix="memories")),
    ("search: bad query", lambda s: s.asearch("u", None)),
    ("search: bad filter", lambda s: s.asearch("u", "x", filter={"a": {"$x": 1}})),
    ("search: bad threshold", lambda s: s.asearch("u", "x", score_threshold=-0.1)),
    ("policy: a mapping", lambda s: s.alist("u", auth_policy={"enforce_user_isolation": False})),
    ("policy: odd value", lambda s: s.aget("u", "k", auth_policy=AuthPolicy("no"))),  # type: ignore[arg-type]
    ("sweep: bad batch", lambda s: s.asweep_expired(batch_size=5001)),
]


@pytest.mark.parametrize(("case", "call"), CALLS, ids=[c[0] for c in CALLS])
async def test_rejected_before_any_io(unreachable: MemoryStore, case: str, call: Any) -> None:
    with pytest.raises(ConfigError):
        await call(unreachable)


async def test_bad_content_is_a_serialization_error_before_any_io(unreachable: MemoryStore) -> None:
    with pytest.raises(SerializationError):
        await unreachable.astore("u", "x" * (2 * 1024 * 1024 + 1))


class _Opaque:
    """Any object that is not an embedding; its repr is stable (xdist compares test ids)."""

    def __repr__(self) -> str:
        return "<an object>"


_NOT_AN_EMBEDDING = _Opaque()


@pytest.mark.parametrize(
    "options",
    [
        {"embedding": _NOT_AN_EMBEDDING},
        {"memory_history_limit": 0},
        {"memory_history_limit": True},
        {"keyword_index": "yes"},
        {"enforce_user_isolation": 1},
    ],
    ids=repr,
)
def test_bad_constructor_arguments(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        MemoryStore("memory", **options)


def test_a_checkpointer_keeps_its_own_settings() -> None:
    from tenxstore import InMemoryCheckpointer

    cp = InMemoryCheckpointer(enforce_user_isolation=False)
    assert MemoryStore(cp).enforce_user_isolation is False
    assert MemoryStore(cp, enforce_user_isolation=True).enforce_user_isolation is True
    with pytest.raises(ConfigError, match="shares its database"):
        MemoryStore(cp, schema="x")
    with pytest.raises(ConfigError):
        MemoryStore(object())
