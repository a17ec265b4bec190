"""Threads as JSON Lines, and copying them between databases.

A line holds one memory (``"format": "tenxstore.memory/1"``, see
:mod:`tenxstore.memory.archive`) or one whole thread (``"format":
"tenxstore.thread/2"``): its record, retained states, messages with their times, tool
ledger, and LangGraph checkpoints and writes (their serialized values in base64).
Files of format 1 (without LangGraph data) are read too. Lines are written by
:func:`tenxstore.serde.encode`, so every value round-trips exactly (a line that holds
a huge integer or a NaN starts with a space, which JSON readers ignore).

Importing reads and checks every line of the file — its shape with typed records
(msgspec), then every field the store will write — before it writes anything, and
then writes the whole file in one transaction: an error anywhere, a conflict found
while writing included, writes nothing and names the line. Importing the same file
twice changes nothing. Copying reads the source in ``thread_id`` order and imports
each thread into the destination in its own transaction, so an interrupted copy
resumes where it stopped: threads already copied are unchanged.
"""

from __future__ import annotations

import collections
from base64 import b64encode
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TextIO

import msgspec
import msgspec.structs

from .crypto import EXPORT, KeyRing, sealed_key_id
from .errors import ConfigError, ImportConflict, TenxStoreError
from .langgraph.values import AllowedTypes, allowed_set
from .memory.archive import (
    MemoryExport,
    export_memories,
    import_memories,
    is_memory_line,
    memory_from_json,
    memory_to_json,
)
from .protocol import Checkpointer
from .serde import decode, encode
from .statements import load
from .types import (
    AuthPolicy,
    LangGraphBlob,
    LangGraphCheckpoint,
    LangGraphWrite,
    MessageRecord,
    OnConflict,
    StateSnapshot,
    ThreadExport,
    ThreadInfo,
    ToolExecution,
)

__all__ = [
    "FORMAT",
    "OPERATOR",
    "copy_memories",
    "copy_threads",
    "export_from_json",
    "export_threads",
    "export_to_json",
    "import_file",
    "read_exports",
    "read_memories",
    "write_exports",
]

FORMAT = "tenxstore.thread/2"
OPERATOR: dict[str, Any] = {"auth_policy": AuthPolicy(enforce_user_isolation=False)}
#: Threads listed per query when a whole store is exported or copied.
THREAD_PAGE = 500
Id = str | int
Count = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]


class _Thread(msgspec.Struct, forbid_unknown_fields=True):
    thread_id: Id
    user_id: Id | None
    name: str | None
    metadata: dict[str, Any]
    version: Count
    created_at: datetime
    updated_at: datetime


class _State(msgspec.Struct, forbid_unknown_fields=True):
    version: Positive
    state: dict[str, Any]
    meta: dict[str, Any]
    created_at: datetime


class _Message(msgspec.Struct, forbid_unknown_fields=True):
    message: dict[str, Any]
    created_at: datetime


class _ToolCall(msgspec.Struct, forbid_unknown_fields=True):
    tool_call_id: str
    tool_name: str
    args: dict[str, Any]
    status: Literal["started", "succeeded", "failed"]
    result: Any
    error: str | None
    attempts: Positive
    started_at: datetime
    finished_at: datetime | None
    lease_expires_at: datetime | None = None


class _Checkpoint(msgspec.Struct, forbid_unknown_fields=True):
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    type: str
    checkpoint: bytes  # base64 in JSON
    metadata: dict[str, Any]
    created_at: datetime
    versions: dict[str, str] | None = None


class _Blob(msgspec.Struct, forbid_unknown_fields=True):
    checkpoint_ns: str
    channel: str
    version: str
    type: str
    blob: bytes  # base64 in JSON


class _Write(msgspec.Struct, forbid_unknown_fields=True):
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    type: str
    value: bytes  # base64 in JSON
    task_path: str


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    format: Literal["tenxstore.thread/1", "tenxstore.thread/2"]
    thread: _Thread
    states: list[_State]
    messages: list[_Message]
    tool_executions: list[_ToolCall]
    langgraph_checkpoints: list[_Checkpoint] = []
    langgraph_writes: list[_Write] = []
    langgraph_blobs: list[_Blob] = []


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


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
        "tool_executions": [_tool_call_json(c) for c in export.tool_executions],
        "langgraph_checkpoints": [_checkpoint_json(c) for c in export.langgraph_checkpoints],
        "langgraph_writes": [_write_json(w) for w in export.langgraph_writes],
        "langgraph_blobs": [_blob_json(b) for b in export.langgraph_blobs],
    }


