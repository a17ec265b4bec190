"""Threads as JSON Lines, and copying them between databases.

One line holds one whole thread (``"format": "tenxstore.thread/1"``): its record,
retained states, messages with their times, and tool ledger. Lines are written by
:func:`tenxstore.serde.encode`, so every value round-trips exactly (a line that holds
a huge integer or a NaN starts with a space, which JSON readers ignore).

Importing validates the whole file before it writes anything, then writes one thread
per transaction; importing the same file twice changes nothing. Copying reads the
source in ``thread_id`` order and imports each thread into the destination, so an
interrupted copy resumes where it stopped: threads already copied are unchanged.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from .errors import ConfigError, TenxStoreError
from .serde import decode, encode
from .types import AuthPolicy, MessageRecord, StateSnapshot, ThreadExport, ThreadInfo, ToolExecution

__all__ = [
    "FORMAT",
    "copy_threads",
    "export_from_json",
    "export_threads",
    "export_to_json",
    "import_file",
    "read_exports",
]

FORMAT = "tenxstore.thread/1"
OPERATOR: dict[str, Any] = {"auth_policy": AuthPolicy(enforce_user_isolation=False)}


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse_time(value: Any, what: str, optional: bool = False) -> datetime | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be an ISO 8601 time, not {value!r}")
    try:
        return datetime.fromisoformat(value)
    except ValueError as exc:
        raise ConfigError(f"{what} is not an ISO 8601 time: {value!r}") from exc


def export_to_json(export: ThreadExport) -> dict[str, Any]:
    """The JSON object of one exported thread."""
    t = export.thread
    return {
        "format": FORMAT,
        "thread": {
            "thread_id": t.thread_id,
            "user_id": t.user_id,
            "name": t.name,
            "metadata": t.metadata,
            "version": t.version,
            "created_at": _time(t.created_at),
            "updated_at": _time(t.updated_at),
        },
        "states": [
            {
                "version": s.version,
                "state": s.state,
                "meta": s.meta,
                "created_at": _time(s.created_at),
            }
            for s in export.states
        ],
        "messages": [
            {"message": m.message, "created_at": _time(m.created_at)} for m in export.messages
        ],
        "tool_executions": [
            {
                "tool_call_id": c.tool_call_id,
                "tool_name": c.tool_name,
                "args": c.args,
                "status": c.status,
                "result": c.result,
                "error": c.error,
                "attempts": c.attempts,
                "started_at": _time(c.started_at),
                "finished_at": _time(c.finished_at),
                "lease_expires_at": _time(c.lease_expires_at),
            }
            for c in export.tool_executions
        ],
    }


def _field(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ConfigError(f"{where}: missing {key!r}")
    return obj[key]


def export_from_json(data: Any) -> ThreadExport:
    """An exported thread from its JSON object.

    Raises:
        ConfigError: The object is not a tenxstore thread export.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"not a {FORMAT} record")
    t = _field(data, "thread", "record")
    thread = ThreadInfo(
        thread_id=_field(t, "thread_id", "thread"),
        user_id=_field(t, "user_id", "thread"),
        name=_field(t, "name", "thread"),
        metadata=_field(t, "metadata", "thread"),
        version=_field(t, "version", "thread"),
        created_at=_parse_time(_field(t, "created_at", "thread"), "thread.created_at"),
        updated_at=_parse_time(_field(t, "updated_at", "thread"), "thread.updated_at"),
    )
    try:
        states = tuple(
            StateSnapshot(
                version=_field(s, "version", "state"),
                state=_field(s, "state", "state"),
                meta=_field(s, "meta", "state"),
                created_at=_parse_time(_field(s, "created_at", "state"), "state.created_at"),  # type: ignore[arg-type]
            )
            for s in _field(data, "states", "record")
        )
        messages = tuple(
            MessageRecord(
                message=_field(m, "message", "message"),
                created_at=_parse_time(_field(m, "created_at", "message"), "message.created_at"),  # type: ignore[arg-type]
            )
            for m in _field(data, "messages", "record")
        )
        calls = tuple(
            ToolExecution(
                thread_id=thread.thread_id,
                tool_call_id=_field(c, "tool_call_id", "tool execution"),
                tool_name=_field(c, "tool_name", "tool execution"),
                args=_field(c, "args", "tool execution"),
                status=_field(c, "status", "tool execution"),
                result=_field(c, "result", "tool execution"),
                error=_field(c, "error", "tool execution"),
                attempts=_field(c, "attempts", "tool execution"),
                started_at=_parse_time(c.get("started_at"), "started_at"),  # type: ignore[arg-type]
                finished_at=_parse_time(c.get("finished_at"), "finished_at", optional=True),
                lease_expires_at=_parse_time(
                    c.get("lease_expires_at"), "lease_expires_at", optional=True
                ),
            )
            for c in _field(data, "tool_executions", "record")
        )
    except TypeError as exc:  # a list where a record was expected, and the like
        raise ConfigError(f"malformed thread record: {exc}") from exc
    return ThreadExport(thread=thread, states=states, messages=messages, tool_executions=calls)


