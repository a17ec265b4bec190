"""A whole thread's rows turned into its export, and an export into rows to write.

:mod:`tenxstore.exports` reads and writes; this module holds what it does to the rows
in between: :func:`thread_export` opens the rows read in one snapshot into a
:class:`~tenxstore.types.ThreadExport` (a delta blob rebuilt whole), and
:func:`import_rows` checks every field of an export and encodes it, before any I/O,
into the rows an import inserts (:func:`sealed_rows` seals them for a key ring).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any, NamedTuple

from .crypto import (
    ARGS,
    BLOB,
    CHECKPOINT,
    ERROR,
    MESSAGE,
    META,
    METADATA,
    NAME,
    RESULT,
    STATE,
    WRITE,
    KeyRing,
    Life,
    check_type,
    life_of,
    open_typed,
)
from .deltas import BrokenChain, Stored, rebuild
from .errors import ConfigError, SerializationError
from .langgraph.tables import run_id_of
from .langgraph.values import check_value
from .serde import decode, encode, encode_state
from .statements import load, snapshot_of, thread_info, tool_execution, utc
from .store import Store, message_role
from .types import (
    LangGraphBlob,
    LangGraphCheckpoint,
    LangGraphWrite,
    MessageRecord,
    StateSnapshot,
    ThreadExport,
    ThreadInfo,
    ToolExecution,
)
from .validate import IdType, check_count, check_id, message_id

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_VERSION",
    "TOOL_STATUSES",
    "ThreadRows",
    "check_langgraph_values",
    "import_rows",
    "sealed_rows",
    "thread_export",
]

MAX_VERSION = 2**62
"""The largest version an import accepts: the BIGINT column still holds 2**62 more
writes after it (a version at the column's limit would make every later write fail)."""
MAX_ATTEMPTS = 2**31 - 2
"""The largest ``attempts`` an import accepts: the INTEGER column holds one more claim."""
TOOL_STATUSES = ("started", "succeeded", "failed")


# -- rows read -> an export ------------------------------------------------------------


class ThreadRows(NamedTuple):
    """The rows of one thread besides its own, read in one snapshot (the LangGraph
    ones sorted as an export lists them)."""

    states: Iterable[Any]
    messages: Iterable[Any]
    calls: Sequence[Any]
    checkpoints: Sequence[Any]
    writes: Sequence[Any]
    blobs: Sequence[Any]


def thread_export(thread_id: Any, row: Any, rows: ThreadRows, keys: KeyRing | None) -> ThreadExport:
    """The export of the thread whose row is ``row``, every value opened."""
    life = life_of(row)  # one snapshot: every value of the thread is of this life
    return ThreadExport(
        thread=thread_info(row, keys),
        states=tuple(snapshot_of(r, thread_id, keys, life) for r in rows.states),
        messages=tuple(
            MessageRecord(
                load(keys, r.payload, thread_id, MESSAGE, life),
                utc(r.created_at),  # type: ignore[arg-type]
            )
            for r in rows.messages
        ),
        tool_executions=tuple(tool_execution(thread_id, r, keys, life) for r in rows.calls),
        langgraph_checkpoints=tuple(
            _checkpoint_of(keys, thread_id, r, life) for r in rows.checkpoints
        ),
        langgraph_writes=tuple(_write_of(keys, thread_id, r, life) for r in rows.writes),
        langgraph_blobs=_whole_blobs([_opened_blob(keys, thread_id, r, life) for r in rows.blobs]),
    )


def _checkpoint_of(keys: KeyRing | None, thread_id: Any, r: Any, life: Life) -> LangGraphCheckpoint:
    return LangGraphCheckpoint(
        r.checkpoint_ns,
        r.checkpoint_id,
        r.parent_checkpoint_id,
        *open_typed(keys, r.type, bytes(r.checkpoint), thread_id, CHECKPOINT, life),
        decode(r.metadata),
        utc(r.created_at),  # type: ignore[arg-type]
        None if r.versions is None else decode(r.versions),
    )


def _write_of(keys: KeyRing | None, thread_id: Any, r: Any, life: Life) -> LangGraphWrite:
    return LangGraphWrite(
        r.checkpoint_ns,
        r.checkpoint_id,
        r.task_id,
        r.idx,
        r.channel,
        *open_typed(keys, r.type, bytes(r.value), thread_id, WRITE, life),
        r.task_path,
    )


def _opened_blob(keys: KeyRing | None, thread_id: Any, r: Any, life: Life) -> Any:
    """An ``lg_blobs`` row with its value opened (see :func:`~tenxstore.crypto.open_typed`)."""
    kind, blob = open_typed(keys, r.type, bytes(r.blob), thread_id, BLOB, life)
    return SimpleNamespace(
        checkpoint_ns=r.checkpoint_ns,
        channel=r.channel,
        version=r.version,
        type=kind,
        blob=blob,
        base=r.base,
        splice=r.splice,
        skip=r.skip,
        uid=r.uid,
    )


def _whole_blobs(rows: list[Any]) -> tuple[LangGraphBlob, ...]:
    """``lg_blobs`` rows as whole values: a delta is rebuilt from its chain (an export
    holds every value whole, readable by any release and database).

    Raises:
        SerializationError: A delta's chain is broken (a damaged database).
    """
    chains: dict[tuple[str, str], dict[str, Stored]] = {}
    for r in rows:
        chains.setdefault((r.checkpoint_ns, r.channel), {})[r.version] = Stored(
            r.type, bytes(r.blob), r.base, r.splice, r.skip, r.uid
        )
    try:
        return _rebuilt_blobs(rows, chains)
    except BrokenChain as exc:
        raise SerializationError(f"a LangGraph value cannot be rebuilt: {exc}") from exc


def _rebuilt_blobs(
    rows: list[Any], chains: dict[tuple[str, str], dict[str, Stored]]
) -> tuple[LangGraphBlob, ...]:
    return tuple(
        LangGraphBlob(
            r.checkpoint_ns,
            r.channel,
            r.version,
            r.type,
            bytes(r.blob)
            if r.base is None
            else rebuild(chains[(r.checkpoint_ns, r.channel)], r.version)[1],
        )
        for r in rows
    )


# -- an export -> rows to write ---------------------------------------------------------


def import_rows(export: ThreadExport, id_type: IdType, user_id_type: IdType) -> dict[str, Any]:
    """The rows an export becomes, every field checked and encoded, before any I/O.

    Raises:
        ConfigError: A field is missing, of the wrong type or inconsistent (the
            message names it: ``thread.version``, ``states[2].version``...).
        SerializationError: A value cannot be stored.
    """
    if not isinstance(export, ThreadExport):
        raise ConfigError(f"expected a ThreadExport, not {type(export).__name__}")
    info = export.thread
    thread_id, user_id, version = _thread_ids(info, id_type, user_id_type)
    _check_state_versions(export.states, version)
    message_ids = _message_ids(export.messages)
    calls = _tool_call_rows(thread_id, export.tool_executions)
    checkpoints, writes, blobs = _langgraph_rows(thread_id, export)
    return {
        "thread": _thread_row(info, thread_id, user_id, version),
        "states": _state_rows(thread_id, export.states),
        "messages": _message_rows(thread_id, message_ids, export.messages),
        "tool_executions": calls,
        "lg_checkpoints": checkpoints,
        "lg_writes": writes,
        "lg_blobs": blobs,
    }


def _thread_ids(info: ThreadInfo, id_type: IdType, user_id_type: IdType) -> tuple[Any, Any, int]:
    """The thread's id, user id and version, checked (and its name's type)."""
    thread_id = check_id("thread.thread_id", info.thread_id, id_type)
    user_id = (
        None if info.user_id is None else check_id("thread.user_id", info.user_id, user_id_type)
    )
    version = _bounded("thread.version", info.version, MAX_VERSION)
    if info.name is not None and not isinstance(info.name, str):
        raise ConfigError(f"thread.name must be a str or null, not {type(info.name).__name__}")
    return thread_id, user_id, version


def _check_state_versions(states: Sequence[StateSnapshot], version: int) -> None:
    """The retained states' versions: distinct, at least 1, the newest the thread's."""
    versions = []
    for i, snapshot in enumerate(states):
        versions.append(_bounded(f"states[{i}].version", snapshot.version, MAX_VERSION))
        if snapshot.version < 1:
            raise ConfigError(f"states[{i}].version must be at least 1, not {snapshot.version}")
    if len(set(versions)) != len(versions):
        raise ConfigError("states: two states have the same version")
    if max(versions, default=0) != version:
        raise ConfigError(
            f"thread.version is {version}, but the newest retained state is "
            f"{max(versions, default=0)} (a thread's newest state is its version)"
        )


def _message_ids(messages: Sequence[MessageRecord]) -> list[Any]:
    """Each message's id, every message an object and no id twice."""
    for i, record in enumerate(messages):
        if not isinstance(record.message, dict):
            raise ConfigError(
                f"messages[{i}].message must be an object, not {type(record.message).__name__}"
            )
    message_ids = [message_id(r.message.get("id")) for r in messages]
    if len(set(message_ids)) != len(message_ids):
        raise ConfigError("messages: two messages have the same id")
    return message_ids


def _tool_call_rows(thread_id: Any, executions: Sequence[ToolExecution]) -> list[dict[str, Any]]:
    """The ``tool_executions`` rows, no ``tool_call_id`` twice."""
    calls = [_tool_call_row(thread_id, i, call) for i, call in enumerate(executions)]
    if len({c["tool_call_id"] for c in calls}) != len(calls):
        raise ConfigError("tool_executions: two calls have the same tool_call_id")
    return calls


def _tool_call_row(thread_id: Any, i: int, call: ToolExecution) -> dict[str, Any]:
    where = f"tool_executions[{i}]"
    if call.status not in TOOL_STATUSES:
        raise ConfigError(f"{where}.status must be one of {TOOL_STATUSES}, not {call.status!r}")
    attempts = _bounded(f"{where}.attempts", call.attempts, MAX_ATTEMPTS)
    if attempts < 1:
        raise ConfigError(f"{where}.attempts must be at least 1, not {attempts}")
    if call.error is not None and not isinstance(call.error, str):
        raise ConfigError(f"{where}.error must be a str or null")
    return {
        "thread_id": thread_id,
        "tool_call_id": check_id(f"{where}.tool_call_id", call.tool_call_id),
        "tool_name": check_id(f"{where}.tool_name", call.tool_name),
        "args": Store.encode_object(call.args, f"{where}.args"),
        "status": call.status,
        "result": None if call.result is None else encode(call.result, f"{where}.result"),
        "error": None if call.error is None else encode(call.error, f"{where}.error"),
        "attempts": attempts,
        "lease_expires_at": _optional_datetime(call.lease_expires_at, f"{where}.lease_expires_at"),
        "started_at": _datetime(call.started_at, f"{where}.started_at"),
        "finished_at": _optional_datetime(call.finished_at, f"{where}.finished_at"),
    }


def _langgraph_rows(
    thread_id: Any, export: ThreadExport
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``lg_checkpoints``, ``lg_writes`` and ``lg_blobs`` rows, none twice."""
    checkpoints = [
        _lg_checkpoint(thread_id, i, c) for i, c in enumerate(export.langgraph_checkpoints)
    ]
    if len({(c["checkpoint_ns"], c["checkpoint_id"]) for c in checkpoints}) != len(checkpoints):
        raise ConfigError("langgraph_checkpoints: two have the same namespace and id")
    writes = [_lg_write(thread_id, i, w) for i, w in enumerate(export.langgraph_writes)]
    keys = {(w["checkpoint_ns"], w["checkpoint_id"], w["task_id"], w["idx"]) for w in writes}
    if len(keys) != len(writes):
        raise ConfigError("langgraph_writes: two have the same checkpoint, task and index")
    blobs = [_lg_blob(thread_id, i, b) for i, b in enumerate(export.langgraph_blobs)]
    if len({(b["checkpoint_ns"], b["channel"], b["version"]) for b in blobs}) != len(blobs):
        raise ConfigError("langgraph_blobs: two have the same namespace, channel and version")
    return checkpoints, writes, blobs


def _thread_row(info: ThreadInfo, thread_id: Any, user_id: Any, version: int) -> dict[str, Any]:
    return {
        "thread_id": thread_id,
        "user_id": user_id,
        "name": None if info.name is None else encode(info.name, "thread.name"),
        "metadata": Store.encode_object(info.metadata, "thread.metadata")
        if info.metadata
        else None,
        "version": version,
        "created_at": _datetime(info.created_at, "thread.created_at"),
        "updated_at": _datetime(info.updated_at, "thread.updated_at"),
    }


def _state_rows(thread_id: Any, states: Sequence[StateSnapshot]) -> list[dict[str, Any]]:
    return [
        {
            "thread_id": thread_id,
            "version": snapshot.version,
            "state_data": encode_state(snapshot.state),
            "meta": Store.encode_object(snapshot.meta, "state meta") if snapshot.meta else None,
            "created_at": _datetime(snapshot.created_at, "state created_at"),
        }
        for snapshot in sorted(states, key=lambda snapshot: snapshot.version)
    ]


def _message_rows(
    thread_id: Any, message_ids: list[Any], messages: Sequence[MessageRecord]
) -> list[dict[str, Any]]:
    return [
        {
            "thread_id": thread_id,
            "message_id": mid,
            "role": message_role(r.message.get("role")),
            "payload": Store.encode_object(r.message, "message"),
            "created_at": _datetime(r.created_at, "message created_at"),
        }
        for mid, r in zip(message_ids, messages, strict=True)
    ]


def _bounded(what: str, value: object, top: int) -> int:
    count = check_count(what, value)
    if count > top:
        raise ConfigError(f"{what} must be at most {top}, not {count}")
    return count


def _datetime(value: object, what: str) -> datetime:
    """A time as it is stored: in UTC (a naive one is taken as UTC). SQLite and MySQL
    columns hold no zone: a time written with its offset lost its offset, and one
    past 9999-12-31 UTC (``9999-12-31T23:59:59-05:00``) was cut to what fits."""
    if not isinstance(value, datetime):
        raise ConfigError(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise ConfigError(
            f"{what} {value.isoformat()} is out of range: in UTC it is past 9999-12-31"
        ) from None


def _optional_datetime(value: object, what: str) -> datetime | None:
    return None if value is None else _datetime(value, what)


def _text(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ConfigError(f"{what} must be a str of at most {limit} characters")
    Store.encode_object({"v": value}, what)  # valid Unicode (no lone surrogates)
    return value


def _blob(value: object, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray)):
        raise ConfigError(f"{what} must be bytes, not {type(value).__name__}")
    return bytes(value)


def _lg_checkpoint(thread_id: Any, i: int, c: Any) -> dict[str, Any]:
    where = f"langgraph_checkpoints[{i}]"
    if not isinstance(c, LangGraphCheckpoint):
        raise ConfigError(f"{where} must be a LangGraphCheckpoint")
    parent = c.parent_checkpoint_id
    return {
        "thread_id": thread_id,
        "checkpoint_ns": _text(c.checkpoint_ns, f"{where}.checkpoint_ns", 255),
        "checkpoint_id": _text(c.checkpoint_id, f"{where}.checkpoint_id", 64),
        "parent_checkpoint_id": None
        if parent is None
        else _text(parent, f"{where}.parent_checkpoint_id", 64),
        "type": check_type(_text(c.type, f"{where}.type", 64)),
        "checkpoint": _blob(c.checkpoint, f"{where}.checkpoint"),
        "metadata": Store.encode_object(c.metadata, f"{where}.metadata"),
        "created_at": _datetime(c.created_at, f"{where}.created_at"),
        "run_id": run_id_of(c.metadata),
        "versions": None if c.versions is None else _versions(c.versions, f"{where}.versions"),
    }


def _versions(value: object, what: str) -> str:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(v) <= 255 for k, v in value.items()
    ):
        raise ConfigError(f"{what} must be a dict of channel names to version strings")
    return encode(value, what)


def _lg_blob(thread_id: Any, i: int, b: Any) -> dict[str, Any]:
    where = f"langgraph_blobs[{i}]"
    if not isinstance(b, LangGraphBlob):
        raise ConfigError(f"{where} must be a LangGraphBlob")
    return {
        "thread_id": thread_id,
        "checkpoint_ns": _text(b.checkpoint_ns, f"{where}.checkpoint_ns", 255),
        "channel": _text(b.channel, f"{where}.channel", 255),
        "version": _text(b.version, f"{where}.version", 255),
        "type": check_type(_text(b.type, f"{where}.type", 64)),
        "blob": _blob(b.blob, f"{where}.blob"),
    }


def _lg_write(thread_id: Any, i: int, w: Any) -> dict[str, Any]:
    where = f"langgraph_writes[{i}]"
    if not isinstance(w, LangGraphWrite):
        raise ConfigError(f"{where} must be a LangGraphWrite")
    if isinstance(w.idx, bool) or not isinstance(w.idx, int) or not -(2**31) <= w.idx < 2**31:
        raise ConfigError(f"{where}.idx must be an int that a 32-bit column holds")
    return {
        "thread_id": thread_id,
        "checkpoint_ns": _text(w.checkpoint_ns, f"{where}.checkpoint_ns", 255),
        "checkpoint_id": _text(w.checkpoint_id, f"{where}.checkpoint_id", 64),
        "task_id": _text(w.task_id, f"{where}.task_id", 255),
        "idx": w.idx,
        "channel": _text(w.channel, f"{where}.channel", 10_000),
        "type": check_type(_text(w.type, f"{where}.type", 64)),
        "value": _blob(w.value, f"{where}.value"),
        "task_path": _text(w.task_path, f"{where}.task_path", 10_000),
    }


def check_langgraph_values(rows: dict[str, Any], allowed: frozenset[tuple[str, ...]]) -> None:
    """Every LangGraph value of :func:`import_rows` one that the strict serde opens
    (see :func:`tenxstore.langgraph.values.check_value`).

    Raises:
        SerializationError: One is not; the message names it.
    """
    for key, name, field in (
        ("lg_checkpoints", "checkpoint", "langgraph_checkpoints"),
        ("lg_writes", "value", "langgraph_writes"),
        ("lg_blobs", "blob", "langgraph_blobs"),
    ):
        for i, row in enumerate(rows[key]):
            check_value(row["type"], row[name], f"{field}[{i}].{name}", allowed)


_SEALED = {
    "thread": (("name", NAME), ("metadata", METADATA)),
    "states": (("state_data", STATE), ("meta", META)),
    "messages": (("payload", MESSAGE),),
    "tool_executions": (("args", ARGS), ("result", RESULT), ("error", ERROR)),
}


def sealed_rows(keys: KeyRing, thread_id: Any, rows: dict[str, Any], life: Life) -> dict[str, Any]:
    """:func:`import_rows` with every payload sealed for ``thread_id`` and ``life``."""

    def seal(row: dict[str, Any], columns: tuple[tuple[str, str], ...]) -> dict[str, Any]:
        out = dict(row)
        for name, column in columns:
            if out[name] is not None:
                out[name] = keys.seal(out[name], thread_id, column, life)
        return out

    def seal_typed(row: dict[str, Any], name: str, column: str) -> dict[str, Any]:
        kind, data = keys.seal_typed(row["type"], row[name], thread_id, column, life)
        return {**row, "type": kind, name: data}

    sealed = dict(rows)
    sealed["thread"] = seal(rows["thread"], _SEALED["thread"])
    for key in ("states", "messages", "tool_executions"):
        sealed[key] = [seal(row, _SEALED[key]) for row in rows[key]]
    for key, name, column in (
        ("lg_checkpoints", "checkpoint", CHECKPOINT),
        ("lg_writes", "value", WRITE),
        ("lg_blobs", "blob", BLOB),
    ):
        sealed[key] = [seal_typed(row, name, column) for row in rows[key]]
    return sealed
