"""Whole threads: every thread of a store, and one thread's export and import.

The CLI's ``export``, ``import`` and ``copy`` are built on these operator calls: they
take no run config (or one with an operator ``AuthPolicy``) and read or write a whole
thread — record, retained states, messages, tool ledger — in one transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

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
from .errors import ConfigError, ImportConflict, SerializationError
from .langgraph.tables import run_id_of
from .langgraph.values import AllowedTypes, allowed_set, check_value
from .serde import decode, encode, encode_state
from .statements import load, snapshot_of, thread_info, tool_execution, utc
from .store import Store, message_role
from .types import (
    Commit,
    Imported,
    ImportOutcome,
    LangGraphBlob,
    LangGraphCheckpoint,
    LangGraphWrite,
    MessageRecord,
    OnConflict,
    ThreadExport,
    ThreadInfo,
)
from .validate import IdType, check_choice, check_count, check_id, message_id

ON_CONFLICT: tuple[OnConflict, ...] = ("fail", "skip", "replace")
MAX_VERSION = 2**62
"""The largest version an import accepts: the BIGINT column still holds 2**62 more
writes after it (a version at the column's limit would make every later write fail)."""
MAX_ATTEMPTS = 2**31 - 2
"""The largest ``attempts`` an import accepts: the INTEGER column holds one more claim."""
TOOL_STATUSES = ("started", "succeeded", "failed")

__all__ = ["ThreadExports", "import_rows"]


class ThreadExports:
    """Iteration over every thread, and whole-thread export and import."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def aiter_threads(self, batch: int = 500) -> AsyncIterator[ThreadInfo]:
        """Every thread of every user, in ``thread_id`` order, read ``batch`` at a time."""
        batch = check_count("batch", batch) or 1
        t = self._store.tables.threads
        after: Any = None
        while True:
            stmt = select(*t.c).order_by(t.c.thread_id).limit(batch)
            if after is not None:
                stmt = stmt.where(t.c.thread_id > after)
            rows = await self._store.read(stmt)
            for row in rows:
                yield thread_info(row, self._store.keys)
            if len(rows) < batch:
                return
            after = rows[-1].thread_id

    async def _export(self, conn: AsyncConnection, thread_id: Any) -> ThreadExport | None:
        t, s, m, x = self._store.tables[:4]
        c, w = self._store.tables.lg_checkpoints, self._store.tables.lg_writes
        row = (await conn.execute(select(*t.c).where(t.c.thread_id == thread_id))).first()
        if row is None:
            return None
        states = await conn.execute(
            select(s.c.version, s.c.state_data, s.c.meta, s.c.created_at)
            .where(s.c.thread_id == thread_id)
            .order_by(s.c.version.desc())
        )
        messages = await conn.execute(
            select(m.c.payload, m.c.created_at).where(m.c.thread_id == thread_id).order_by(m.c.seq)
        )
        # Sorted here, not by the database: a collation would order names differently
        # on another database, and an export must be the same wherever it is read.
        calls = sorted(
            (await conn.execute(select(*x.c).where(x.c.thread_id == thread_id))).all(),
            key=lambda r: (utc(r.started_at), r.tool_call_id),
        )
        b = self._store.tables.lg_blobs
        checkpoints = sorted(
            (await conn.execute(select(*c.c).where(c.c.thread_id == thread_id))).all(),
            key=lambda r: (r.checkpoint_ns, r.checkpoint_id),
        )
        writes = sorted(
            (await conn.execute(select(*w.c).where(w.c.thread_id == thread_id))).all(),
            key=lambda r: (r.checkpoint_ns, r.checkpoint_id, r.task_id, r.idx),
        )
        blobs = sorted(
            (await conn.execute(select(*b.c).where(b.c.thread_id == thread_id))).all(),
            key=lambda r: (r.checkpoint_ns, r.channel, r.version),
        )
        keys = self._store.keys
        life = life_of(row)  # one snapshot: every value of the thread is of this life
        return ThreadExport(
            thread=thread_info(row, keys),
            states=tuple(snapshot_of(r, thread_id, keys, life) for r in states),
            messages=tuple(
                MessageRecord(
                    load(keys, r.payload, thread_id, MESSAGE, life),
                    utc(r.created_at),  # type: ignore[arg-type]
                )
                for r in messages
            ),
            tool_executions=tuple(tool_execution(thread_id, r, keys, life) for r in calls),
            langgraph_checkpoints=tuple(
                LangGraphCheckpoint(
                    r.checkpoint_ns,
                    r.checkpoint_id,
                    r.parent_checkpoint_id,
                    *open_typed(keys, r.type, bytes(r.checkpoint), thread_id, CHECKPOINT, life),
                    decode(r.metadata),
                    utc(r.created_at),  # type: ignore[arg-type]
                    None if r.versions is None else decode(r.versions),
                )
                for r in checkpoints
            ),
            langgraph_writes=tuple(
                LangGraphWrite(
                    r.checkpoint_ns,
                    r.checkpoint_id,
                    r.task_id,
                    r.idx,
                    r.channel,
                    *open_typed(keys, r.type, bytes(r.value), thread_id, WRITE, life),
                    r.task_path,
                )
                for r in writes
            ),
            langgraph_blobs=_whole_blobs([_opened_blob(keys, thread_id, r, life) for r in blobs]),
        )

    async def aexport_thread(self, config: dict[str, Any]) -> ThreadExport | None:
        """Everything stored of one thread, read in one snapshot; None when absent
        (or another user's while isolation applies)."""
        ids = self._store.ids(config)
        async with self._store.snapshot() as conn:
            export = await self._export(conn, ids.thread_id)
        if export is None or (ids.isolated and export.thread.user_id != ids.user_id):
            return None
        return export

    async def aimport_thread(
        self,
        export: ThreadExport,
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> ImportOutcome:
        """Write an exported thread back, in one transaction.

        Importing what is already there changes nothing. A thread that exists with
        other content is a conflict: ``on_conflict="fail"`` raises
        :class:`ImportConflict`, ``"skip"`` leaves it, ``"replace"`` deletes it first.
        An imported thread is a new life of its id (see the incarnations).

        Its LangGraph values come from outside this process: each must be one that
        LangGraph's strict serde opens (its safe types, and ``allowed_types``),
        else nothing is written (see :mod:`tenxstore.langgraph.values`).

        Returns:
            ``"created"``, ``"unchanged"``, ``"skipped"`` or ``"replaced"``.

        Raises:
            ImportConflict: The thread exists with other content (``"fail"``).
            SerializationError: Something in the export cannot be stored, or a
                LangGraph value names a type the strict serde refuses.
            ConfigError: Bad ids, versions, statuses or ``on_conflict``.
        """
        [outcome] = await self.aimport_threads(
            [export], on_conflict=on_conflict, allowed_types=allowed_types
        )
        return outcome

    async def aimport_threads(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[ImportOutcome]:
        """:meth:`aimport`, returning each thread's outcome."""
        done = await self.aimport(exports, on_conflict=on_conflict, allowed_types=allowed_types)
        return [imported.outcome for imported in done]

    async def aimport(
        self,
        exports: Sequence[ThreadExport],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """Write exported threads back, all in ONE transaction: every export is checked
        before anything is written, and any error (a conflict found while writing
        included) writes nothing. Their rows are locked in ``thread_id`` order.

        Returns:
            What was done with each export, in order (with the life it replaced).

        Raises:
            ImportConflict: A thread exists with other content (``"fail"``); its
                ``thread_id`` says which.
            SerializationError: Something in an export cannot be stored.
            ConfigError: Bad ids, versions, statuses, a thread given twice, or
                ``on_conflict``.
        """
        given = list(exports)
        return await self.aimport_stream(
            lambda: ((None, export) for export in given),
            on_conflict=on_conflict,
            allowed_types=allowed_types,
        )

    async def aimport_stream(
        self,
        source: Callable[[], Iterable[tuple[str | None, ThreadExport]]],
        *,
        on_conflict: OnConflict = "fail",
        allowed_types: AllowedTypes = (),
    ) -> list[Imported]:
        """:meth:`aimport` of exports read twice from ``source`` — once to check every
        one, once to write them in ONE transaction — so memory is bounded by the
        largest thread, not by all of them (a file of any size, say).

        Args:
            source: Called once per pass; yields ``(label, export)``: the label (a
                file's ``path:line``, or None) prefixes the errors about that export.
                Both passes must yield the same threads: one that changed in between
                writes nothing (``ConfigError``).

        Raises:
            As :meth:`aimport`, each error naming the export's label.
        """
        store = self._store
        on_conflict = check_choice("on_conflict", on_conflict, ON_CONFLICT)
        allowed = allowed_set(allowed_types)
        seen: dict[Any, str | None] = {}
        for label, export in source():  # pass 1: everything checked, nothing kept
            thread_id = self._checked(label, export, allowed)["thread"]["thread_id"]
            if thread_id in seen:
                first = seen[thread_id]
                also = f" (also {first})" if first else ""
                raise ConfigError(
                    _at(label, f"an import names thread {thread_id!r} more than once{also}")
                )
            seen[thread_id] = label
        if not seen:
            return []
        outcomes: list[Imported] = []
        async with store.write_many(seen) as (conn, locked):
            written: set[Any] = set()
            for label, export in source():  # pass 2: written one thread at a time
                new = self._checked(label, export, allowed)
                thread_id = new["thread"]["thread_id"]
                if thread_id not in seen or thread_id in written:
                    raise ConfigError(
                        _at(label, f"thread {thread_id!r} was not there when the import was "
                            "checked (the source changed meanwhile); nothing was written")
                    )  # fmt: skip
                written.add(thread_id)
                outcomes.append(
                    await self._write_one(conn, locked[thread_id], label, new, on_conflict)
                )
            if written != set(seen):
                raise ConfigError(
                    "the import's source changed while it was written: a thread it held "
                    "is gone; nothing was written"
                )
        return outcomes

    def _checked(
        self, label: str | None, export: ThreadExport, allowed: frozenset[tuple[str, ...]]
    ) -> dict[str, Any]:
        """The rows of one export, every field checked (errors prefixed with ``label``)."""
        settings = self._store.settings
        try:
            rows = import_rows(export, settings.id_type, settings.user_id_type)
            if self._store.keys is not None:  # sealed, a type takes one more character
                for key in ("lg_checkpoints", "lg_writes", "lg_blobs"):
                    for value in rows[key]:
                        check_type(value["type"], sealed=True)
            check_langgraph_values(rows, allowed)
        except SerializationError as exc:
            if label is None:
                raise
            raise SerializationError(_at(label, str(exc))) from None
        except ConfigError as exc:
            if label is None:
                raise
            raise ConfigError(_at(label, str(exc))) from None
        return rows

    async def _write_one(
        self,
        conn: AsyncConnection,
        row: Any,
        label: str | None,
        new: dict[str, Any],
        on_conflict: OnConflict,
    ) -> Imported:
        """Write one checked export under its thread's lock (``row``: the thread's
        locked row, or None)."""
        store = self._store
        settings = store.settings
        thread_id = new["thread"]["thread_id"]
        user_id = new["thread"]["user_id"]
        done = Imported("created", thread_id=thread_id, user_id=user_id)
        if row is not None:
            existing = await self._export(conn, thread_id)
            if (
                existing is not None
                and import_rows(existing, settings.id_type, settings.user_id_type) == new
            ):
                return Imported("unchanged", thread_id=thread_id, user_id=user_id)
            if on_conflict == "skip":
                return Imported("skipped", thread_id=thread_id, user_id=user_id)
            if on_conflict == "fail":
                raise ImportConflict(
                    _at(
                        label,
                        f"thread {thread_id!r} exists with other content; "
                        "import with on_conflict='replace' or 'skip'",
                    ),
                    thread_id=thread_id,
                )
            await store.delete_thread(conn, thread_id)
            replaced = Commit(thread_id, row.user_id, row.incarnation, row.version)
            done = Imported("replaced", replaced, thread_id=thread_id, user_id=user_id)
        t, s, m, x = store.tables[:4]
        if store.keys is None:
            await conn.execute(insert(t), [new["thread"]])
        else:
            # The values are sealed for the life this import creates, whose incarnation
            # the database gives the new row: the row first, with its name and metadata
            # left out (never written in clear, not even in this transaction's log),
            # then everything sealed for it.
            await conn.execute(insert(t), [{**new["thread"], "name": None, "metadata": None}])
            life = life_of((await conn.execute(store.sql.lock, {"b_thread": thread_id})).one())
            new = _sealed(store.keys, thread_id, new, life)
            row_of = new["thread"]
            named = {k: row_of[k] for k in ("name", "metadata") if row_of[k] is not None}
            if named:
                await conn.execute(update(t).where(t.c.thread_id == thread_id).values(**named))
        lg = (
            (store.tables.lg_checkpoints, "lg_checkpoints"),
            (store.tables.lg_writes, "lg_writes"),
            (store.tables.lg_blobs, "lg_blobs"),
        )
        for table, key in ((s, "states"), (m, "messages"), (x, "tool_executions"), *lg):
            if new[key]:
                await conn.execute(insert(table), new[key])
        return done


def _at(label: str | None, message: str) -> str:
    """A message about one export, prefixed with where it came from."""
    return message if label is None else f"{label}: {message}"


_SEALED = {
    "thread": (("name", NAME), ("metadata", METADATA)),
    "states": (("state_data", STATE), ("meta", META)),
    "messages": (("payload", MESSAGE),),
    "tool_executions": (("args", ARGS), ("result", RESULT), ("error", ERROR)),
}


def _sealed(keys: KeyRing, thread_id: Any, rows: dict[str, Any], life: Life) -> dict[str, Any]:
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
    thread_id = check_id("thread.thread_id", info.thread_id, id_type)
    user_id = (
        None if info.user_id is None else check_id("thread.user_id", info.user_id, user_id_type)
    )
    version = _bounded("thread.version", info.version, MAX_VERSION)
    if info.name is not None and not isinstance(info.name, str):
        raise ConfigError(f"thread.name must be a str or null, not {type(info.name).__name__}")
    versions = []
    for i, snapshot in enumerate(export.states):
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
    for i, record in enumerate(export.messages):
        if not isinstance(record.message, dict):
            raise ConfigError(
                f"messages[{i}].message must be an object, not {type(record.message).__name__}"
            )
    message_ids = [message_id(r.message.get("id")) for r in export.messages]
    if len(set(message_ids)) != len(message_ids):
        raise ConfigError("messages: two messages have the same id")
    calls = []
    for i, call in enumerate(export.tool_executions):
        where = f"tool_executions[{i}]"
        if call.status not in TOOL_STATUSES:
            raise ConfigError(f"{where}.status must be one of {TOOL_STATUSES}, not {call.status!r}")
        attempts = _bounded(f"{where}.attempts", call.attempts, MAX_ATTEMPTS)
        if attempts < 1:
            raise ConfigError(f"{where}.attempts must be at least 1, not {attempts}")
        if call.error is not None and not isinstance(call.error, str):
            raise ConfigError(f"{where}.error must be a str or null")
        calls.append(
            {
                "thread_id": thread_id,
                "tool_call_id": check_id(f"{where}.tool_call_id", call.tool_call_id),
                "tool_name": check_id(f"{where}.tool_name", call.tool_name),
                "args": Store.encode_object(call.args, f"{where}.args"),
                "status": call.status,
                "result": None if call.result is None else encode(call.result, f"{where}.result"),
                "error": None if call.error is None else encode(call.error, f"{where}.error"),
                "attempts": attempts,
                "lease_expires_at": _optional_datetime(
                    call.lease_expires_at, f"{where}.lease_expires_at"
                ),
                "started_at": _datetime(call.started_at, f"{where}.started_at"),
                "finished_at": _optional_datetime(call.finished_at, f"{where}.finished_at"),
            }
        )
    if len({c["tool_call_id"] for c in calls}) != len(calls):
        raise ConfigError("tool_executions: two calls have the same tool_call_id")
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
    return {
        "thread": {
            "thread_id": thread_id,
            "user_id": user_id,
            "name": None if info.name is None else encode(info.name, "thread.name"),
            "metadata": Store.encode_object(info.metadata, "thread.metadata")
            if info.metadata
            else None,
            "version": version,
            "created_at": _datetime(info.created_at, "thread.created_at"),
            "updated_at": _datetime(info.updated_at, "thread.updated_at"),
        },
        "states": [
            {
                "thread_id": thread_id,
                "version": snapshot.version,
                "state_data": encode_state(snapshot.state),
                "meta": Store.encode_object(snapshot.meta, "state meta") if snapshot.meta else None,
                "created_at": _datetime(snapshot.created_at, "state created_at"),
            }
            for snapshot in sorted(export.states, key=lambda snapshot: snapshot.version)
        ],
        "messages": [
            {
                "thread_id": thread_id,
                "message_id": mid,
                "role": message_role(r.message.get("role")),
                "payload": Store.encode_object(r.message, "message"),
                "created_at": _datetime(r.created_at, "message created_at"),
            }
            for mid, r in zip(message_ids, export.messages, strict=True)
        ],
        "tool_executions": calls,
        "lg_checkpoints": checkpoints,
        "lg_writes": writes,
        "lg_blobs": blobs,
    }


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