async def _exports(store: Any, thread_ids: Iterable[Any] | None) -> AsyncIterator[ThreadExport]:
    if thread_ids is None:
        async for info in store.aiter_threads():
            found = await store.aexport_thread({"thread_id": info.thread_id, **OPERATOR})
            if found is not None:  # deleted since it was listed
                yield found
        return
    for thread_id in thread_ids:
        export = await store.aexport_thread({"thread_id": thread_id, **OPERATOR})
        if export is None:
            raise ConfigError(f"no thread {thread_id!r}")
        yield export


async def export_threads(store: Any, path: Path, thread_ids: Iterable[Any] | None = None) -> int:
    """Write threads (all of them when ``thread_ids`` is None) to ``path``; their count."""
    count = 0
    with path.open("w", encoding="utf-8") as out:
        async for export in _exports(store, thread_ids):
            out.write(encode(export_to_json(export), "export") + "\n")
            count += 1
    return count


def read_exports(path: Path) -> Iterator[ThreadExport]:
    """The threads of a JSON Lines file, each checked; errors name the line."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield export_from_json(decode(line))
            except (ValueError, TenxStoreError) as exc:
                raise ConfigError(f"{path}:{number}: {exc}") from None


async def import_file(
    store: Any,
    path: Path,
    on_conflict: str = "fail",
    progress: Callable[[str], None] | None = None,
) -> collections.Counter[str]:
    """Import every thread of ``path``: the whole file is checked before anything is
    written, then each thread is one transaction. Returns the outcomes counted."""
    checked = sum(1 for _ in read_exports(path))
    outcomes: collections.Counter[str] = collections.Counter()
    for export in read_exports(path):
        outcome = await store.aimport_thread(export, on_conflict=on_conflict)
        outcomes[outcome] += 1
        if progress:
            progress(outcome)
    assert sum(outcomes.values()) == checked
    return outcomes


async def copy_threads(
    source: Any,
    destination: Any,
    on_conflict: str = "fail",
    progress: Callable[[str], None] | None = None,
) -> collections.Counter[str]:
    """Copy every thread of ``source`` into ``destination`` and verify each one.

    Resumable: a thread copied by an earlier, interrupted run imports as unchanged.

    Raises:
        TenxStoreError: A copied thread does not read back identical.
    """
    outcomes: collections.Counter[str] = collections.Counter()
    async for export in _exports(source, None):
        outcome = await destination.aimport_thread(export, on_conflict=on_conflict)
        outcomes[outcome] += 1
        if outcome != "skipped":
            copied = await destination.aexport_thread(
                {"thread_id": export.thread.thread_id, **OPERATOR}
            )
            if copied is None or export_to_json(copied) != export_to_json(export):
                raise TenxStoreError(f"thread {export.thread.thread_id!r} differs after copying")
        if progress:
            progress(outcome)
    return outcomes
