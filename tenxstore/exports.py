"""Whole threads: every thread of a store, and one thread's export and import.

The CLI's ``export``, ``import`` and ``copy`` are built on these operator calls: they
take no run config (or one with an operator ``AuthPolicy``) and read or write a whole
thread — record, retained states, messages, tool ledger — in one transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .errors import ConfigError, ImportConflict
from .serde import decode, encode, encode_state
from .statements import snapshot_of, thread_info, tool_execution, utc
from .store import Store
from .types import ImportOutcome, MessageRecord, OnConflict, ThreadExport, ThreadInfo
from .validate import check_choice, check_count, check_id, message_id

ON_CONFLICT: tuple[OnConflict, ...] = ("fail", "skip", "replace")

__all__ = ["ThreadExports"]


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
                yield thread_info(row)
            if len(rows) < batch:
                return
            after = rows[-1].thread_id

    async def _export(self, conn: AsyncConnection, thread_id: Any) -> ThreadExport | None:
        t, s, m, x = self._store.tables[:4]
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
        calls = await conn.execute(
            select(*x.c)
            .where(x.c.thread_id == thread_id)
            .order_by(x.c.started_at, x.c.tool_call_id)
        )
        return ThreadExport(
            thread=thread_info(row),
            states=tuple(snapshot_of(r) for r in states),
            messages=tuple(
                MessageRecord(decode(r.payload), utc(r.created_at))  # type: ignore[arg-type]
                for r in messages
            ),
            tool_executions=tuple(tool_execution(thread_id, r) for r in calls),
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
        self, export: ThreadExport, *, on_conflict: OnConflict = "fail"
    ) -> ImportOutcome:
        """Write an exported thread back, in one transaction.

        Importing what is already there changes nothing. A thread that exists with
        other content is a conflict: ``on_conflict="fail"`` raises
        :class:`ImportConflict`, ``"skip"`` leaves it, ``"replace"`` deletes it first.

        Returns:
            ``"created"``, ``"unchanged"``, ``"skipped"`` or ``"replaced"``.

        Raises:
            ImportConflict: The thread exists with other content (``"fail"``).
            SerializationError: Something in the export cannot be stored.
            ConfigError: Bad ids or ``on_conflict``.
        """
        on_conflict = check_choice("on_conflict", on_conflict, ON_CONFLICT)
        rows = self._import_rows(export)
        thread_id = rows["thread"]["thread_id"]
        async with self._store.write(thread_id) as (conn, locked):
            outcome: ImportOutcome = "created"
            if locked is not None:
                existing = await self._export(conn, thread_id)
                if existing is not None and self._import_rows(existing) == rows:
                    return "unchanged"
                if on_conflict == "skip":
                    return "skipped"
                if on_conflict == "fail":
                    raise ImportConflict(
                        f"thread {thread_id!r} exists with other content; "
                        "import with on_conflict='replace' or 'skip'"
                    )
                await self._store.delete_thread(conn, thread_id)
                outcome = "replaced"
            t, s, m, x = self._store.tables[:4]
            await conn.execute(insert(t), [rows["thread"]])
            if rows["states"]:
                await conn.execute(insert(s), rows["states"])
            if rows["messages"]:
                await conn.execute(insert(m), rows["messages"])
            if rows["tool_executions"]:
                await conn.execute(insert(x), rows["tool_executions"])
        return outcome

    def _import_rows(self, export: ThreadExport) -> dict[str, Any]:
        """The rows an export becomes; validated and encoded before any I/O."""
        if not isinstance(export, ThreadExport):
            raise ConfigError(f"expected a ThreadExport, not {type(export).__name__}")
        info = export.thread
        thread_id = check_id("thread_id", info.thread_id, self._store.settings.id_type)
        user_id = (
            None
            if info.user_id is None
            else check_id("user_id", info.user_id, self._store.settings.user_id_type)
        )
        versions = [snapshot.version for snapshot in export.states]
        if len(set(versions)) != len(versions) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in versions
        ):
            raise ConfigError("state versions must be distinct positive ints")
        if versions and max(versions) != info.version:
            raise ConfigError(
                f"the newest state is version {max(versions)}, the thread is at {info.version}"
            )
        when = [info.created_at, info.updated_at]
        if any(not isinstance(w, datetime) for w in when):
            raise ConfigError("a thread needs created_at and updated_at")
        message_ids = [message_id(r.message.get("id")) for r in export.messages]
        if len(set(message_ids)) != len(message_ids):
            raise ConfigError("message ids must be unique within a thread")
        return {
            "thread": {
                "thread_id": thread_id,
                "user_id": user_id,
                "name": None if info.name is None else encode(info.name, "name"),
                "metadata": self._store.encode_object(info.metadata, "metadata")
                if info.metadata
                else None,
                "version": info.version,
                "created_at": info.created_at,
                "updated_at": info.updated_at,
            },
            "states": [
                {
                    "thread_id": thread_id,
                    "version": snapshot.version,
                    "state_data": encode_state(snapshot.state),
                    "meta": self._store.encode_object(snapshot.meta, "meta")
                    if snapshot.meta
                    else None,
                    "created_at": snapshot.created_at,
                }
                for snapshot in sorted(export.states, key=lambda snapshot: snapshot.version)
            ],
            "messages": [
                {
                    "thread_id": thread_id,
                    "message_id": mid,
                    "role": r.message.get("role")
                    if isinstance(r.message.get("role"), str)
                    else None,
                    "payload": self._store.encode_object(r.message, "message"),
                    "created_at": r.created_at,
                }
                for mid, r in zip(message_ids, export.messages, strict=True)
            ],
            "tool_executions": [
                {
                    "thread_id": thread_id,
                    "tool_call_id": check_id("tool_call_id", call.tool_call_id),
                    "tool_name": check_id("tool_name", call.tool_name),
                    "args": self._store.encode_object(call.args, "args"),
                    "status": call.status,
                    "result": None if call.result is None else encode(call.result, "result"),
                    "error": None if call.error is None else encode(call.error, "error"),
                    "attempts": call.attempts,
                    "lease_expires_at": call.lease_expires_at,
                    "started_at": call.started_at,
                    "finished_at": call.finished_at,
                }
                for call in export.tool_executions
            ],
        }
