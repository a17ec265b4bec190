"""Reading ``thread_id`` / ``user_id`` / ``auth_policy`` out of a run config.

A run config is a plain ``dict``. Keys are read at the top level first and then
from ``config["configurable"]`` (LangGraph style); the version the run last read
or wrote is stored as ``_checkpoint_version`` in the same mapping ``thread_id``
came from, and beside it ``_checkpoint_incarnation``: which life of the thread that
version belongs to (a thread deleted and written again, or replaced by an import,
is a new life whose versions start again at 1). Everything here runs before any
I/O, so bad input never reaches a database.

Only an :class:`~tenxstore.AuthPolicy` instance — made by server code — decides
whether isolation applies to a call. Configs often come from clients: a mapping or
any other value under ``auth_policy`` is refused, never read as a policy.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, MissingThreadId
from .types import AuthPolicy, ReadSource
from .validate import IdType, check_count, check_id

__all__ = [
    "INCARNATION_KEY",
    "SOURCE_KEY",
    "VERSION_KEY",
    "RunIds",
    "isolation_applies",
    "read_config",
    "read_source",
    "record_read",
    "record_source",
    "recorded_incarnation",
    "recorded_version",
]

VERSION_KEY = "_checkpoint_version"
INCARNATION_KEY = "_checkpoint_incarnation"
SOURCE_KEY = "_read_source"


@dataclass(frozen=True)
class RunIds:
    """The identity of one call: which thread, whose, and whether isolation applies."""

    thread_id: Any
    user_id: Any
    isolated: bool


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
    """Whether user isolation applies to this call (an ``AuthPolicy`` decides).

    Raises:
        ConfigError: ``auth_policy`` holds something other than an ``AuthPolicy``.
    """
    policy, _ = _lookup(config, "auth_policy")
    if policy is None:
        return default
    if not isinstance(policy, AuthPolicy):
        raise ConfigError(
            f"auth_policy must be an AuthPolicy made by server code, not "
            f"{type(policy).__name__}: a config value never changes isolation"
        )
    if not isinstance(policy.enforce_user_isolation, bool):
        raise ConfigError("AuthPolicy.enforce_user_isolation must be a bool")
    return policy.enforce_user_isolation


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
        need_thread: False for calls that work on a user, not a thread (an absent or
            empty ``thread_id`` is then None).

    Raises:
        MissingThreadId: ``need_thread`` and the config names no thread (absent,
            None or empty).
        ConfigError: A required id is missing or invalid.
    """
    cfg = _check_config(config)
    isolated = isolation_applies(cfg, isolation)
    thread_id, _ = _lookup(cfg, "thread_id")
    if thread_id is None or thread_id == "":
        if need_thread:
            raise MissingThreadId(
                f"config has {'an empty' if thread_id == '' else 'no'} thread_id: name the "
                "thread as config['thread_id'] (or config['configurable']['thread_id'])"
            )
        thread_id = None
    else:
        thread_id = check_id("thread_id", thread_id, id_type)
    user_id, _ = _lookup(cfg, "user_id")
    if user_id is None:
        if isolated:
            raise ConfigError(
                "config has no user_id and user isolation applies: pass the authenticated "
                "user's id as config['user_id'], or create the checkpointer with "
                "enforce_user_isolation=False if every thread is shared"
            )
    else:
        user_id = check_id("user_id", user_id, user_id_type)
    return RunIds(thread_id=thread_id, user_id=user_id, isolated=isolated)


def recorded_version(config: Mapping[str, Any]) -> int | None:
    """The version the run last read or wrote, or None when it never read."""
    value, _ = _lookup(config, VERSION_KEY)
    return None if value is None else check_count(VERSION_KEY, value)


def recorded_incarnation(config: Mapping[str, Any]) -> int | None:
    """Which life of the thread the recorded version belongs to (None: not known)."""
    value, _ = _lookup(config, INCARNATION_KEY)
    return None if value is None else check_count(INCARNATION_KEY, value)


def record_read(config: MutableMapping[str, Any], version: int, incarnation: int | None) -> None:
    """Record what the run read or wrote where ``thread_id`` was found.

    ``incarnation`` None (no such thread, or a cache entry that does not say) removes a
    recorded one, so a config reused for another read never carries a stale one.
    """
    _, where = _lookup(config, "thread_id")
    target = where if isinstance(where, MutableMapping) else config
    target[VERSION_KEY] = version
    if incarnation is None:
        target.pop(INCARNATION_KEY, None)
    else:
        target[INCARNATION_KEY] = incarnation


def record_source(config: MutableMapping[str, Any], source: ReadSource) -> None:
    """Record where a read that tolerates lag was served from, beside ``thread_id``
    (or ``user_id``, for a list of threads)."""
    _, where = _lookup(config, "thread_id")
    if where is None:
        _, where = _lookup(config, "user_id")
    target = where if isinstance(where, MutableMapping) else config
    target[SOURCE_KEY] = source


def read_source(config: Mapping[str, Any]) -> ReadSource | None:
    """Where the last read of ``config`` that tolerates lag was served from: the
    primary, or a replica and an upper bound of how far behind it may be (see
    ``replica_urls``); None when no such read used the config.

    The reads that tolerate lag are ``alist_threads``, ``alist_states``,
    ``aget_messages`` and ``aexport_thread``. They always include what this process
    wrote (a replica serves only once it holds it), and, of a thread whose config
    recorded a version (the run read or wrote it, in any process), that version.
    """
    for key in ("thread_id", "user_id"):
        _, where = _lookup(config, key)
        if where is not None:
            found = where.get(SOURCE_KEY)
            return found if isinstance(found, ReadSource) else None
    found = config.get(SOURCE_KEY)
    return found if isinstance(found, ReadSource) else None