def _tool_call_json(c: ToolExecution) -> dict[str, Any]:
    return {
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


def _checkpoint_json(c: LangGraphCheckpoint) -> dict[str, Any]:
    return {
        "checkpoint_ns": c.checkpoint_ns,
        "checkpoint_id": c.checkpoint_id,
        "parent_checkpoint_id": c.parent_checkpoint_id,
        "type": c.type,
        "checkpoint": b64encode(c.checkpoint).decode(),
        "metadata": c.metadata,
        "created_at": _time(c.created_at),
        "versions": c.versions,
    }


def _write_json(w: LangGraphWrite) -> dict[str, Any]:
    return {
        "checkpoint_ns": w.checkpoint_ns,
        "checkpoint_id": w.checkpoint_id,
        "task_id": w.task_id,
        "idx": w.idx,
        "channel": w.channel,
        "type": w.type,
        "value": b64encode(w.value).decode(),
        "task_path": w.task_path,
    }


def _blob_json(b: LangGraphBlob) -> dict[str, Any]:
    return {
        "checkpoint_ns": b.checkpoint_ns,
        "channel": b.channel,
        "version": b.version,
        "type": b.type,
        "blob": b64encode(b.blob).decode(),
    }


def export_from_json(data: Any) -> ThreadExport:
    """An exported thread from its JSON object, every field typed.

    Raises:
        ConfigError: The object is not a tenxstore thread record; the message names
            the field (``$.thread.version``) and what was expected.
    """
    try:
        line = msgspec.convert(data, _Line)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"not a {FORMAT} record: {exc}") from None
    thread = ThreadInfo(**msgspec.structs.asdict(line.thread))
    return ThreadExport(
        thread=thread,
        states=tuple(StateSnapshot(**msgspec.structs.asdict(s)) for s in line.states),
        messages=tuple(MessageRecord(**msgspec.structs.asdict(m)) for m in line.messages),
        tool_executions=tuple(
            ToolExecution(thread_id=thread.thread_id, **msgspec.structs.asdict(c))
            for c in line.tool_executions
        ),
        langgraph_checkpoints=tuple(
            LangGraphCheckpoint(**msgspec.structs.asdict(c)) for c in line.langgraph_checkpoints
        ),
        langgraph_writes=tuple(
            LangGraphWrite(**msgspec.structs.asdict(w)) for w in line.langgraph_writes
        ),
        langgraph_blobs=tuple(
            LangGraphBlob(**msgspec.structs.asdict(b)) for b in line.langgraph_blobs
        ),
    )


async def _exports(
    store: Checkpointer, thread_ids: Iterable[Any] | None
) -> AsyncIterator[ThreadExport]:
    if thread_ids is None:
        async for info in store.aiter_threads(THREAD_PAGE):
            found = await store.aexport_thread({"thread_id": info.thread_id, **OPERATOR})
            if found is not None:  # deleted since it was listed
                yield found
        return
    for thread_id in thread_ids:
        export = await store.aexport_thread({"thread_id": thread_id, **OPERATOR})
        if export is None:
            raise ConfigError(f"no thread {thread_id!r}")
        yield export


def _ring(store: Checkpointer) -> KeyRing | None:
    keys = getattr(store, "keys", None)
    return keys if isinstance(keys, KeyRing) else None


def _memory_binding(identity: tuple[Any, tuple[str, ...], str]) -> str:
    """What a sealed memory line is bound to: its owner, namespace and key."""
    user_id, namespace, key = identity
    return encode([user_id, list(namespace), key])


