"""Every JSON value round-trips exactly, through serde and through every backend."""

from __future__ import annotations

import enum
import math
import subprocess
import sys
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenxstore import CheckpointRepository, SerializationError
from tenxstore.serde import decode, encode
from tests.conftest import cfg


class Color(enum.Enum):
    RED = "red"


ALL_CONTROL = "".join(chr(c) for c in range(32)) + "\x7f\u2028\u2029\ufeff\U0010ffff"

TRICKY: dict[str, Any] = {
    "nul": "a\x00b",
    "nul key \x00": {"\x00": "\x00\x00"},
    "controls": ALL_CONTROL,
    "big": 2**64,
    "bigger": -(10**40),
    "u64": 2**64 - 1,
    "i64min": -(2**63),
    "float": 0.1,
    "tiny": 5e-324,
    "huge": 1.7976931348623157e308,
    "neg zero": -0.0,
    "nested": [[[[{"deep": [None, True, False, ""]}]]]],
    "emoji": "🧵👩‍💻 ñ 中文 \U0001f600",
    "quotes": "'\"\\/",
    "empty": {},
    "list": [],
}


def same(a: Any, b: Any) -> bool:
    """Equality that also checks types (1 vs 1.0 vs True) and NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if type(a) is not type(b):
        return isinstance(a, (list, tuple)) and isinstance(b, list) and same(list(a), b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_serde_round_trips_every_json_value(value: Any) -> None:
    assert same(value, decode(encode(value)))


def test_serde_marks_only_what_orjson_cannot_hold() -> None:
    assert not encode({"a": 1}).startswith(" ")
    assert not encode({"a": None}).startswith(" ")
    assert encode({"a": 2**64}).startswith(" ")
    assert encode({"a": float("nan")}).startswith(" ")
    assert "\x00" not in encode({"\x00": "\x00"})


async def test_tricky_values_round_trip_through_the_store(cp: CheckpointRepository) -> None:
    config = {"thread_id": "t", "user_id": "u"}
    message = {"id": "m1", "role": "user", **TRICKY}
    await cp.aput_checkpoint(config, dict(TRICKY), [message])
    await cp.aput_thread(config, name="name \x00 " + ALL_CONTROL, metadata=dict(TRICKY))
    assert same(await cp.aget_state({"thread_id": "t", "user_id": "u"}), TRICKY)
    [stored] = await cp.aget_messages(config)
    assert same(stored, message)
    info = await cp.aget_thread(config)
    assert info is not None
    assert info.name == "name \x00 " + ALL_CONTROL
    assert same(info.metadata, TRICKY)
    [snapshot] = await cp.alist_states(config)
    assert same(snapshot.state, TRICKY)


async def test_non_finite_floats_round_trip(cp: CheckpointRepository) -> None:
    config = {"thread_id": "t", "user_id": "u"}
    await cp.aput_state(config, {"nan": float("nan"), "inf": math.inf, "-inf": -math.inf})
    state = await cp.aget_state(config)
    assert state is not None
    assert math.isnan(state["nan"]) and state["inf"] == math.inf and state["-inf"] == -math.inf


async def test_multi_megabyte_state(cp: CheckpointRepository) -> None:
    import random

    rng = random.Random(7)
    blob = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz \x00é中") for _ in range(3_000_000))
    state = {"blob": blob, "many": list(range(50_000))}
    config = {"thread_id": "big", "user_id": "u"}
    await cp.aput_state(config, state)
    assert await cp.aget_state(config) == state


def nested(depth: int, leaf: Any = "leaf") -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


async def test_nesting_up_to_the_limit_round_trips_and_beyond_is_refused(
    cp: CheckpointRepository,
) -> None:
    from tenxstore.serde import MAX_DEPTH

    deepest = {"v": nested(MAX_DEPTH - 1)}  # the state itself is one level
    assert await cp.aput_state(cfg(), deepest) == 1
    assert await cp.aget_state(cfg()) == deepest
    for value in (nested(MAX_DEPTH), nested(MAX_DEPTH, 2**70), nested(MAX_DEPTH, float("nan"))):
        with pytest.raises(SerializationError, match="levels deep"):
            await cp.aput_state(cfg(), {"v": value})
    assert await cp.aget_state(cfg()) == deepest


_DEEP_UNDER_A_MEMORY_CAP = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (600 * 2**20, 600 * 2**20))
from tenxstore.errors import SerializationError
from tenxstore.serde import encode_state

deep = "leaf"
for _ in range(100_000):  # 0.7 MB of JSON; the old walk needed 23 GB for it
    deep = [deep]
wide = [[list(range(1000)) for _ in range(600)]]  # 600k items under a deep spine
for _ in range(900):
    wide = {"k": wide}
for value in (deep, wide):
    try:
        encode_state({"v": value})
    except SerializationError as exc:
        assert "levels deep" in str(exc), exc
    else:
        sys.exit("accepted")
print("refused")
"""


def test_deep_values_are_refused_in_bounded_memory() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _DEEP_UNDER_A_MEMORY_CAP],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "refused", done.stderr[-2000:]


async def test_a_role_no_column_can_hold_is_kept_in_the_payload(cp: CheckpointRepository) -> None:
    """``role`` is a denormalized column; the message itself round-trips exactly."""
    odd = [
        {"id": "nul", "role": "us\x00er", "content": "x"},
        {"id": "long", "role": "r" * 10_000, "content": "y"},
        {"id": "typed", "role": {"name": "tool"}, "content": "z"},
    ]
    await cp.aput_checkpoint(cfg(), {"a": 1}, odd)
    assert await cp.aget_messages(cfg()) == odd


async def test_messages_that_are_not_a_sequence_are_a_typed_error(
    cp: CheckpointRepository,
) -> None:
    for bad in (None, 5, {"id": "m"}, "messages"):
        with pytest.raises(SerializationError):
            await cp.aput_checkpoint(cfg(), {"a": 1}, bad)  # type: ignore[arg-type]
    assert await cp.aget_state(cfg()) is None


def test_both_encoders_accept_the_same_values() -> None:
    """What orjson writes natively (a UUID, an Enum member) is written alike when the
    standard library encodes (a big int or a NaN beside it); datetimes are refused."""
    ident = uuid.UUID(int=7)
    plain, marked = (
        encode({"id": ident, "e": Color.RED}),
        encode({"id": ident, "e": Color.RED, "n": math.nan}),
    )
    assert decode(plain) == {"id": str(ident), "e": "red"}
    assert decode(marked)["id"] == str(ident) and decode(marked)["e"] == "red"
    assert encode({"id": ident}, sort_keys=True) == encode({"id": str(ident)}, sort_keys=True)
    for refused in (datetime.now(timezone.utc), {1, 2}, object()):
        for value in ({"v": refused}, {"v": refused, "n": math.nan}):
            with pytest.raises(SerializationError):
                encode(value)
