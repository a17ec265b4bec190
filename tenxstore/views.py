"""LangGraph checkpoints as an operator reads them: plain values, messages as messages.

``tenxstore show`` and ``history`` print a thread that a LangGraph graph wrote from
here: each checkpoint's step, source, metadata, channel values and pending writes,
read through :class:`~tenxstore.langgraph.TenxCheckpointSaver` (the saver's own
serde: a stored value is never trusted to name code to run) and turned into JSON
values. A channel whose value is a list of chat messages is a conversation, printed
one message a line. Needs the ``langgraph`` extra (the CLI says so without it).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .protocol import Checkpointer
from .serde import encode
from .types import AuthPolicy

__all__ = ["CheckpointView", "checkpoints", "is_conversation", "message_line", "plain"]

_DEPTH = 64  # deeper structures are shown by their repr: a display, not a dump


@dataclass(frozen=True)
class CheckpointView:
    """One LangGraph checkpoint as printed.

    Attributes:
        checkpoint_id: Its id.
        namespace: Its namespace (``""``: the graph itself; else a subgraph's).
        step: LangGraph's step number (metadata ``step``).
        source: What wrote it (metadata ``source``: ``input``, ``loop``, ``update``...).
        written: When (the checkpoint's ``ts``).
        metadata: Its whole metadata.
        values: Each channel's value, as plain JSON values.
        writes: The pending writes made against it: ``(task id, channel, value)``.
    """

    checkpoint_id: str
    namespace: str
    step: Any
    source: Any
    written: str | None
    metadata: dict[str, Any]
    values: dict[str, Any]
    writes: list[tuple[str, str, Any]]


def _message(value: Any) -> bool:
    try:
        from langchain_core.messages import BaseMessage
    except ImportError:  # pragma: no cover - langgraph brings langchain_core
        return False
    return isinstance(value, BaseMessage)


def is_conversation(value: Any) -> bool:
    """A channel value that is a non-empty list of chat messages."""
    return isinstance(value, list) and bool(value) and all(_message(v) for v in value)


def plain(value: Any, depth: int = 0) -> Any:
    """A value as JSON can show it: a chat message as ``{"role", "content", ...}``,
    models and dataclasses as their fields, anything else unknown as its ``repr``."""
    if depth > _DEPTH:
        return repr(value)
    deeper = depth + 1
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if _message(value):
        shown: dict[str, Any] = {"role": value.type, "content": plain(value.content, deeper)}
        for field in ("name", "tool_calls", "tool_call_id", "id"):
            found = getattr(value, field, None)
            if found:
                shown[field] = plain(found, deeper)
        return shown
    if isinstance(value, Mapping):
        return {str(k): plain(v, deeper) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, deeper) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [plain(v, deeper) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, enum.Enum):
        return plain(value.value, deeper)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), deeper) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)  # a pydantic model
    if callable(dump):
        try:
            return plain(dump(), deeper)
        except Exception:  # a model that cannot dump itself is shown by its repr
            pass
    return repr(value)


def message_line(message: Any) -> str:
    """A chat message in one line: ``role: content``, tool calls after ``->``."""
    content = message.content
    text = content if isinstance(content, str) else encode(plain(content))
    line = f"{message.type}: {text}"
    calls = getattr(message, "tool_calls", None)
    if calls:
        line += " -> " + ", ".join(
            f"{c.get('name')}({encode(plain(c.get('args')))})" for c in calls
        )
    return line


async def checkpoints(
    checkpointer: Checkpointer,
    thread_id: Any,
    user_id: Any = None,
    *,
    namespace: str | None = None,
    limit: int | None = None,
) -> list[tuple[CheckpointView, dict[str, Any]]]:
    """A thread's LangGraph checkpoints, newest first: each as a view and with its
    channel values as stored (``{channel: value}``, messages as message objects).

    Args:
        checkpointer: Any tenxstore checkpointer.
        thread_id: The thread.
        user_id: Read as this user (isolation applies); None reads as an operator.
        namespace: Only this namespace (``""``: the graph's own); None: every one.
        limit: At most this many.

    Raises:
        ImportError: The ``langgraph`` extra is not installed.
    """
    from .langgraph import TenxCheckpointSaver

    if user_id is None:
        saver = TenxCheckpointSaver(checkpointer, auth_policy=AuthPolicy(False))
    else:
        saver = TenxCheckpointSaver(checkpointer, user_id=user_id, auth_policy=AuthPolicy(True))
    configurable: dict[str, Any] = {"thread_id": thread_id}
    if namespace is not None:
        configurable["checkpoint_ns"] = namespace
    found = []
    async for t in saver.alist({"configurable": configurable}, limit=limit):
        values = dict(t.checkpoint["channel_values"])
        metadata = dict(t.metadata or {})
        view = CheckpointView(
            checkpoint_id=t.checkpoint["id"],
            namespace=t.config["configurable"].get("checkpoint_ns", ""),
            step=metadata.get("step"),
            source=metadata.get("source"),
            written=t.checkpoint.get("ts"),
            metadata=plain(metadata),
            values={channel: plain(value) for channel, value in values.items()},
            writes=[
                (task, channel, plain(value)) for task, channel, value in t.pending_writes or ()
            ],
        )
        found.append((view, values))
    return found
