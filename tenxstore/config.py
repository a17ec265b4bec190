"""Reading ``thread_id`` / ``user_id`` / ``auth_policy`` out of a run config.

A run config is a plain ``dict``. Keys are read at the top level first and then
from ``config["configurable"]`` (LangGraph style); the version the run last read
or wrote is stored as ``_checkpoint_version`` in the same mapping ``thread_id``
came from. Everything here runs before any I/O, so bad input never reaches a
database.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from .errors import ConfigError

__all__ = [
    "VERSION_KEY",
    "IdType",
    "RunIds",
    "check_id",
    "check_id_type",
    "read_config",
    "recorded_version",
    "set_recorded_version",
]

VERSION_KEY = "_checkpoint_version"
IdType = Literal["string", "int", "bigint"]
_ID_TYPES: tuple[str, ...] = ("string", "int", "bigint")
_INT_BOUNDS = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
MAX_ID_LENGTH = 255


@dataclass(frozen=True)
class RunIds:
    """The identity of one call: which thread, whose, and whether isolation applies."""

    thread_id: Any
    user_id: Any
    isolated: bool


def check_id_type(name: str, value: object) -> IdType:
    """Validate an ``id_type`` / ``user_id_type`` constructor argument."""
    if value not in _ID_TYPES:
        raise ConfigError(f"{name} must be one of {', '.join(_ID_TYPES)}, not {value!r}")
    return value  # type: ignore[return-value]  # narrowed by the membership test


def check_id(what: str, value: object, id_type: IdType = "string") -> Any:
    """Return ``value`` if it is a valid id of ``id_type``, else raise ``ConfigError``."""
    if id_type == "string":
        if not isinstance(value, str):
            raise ConfigError(f"{what} must be a str, not {type(value).__name__}")
        if not 0 < len(value) <= MAX_ID_LENGTH:
            raise ConfigError(f"{what} must be 1-{MAX_ID_LENGTH} characters, not {len(value)}")
        if "\x00" in value:
            raise ConfigError(f"{what} must not contain U+0000")
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an int ({id_type}), not {type(value).__name__}")
    low, high = _INT_BOUNDS[id_type]
    if not low <= value <= high:
        raise ConfigError(f"{what} {value} is out of range for {id_type}")
    return int(value)


def _lookup(config: Mapping[str, Any], key: str) -> tuple[Any, Mapping[str, Any] | None]:
    """Find ``key`` at the top level, then under ``configurable``."""
    if key in config and config[key] is not None:
        return config[key], config
    inner = config.get("configurable")
    if isinstance(inner, Mapping) and inner.get(key) is not None:
        return inner[key], inner
    return None, None


def _check_config(config: object) -> Mapping[str, Any]:
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a dict, not {type(config).__name__}")
    return config


def isolation_applies(config: Mapping[str, Any], default: bool) -> bool:
    """Whether user isolation applies to this call (``auth_policy`` wins)."""
    policy, _ = _lookup(config, "auth_policy")
    if policy is None:
        return default
    if isinstance(policy, Mapping):
        flag = policy.get("enforce_user_isolation")
    else:
        flag = getattr(policy, "enforce_user_isolation", None)
    if not isinstance(flag, bool):
        raise ConfigError("auth_policy must have a boolean enforce_user_isolation")
    return flag


def read_config(
    config: object,
    *,
    isolation: bool,
    id_type: IdType = "string",
    user_id_type: IdType = "string",
    need_thread: bool = True,
) -> RunIds:
    """Read and validate the ids of one call.

    Args:
        config: The run config.
        isolation: The checkpointer's own ``enforce_user_isolation``.
        id_type: Type of ``thread_id``.
        user_id_type: Type of ``user_id``.
        need_thread: False for calls that work on a user, not a thread.

    Raises:
        ConfigError: A required id is missing or invalid.
    """
    cfg = _check_config(config)
    isolated = isolation_applies(cfg, isolation)
    thread_id, _ = _lookup(cfg, "thread_id")
    if thread_id is None:
        if need_thread:
            raise ConfigError("config has no thread_id")
    else:
        thread_id = check_id("thread_id", thread_id, id_type)
    user_id, _ = _lookup(cfg, "user_id")
    if user_id is None:
        if isolated:
            raise ConfigError("config has no user_id and user isolation applies")
    else:
        user_id = check_id("user_id", user_id, user_id_type)
    return RunIds(thread_id=thread_id, user_id=user_id, isolated=isolated)


def recorded_version(config: Mapping[str, Any]) -> int | None:
    """The version the run last read or wrote, or None when it never read."""
    value, _ = _lookup(config, VERSION_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{VERSION_KEY} must be a non-negative int, not {value!r}")
    return value


def set_recorded_version(config: MutableMapping[str, Any], version: int) -> None:
    """Record ``version`` where ``thread_id`` was found."""
    _, where = _lookup(config, "thread_id")
    target = where if isinstance(where, MutableMapping) else config
    target[VERSION_KEY] = version