async def write_exports(
    store: Checkpointer,
    out: TextIO,
    thread_ids: Iterable[Any] | None = None,
    *,
    sealed: bool = False,
    user_id: Any = None,
    memories: bool | None = None,
) -> int:
    """Write threads (all of them when ``thread_ids`` is None; ``user_id``'s, when
    given) and memories to ``out``; the count of lines.

    With ``sealed`` each line is kept encrypted: ``{"thread_id": ..., "sealed":
    envelope}``, the thread's export sealed under the store's current key and bound to
    its thread id (which stays clear, as in the database), and ``{"memory": [owner,
    namespace, key], "sealed": envelope}``; :func:`read_exports` opens it with a key
    ring that holds that key.

    Args:
        memories: Write the memories too (``user_id``'s, or every user's); None: when
            no ``thread_ids`` are named.

    Raises:
        ConfigError: ``sealed`` on a store without a key ring.
    """
    keys = _ring(store)
    if sealed and keys is None:
        raise ConfigError("a sealed export needs the store's key ring (keys=, or TENXSTORE_KEYS)")
    if user_id is not None and thread_ids is None:
        scope = {"user_id": user_id, "auth_policy": AuthPolicy(enforce_user_isolation=True)}
        thread_ids = [t.thread_id for t in await store.alist_threads(scope, limit=None)]
    count = 0
    async for export in _exports(store, thread_ids):
        line = encode(export_to_json(export), "export")
        if sealed and keys is not None:
            thread_id = export.thread.thread_id
            sealed_line = keys.seal(line, thread_id, EXPORT, None)  # no life: it travels
            line = encode({"thread_id": thread_id, "sealed": sealed_line})
        out.write(line + "\n")
        count += 1
    if memories or (memories is None and (thread_ids is None or user_id is not None)):
        from .memory.store import MemoryStore

        async for memory in export_memories(MemoryStore(store), user_id):
            line = encode(memory_to_json(memory), "export")
            if sealed and keys is not None:
                bound = _memory_binding(memory.identity)
                user, namespace, key = memory.identity
                line = encode(
                    {
                        "memory": [user, list(namespace), key],
                        "sealed": keys.seal(line, bound, EXPORT, None),
                    }
                )
            out.write(line + "\n")
            count += 1
    return count


async def export_threads(
    store: Checkpointer,
    path: Path,
    thread_ids: Iterable[Any] | None = None,
    *,
    sealed: bool = False,
    user_id: Any = None,
    memories: bool | None = None,
) -> int:
    """Write threads (all of them when ``thread_ids`` is None) to ``path``; their count
    (``sealed``: as :func:`write_exports`).

    The file is written beside ``path`` and renamed into place once complete, so a
    failure (a thread that does not exist) leaves no file behind.
    """
    partial = path.with_name(f".{path.name}.partial")
    try:
        with partial.open("w", encoding="utf-8") as out:
            count = await write_exports(
                store, out, thread_ids, sealed=sealed, user_id=user_id, memories=memories
            )
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return count


def read_exports(path: Path, keys: KeyRing | None = None) -> Iterator[tuple[int, ThreadExport]]:
    """The threads of a JSON Lines file with their line numbers, each line decoded and
    typed (a sealed line opened with ``keys``); an error names the line. Memory lines
    are passed over (:func:`read_memories` reads them).

    Raises:
        ConfigError: A line is malformed, or sealed and no key ring is given.
        DecryptionError: A sealed line does not open (another key ring, tampered, or
            moved to another thread id).
    """
    for number, data in _lines(path, keys):
        if is_memory_line(data):
            continue
        try:
            yield number, export_from_json(data)
        except ConfigError as exc:
            raise ConfigError(f"{path}:{number}: {exc}") from None


def read_memories(path: Path, keys: KeyRing | None = None) -> Iterator[tuple[int, MemoryExport]]:
    """The memories of a JSON Lines file with their line numbers (threads passed over).

    Raises:
        As :func:`read_exports`.
    """
    for number, data in _lines(path, keys):
        if not is_memory_line(data):
            continue
        try:
            yield number, memory_from_json(data)
        except ConfigError as exc:
            raise ConfigError(f"{path}:{number}: {exc}") from None


