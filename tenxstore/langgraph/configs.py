"""The configs a :class:`~tenxstore.langgraph.TenxCheckpointSaver` reads and returns:
``configurable`` checked, the thread it names, and the keys it adds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig

from ..config import INCARNATION_KEY
from ..errors import ConfigError, MissingThreadId

__all__ = [
    "HEAD_KEY",
    "check_thread",
    "checkpoint_config",
    "configurable",
    "missing",
    "stored_config",
    "unusable",
]


HEAD_KEY = "_checkpoint_head"
"""In a config the saver returns: the namespace's newest checkpoint when it was read."""


def configurable(config: RunnableConfig | None) -> dict[str, Any]:
    """A copy of ``config['configurable']`` (empty when there is none)."""
    if config is not None and not isinstance(config, Mapping):
        raise ConfigError(f"config must be a dict, not {type(config).__name__}")
    inner = (config or {}).get("configurable") or {}
    if not isinstance(inner, Mapping):
        raise ConfigError(f"config['configurable'] must be a dict, not {type(inner).__name__}")
    return dict(inner)


def unusable(thread_id: Any) -> bool:
    """No thread named: absent, None or empty."""
    return thread_id is None or thread_id == ""


def missing(config: Any, what: str) -> MissingThreadId:
    """The error of a call that acts on a thread and names none, saying where a thread
    id was given that LangGraph does not read (the top level, or the metadata)."""
    config = config or {}
    metadata = config.get("metadata")
    hint = ""
    if not unusable(config.get("thread_id")):
        hint = "; config['thread_id'] is not where LangGraph reads it"
    elif isinstance(metadata, Mapping) and not unusable(metadata.get("thread_id")):
        hint = "; config['metadata']['thread_id'] is not where LangGraph reads it"
    return MissingThreadId(
        f"{what} needs a thread: the config has no config['configurable']['thread_id']"
        f"{hint} (graph.invoke(input, {{'configurable': {{'thread_id': ...}}}}))"
    )


def check_thread(config: Any, conf: Mapping[str, Any], what: str) -> None:
    """A call that acts on one thread: its ``configurable`` must name it (before any I/O)."""
    if unusable(conf.get("thread_id")):
        raise missing(config, what)


def checkpoint_config(row: Any, checkpoint_id: str) -> RunnableConfig:
    """A config that names a checkpoint and carries what the saver needs to accept
    it back: the owner (under isolation), which life of the thread was read (a
    write after a delete or a replace is refused), and the namespace's head at the
    time of the read (a run resumed from an older checkpoint may fork from there;
    a run that lost a race to another cannot commit)."""
    configurable: dict[str, Any] = {
        "thread_id": row.thread_id,
        "checkpoint_ns": row.checkpoint_ns,
        "checkpoint_id": checkpoint_id,
        INCARNATION_KEY: row.incarnation,
        HEAD_KEY: row.head,
    }
    if row.user_id is not None:
        configurable["user_id"] = row.user_id
    return {"configurable": configurable}


def stored_config(
    conf: Mapping[str, Any], ns: str, checkpoint_id: str, incarnation: int
) -> RunnableConfig:
    """The config a put returns: its checkpoint, in the life it was written in, as the
    run's own head from here on."""
    return {
        "configurable": {
            **{k: v for k, v in conf.items() if k == "user_id"},
            "thread_id": conf["thread_id"],
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
            INCARNATION_KEY: incarnation,
            HEAD_KEY: checkpoint_id,  # this run's own head, from here on
        }
    }
