"""CheckpointRepository: durable, versioned thread storage; the one class that holds all SQL.

It is assembled from :class:`~tenxstore._repository_core.RepositoryCore` (engine,
transactions, shared helpers) and one mixin per concern; this module holds the
state and thread methods of the product's contract.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import (
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from ._export import ExportMixin
from ._langgraph_sql import LangGraphMixin
from ._ledger import LedgerMixin
from ._repository_core import (
    RepositoryCore,
    _check_count,
    _check_limit,
    _message_id,
)
from .config import (
    RunIds,
    recorded_version,
    set_recorded_version,
)
from .errors import (
    SerializationError,
    StaleStateError,
)
from .serde import decode, encode, encode_state
from .types import StateSnapshot, ThreadInfo

__all__ = ["CheckpointRepository"]


class CheckpointRepository(LedgerMixin, ExportMixin, LangGraphMixin, RepositoryCore):
    """Durable, versioned thread storage on PostgreSQL (asyncpg) or SQLite (aiosqlite).

    Args:
        url_or_engine: A database URL (``postgresql://``, ``sqlite:///path``, with or
            without the async driver) or an ``AsyncEngine`` the caller owns.
        schema: PostgreSQL schema holding the tables; ``None`` is the default schema.
        state_history_limit: State versions retained per thread (at least 1).
        enforce_user_isolation: Scope every call to ``config["user_id"]``.
        id_type: Column type of ``thread_id``: ``"string"``, ``"int"`` or ``"bigint"``.
        user_id_type: Column type of ``user_id``, likewise.
        engine_options: Keyword arguments for ``create_async_engine`` (pool size...).
        tool_lease_seconds: How long a tool-call claim is held before another worker
            may take it over.
        lock_timeout: Seconds a write waits for a thread's lock before it fails with
            :class:`LockTimeout` (PostgreSQL ``lock_timeout``, SQLite busy timeout,
            set on every connection tenxstore uses); ``None`` waits indefinitely.
        pool_mode: ``"transaction"`` when PostgreSQL is reached through a
            transaction-pooling PgBouncer: no prepared-statement caches and unique
            statement names (for engines tenxstore creates; pass
            ``transaction_pooling_args()`` as ``connect_args`` to your own), every
            statement inside a transaction, ``lock_timeout`` set per transaction.

    Raises:
        ConfigError: An argument is invalid (a ``ValueError``).
    """

    async def __aenter__(self) -> CheckpointRepository:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aput_checkpoint(
        self,
        config: dict[str, Any],
        state: dict[str, Any],
        messages: Iterable[dict[str, Any]] = (),
        *,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Durably write a new state version and the messages not yet stored.

        One transaction: create the thread if absent, lock it, check its owner,
        compare the version the run recorded (if any) with the head version, insert
        the state at the next version, insert new messages (deduplicated by ``id``;
        a message without one gets one, written back into its dict), prune states
        beyond ``state_history_limit``, commit.

        Args:
            config: The run config; its recorded version is updated.
            state: A JSON object.
            messages: Dicts; each is stored once per ``id``, first content wins.
            meta: Optional JSON object stored beside the state (``StateSnapshot.meta``).

        Returns:
            The new version.

        Raises:
            StaleStateError: Another run committed since this run read the thread.
            ThreadOwnershipError: The thread belongs to another user.
            SerializationError: Something cannot be stored; nothing was written.
            ConfigError: The config is invalid.
        """
        ids = self._ids(config)
        expected = recorded_version(config)
        payload = encode_state(state)
        meta_text = None if meta is None else self._encode_object(meta, "meta")
        message_rows = self._encode_messages(messages)
        now = self._now()
        hot = self._hot
        async with self._write(ids.thread_id) as (conn, locked):
            head = await self._claim_thread(conn, ids, locked, now)
            if expected is not None and expected != head:
                raise StaleStateError(ids.thread_id, expected, head)
            version = head + 1
            if hot.write_all is not None:
                await conn.execute(
                    hot.write_all,
                    {
                        "b_thread": ids.thread_id,
                        "b_version": version,
                        "b_state": payload,
                        "b_meta": meta_text,
                        "b_now": now,
                        "b_ids": [r["message_id"] for r in message_rows],
                        "b_roles": [r["role"] for r in message_rows],
                        "b_payloads": [r["payload"] for r in message_rows],
                        "b_upto": version - self.state_history_limit,
                    },
                )
            else:
                await self._write_rows(conn, ids, version, payload, meta_text, message_rows, now)
        set_recorded_version(config, version)
        return version

    async def _write_rows(
        self,
        conn: AsyncConnection,
        ids: RunIds,
        version: int,
        payload: str,
        meta_text: str | None,
        message_rows: list[dict[str, Any]],
        now: datetime,
    ) -> None:
        """The state write as separate statements (SQLite, where a round trip is free)."""
        hot = self._hot
        await conn.execute(
            hot.insert_state,
            {
                "thread_id": ids.thread_id,
                "version": version,
                "state_data": payload,
                "meta": meta_text,
                "created_at": now,
            },
        )
        if message_rows:
            for row in message_rows:
                row["thread_id"], row["created_at"] = ids.thread_id, now
            await conn.execute(hot.insert_messages, message_rows)
        await conn.execute(
            hot.bump, {"b_thread": ids.thread_id, "b_version": version, "b_now": now}
        )
        if version > self.state_history_limit:
            await conn.execute(
                hot.prune,
                {"b_thread": ids.thread_id, "b_upto": version - self.state_history_limit},
            )

    async def aput_state(
        self, config: dict[str, Any], state: dict[str, Any], *, meta: dict[str, Any] | None = None
    ) -> int:
        """:meth:`aput_checkpoint` without messages."""
        return await self.aput_checkpoint(config, state, (), meta=meta)

    async def aget_state(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The latest durable state, or None; records its version (0 when none) in config."""
        ids = self._ids(config)
        if ids.isolated:
            rows = await self._fetch(
                self._hot.head_state_of_user, {"b_thread": ids.thread_id, "b_user": ids.user_id}
            )
        else:
            rows = await self._fetch(self._hot.head_state, {"b_thread": ids.thread_id})
        row = rows[0] if rows else None
        if row is None or row.state_data is None:
            set_recorded_version(config, 0 if row is None else row.version)
            return None
        set_recorded_version(config, row.version)
        state: dict[str, Any] = decode(row.state_data)
        return state

    async def aget_state_cache(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """Without a cache this is :meth:`aget_state`."""
        return await self.aget_state(config)

    async def aput_state_cache(
        self, config: dict[str, Any], state: dict[str, Any], version: int
    ) -> bool:
        """There is no cache here: validates the arguments and returns False."""
        self._ids(config)
        encode_state(state)
        _check_count("version", version)
        return False

    async def alist_states(
        self, config: dict[str, Any], limit: int | None = None
    ) -> list[StateSnapshot]:
        """The retained state versions, newest first."""
        ids = self._ids(config)
        limit = _check_limit(limit)
        s = self._t.states
        stmt = (
            select(s.c.version, s.c.state_data, s.c.meta, s.c.created_at)
            .where(s.c.thread_id == self._visible_thread(ids))
            .order_by(s.c.version.desc())
            .limit(limit)
        )
        return [self._snapshot_of(row) for row in await self._fetch(stmt)]

    async def aget_messages(
        self, config: dict[str, Any], limit: int | None = None, after_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Messages in insertion order.

        Args:
            config: The run config.
            limit: Keep the first ``limit`` messages of the range.
            after_id: Start after the message with this id (an unknown id gives ``[]``).
        """
        ids = self._ids(config)
        limit = _check_limit(limit)
        m = self._t.messages
        stmt = select(m.c.payload).where(m.c.thread_id == self._visible_thread(ids))
        if after_id is not None:
            after = (
                select(m.c.seq)
                .where(m.c.thread_id == ids.thread_id, m.c.message_id == _message_id(after_id))
                .scalar_subquery()
            )
            stmt = stmt.where(m.c.seq > after)
        stmt = stmt.order_by(m.c.seq).limit(limit)
        return [decode(row.payload) for row in await self._fetch(stmt)]

    async def aput_thread(
        self,
        config: dict[str, Any],
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ThreadInfo:
        """Create or update the thread record; ``None`` leaves a field as it is.

        Never changes the state version.
        """
        ids = self._ids(config)
        values: dict[str, Any] = {}
        if name is not None:
            if not isinstance(name, str):
                raise SerializationError(f"name must be a str, not {type(name).__name__}")
            values["name"] = encode(name, "name")
        if metadata is not None:
            values["metadata"] = self._encode_object(metadata, "metadata")
        now = self._now()
        t = self._t.threads
        async with self._write(ids.thread_id) as (conn, locked):
            await self._claim_thread(conn, ids, locked, now)
            row = (
                await conn.execute(
                    update(t)
                    .where(t.c.thread_id == ids.thread_id)
                    .values(updated_at=now, **values)
                    .returning(*t.c)
                )
            ).one()
        return self._thread_info(row)

    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """The thread record, or None (also when another user owns it)."""
        ids = self._ids(config)
        t = self._t.threads
        rows = await self._fetch(select(*t.c).where(self._owned(ids)))
        return self._thread_info(rows[0]) if rows else None

    async def alist_threads(
        self, config: dict[str, Any], limit: int = 50, offset: int = 0
    ) -> list[ThreadInfo]:
        """The caller's threads, most recently updated first (all when isolation is off)."""
        ids = self._ids(config, need_thread=False)
        limit = _check_count("limit", limit)
        offset = _check_count("offset", offset)
        t = self._t.threads
        stmt = select(*t.c)
        if ids.isolated:
            stmt = stmt.where(t.c.user_id == ids.user_id)
        stmt = (
            stmt.order_by(t.c.updated_at.desc(), t.c.thread_id.desc()).limit(limit).offset(offset)
        )
        return [self._thread_info(row) for row in await self._fetch(stmt)]

    async def aclean_thread(self, config: dict[str, Any]) -> bool:
        """Delete the thread with its states, messages and tool executions.

        Returns:
            False when there was no such thread.

        Raises:
            ThreadOwnershipError: Another user owns the thread.
        """
        ids = self._ids(config)
        async with self._write(ids.thread_id) as (conn, locked):
            if locked is None:
                return False
            self._check_owner(ids, locked)
            await self._delete_thread(conn, ids.thread_id)
        return True