def _lines(path: Path, keys: KeyRing | None) -> Iterator[tuple[int, Any]]:
    """Each line of an export file decoded (a sealed line opened with ``keys``)."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = decode(line)
            except ValueError as exc:
                raise ConfigError(f"{path}:{number}: not JSON ({exc})") from None
            sealed_as = None
            if isinstance(data, dict) and set(data) == {"thread_id", "sealed"}:
                sealed_as = data["thread_id"]
            elif isinstance(data, dict) and set(data) == {"memory", "sealed"}:
                sealed_as = encode(data["memory"])
            if sealed_as is not None:
                if keys is None:
                    raise ConfigError(
                        f"{path}:{number}: the line is sealed: open it with the key ring it "
                        "was exported under (keys=, or TENXSTORE_KEYS)"
                    )
                if not isinstance(data["sealed"], str) or sealed_key_id(data["sealed"]) is None:
                    raise ConfigError(f"{path}:{number}: 'sealed' is not an envelope")
                try:
                    # bound to its thread id (a memory's: its identity), not to a life:
                    # it is opened here and sealed again for the life its import makes
                    data = load(keys, data["sealed"], sealed_as, EXPORT, None)
                except ValueError as exc:
                    raise ConfigError(f"{path}:{number}: not JSON ({exc})") from None
            yield number, data


async def import_file(
    store: Checkpointer,
    path: Path,
    on_conflict: OnConflict = "fail",
    progress: Callable[[str], None] | None = None,
    *,
    allowed_types: AllowedTypes = (),
) -> collections.Counter[str]:
    """Import every thread of ``path`` in one transaction; the outcomes counted.

    The file is read twice, a line at a time: first every line is checked (its shape,
    then every field as the store will write it, LangGraph values against the strict
    serde's types and ``allowed_types``), then the threads are written — so memory is
    bounded by the largest thread, not the file. An error anywhere — a conflict found
    while writing included — writes nothing, and the error names the line.

    Raises:
        ConfigError: A line is malformed, or names a thread another line names too.
        SerializationError: A value cannot be stored, or a LangGraph value names a
            type the strict serde refuses.
        ImportConflict: A thread exists with other content (``on_conflict="fail"``).
    """
    keys = _ring(store)

    def lines() -> Iterator[tuple[str | None, ThreadExport]]:
        for number, export in read_exports(path, keys):
            yield f"{path}:{number}", export

    memories = [(f"{path}:{number}", m) for number, m in read_memories(path, keys)]
    try:
        done = await store.aimport_stream(
            lines, on_conflict=on_conflict, allowed_types=allowed_types
        )
    except ImportConflict as exc:
        raise ImportConflict(f"{exc}; nothing was imported", exc.thread_id) from None
    counted: collections.Counter[str] = collections.Counter()
    for imported in done:
        counted[imported.outcome] += 1
        if progress:
            progress(imported.outcome)
    if memories:
        from .memory.store import MemoryStore

        try:
            outcomes = await import_memories(MemoryStore(store), memories, on_conflict=on_conflict)
        except ImportConflict as exc:
            raise ImportConflict(
                f"{exc}; the file's threads were imported, none of its memories"
            ) from None
        for outcome, n in outcomes.items():
            counted[f"memories {outcome}"] += n
    return counted


async def copy_threads(
    source: Checkpointer,
    destination: Checkpointer,
    on_conflict: OnConflict = "fail",
    progress: Callable[[str], None] | None = None,
    *,
    allowed_types: AllowedTypes = (),
) -> collections.Counter[str]:
    """Copy every thread of ``source`` into ``destination`` and verify each one.

    Resumable: a thread copied by an earlier, interrupted run imports as unchanged.
    LangGraph values are checked as an import checks them (``allowed_types``).

    Raises:
        TenxStoreError: A copied thread does not read back identical.
        SerializationError: A LangGraph value names a type the strict serde refuses
            (the threads before it are copied; that one is not).
    """
    allowed = allowed_set(allowed_types)
    outcomes: collections.Counter[str] = collections.Counter()
    async for export in _exports(source, None):
        outcome = await destination.aimport_thread(
            export, on_conflict=on_conflict, allowed_types=allowed
        )
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


async def copy_memories(
    source: Checkpointer,
    destination: Checkpointer,
    on_conflict: OnConflict = "fail",
    progress: Callable[[str], None] | None = None,
) -> collections.Counter[str]:
    """Copy every memory of ``source`` (with its retained versions) into
    ``destination``, each in its own transaction, and verify each one; resumable (a
    memory copied before imports as unchanged).

    Raises:
        TenxStoreError: A copied memory does not read back identical.
    """
    from .memory.store import MemoryStore

    src, dst = MemoryStore(source), MemoryStore(destination)
    outcomes: collections.Counter[str] = collections.Counter()
    async for memory in export_memories(src):
        done = await import_memories(dst, [(None, memory)], on_conflict=on_conflict)
        outcome = next(iter(done))
        outcomes[outcome] += 1
        if outcome != "skipped":
            user_id, namespace, key = memory.identity
            copied = await dst.ahistory(user_id, key, namespace=namespace)
            if [memory_to_json(MemoryExport(tuple(copied)))] != [memory_to_json(memory)]:
                raise TenxStoreError(f"memory {key!r} of user {user_id!r} differs after copying")
        if progress:
            progress(outcome)
    return outcomes
