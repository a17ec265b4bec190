"""Bad input on every backend: the precise error, and nothing written (one value per
case here; tests/unit sweeps the rejections without a database)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tenxstore import ConfigError, MemoryStore, SerializationError

Call = Callable[[MemoryStore], Awaitable[Any]]
CASES: list[tuple[str, Call, type[Exception]]] = [
    ("no user", lambda s: s.astore(None, "x"), ConfigError),
    ("empty user", lambda s: s.astore("", "x"), ConfigError),
    ("surrogate user", lambda s: s.astore("\ud800", "x"), ConfigError),
    ("long key", lambda s: s.astore("u", "x", key="k" * 256), ConfigError),
    ("dotted label", lambda s: s.astore("u", "x", namespace=("a.b",)), ConfigError),
    ("str namespace", lambda s: s.astore("u", "x", namespace="memories"), ConfigError),  # type: ignore[arg-type]
    ("bad ttl", lambda s: s.astore("u", "x", ttl=-1), ConfigError),
    ("huge ttl", lambda s: s.astore("u", "x", ttl=1e300), ConfigError),
    ("content type", lambda s: s.astore("u", b"x"), SerializationError),  # type: ignore[arg-type]
    ("surrogate content", lambda s: s.astore("u", "a\udfffb"), SerializationError),
    ("huge content", lambda s: s.astore("u", "x" * (2 * 1024 * 1024 + 1)), SerializationError),
    ("metadata", lambda s: s.astore("u", "x", metadata={"d": object()}), SerializationError),
    ("update nothing", lambda s: s.aupdate("u", "k"), ConfigError),
    ("bad version", lambda s: s.aupdate("u", "k", content="x", expected_version=-1), ConfigError),
    ("bad filter", lambda s: s.asearch("u", "x", filter={"a": {"$regex": "."}}), ConfigError),
    ("bad threshold", lambda s: s.asearch("u", "x", score_threshold=2), ConfigError),
    ("bad limit", lambda s: s.alist("u", limit=-1), ConfigError),
]


async def test_rejected_and_nothing_written(memories: MemoryStore) -> None:
    """Every case on one store of each backend (each raises before any I/O: a store per
    case would only repeat its setup)."""
    await memories.astore("u", "before", key="k")
    for case, call, error in CASES:
        with pytest.raises(error):
            await call(memories)
        [only] = await memories.alist("u", namespace=())
        assert (only.key, only.version, only.content) == ("k", 1, "before"), case
