"""What a repository and its collaborators share: backend, statements, settings and
the thread-level steps every write takes (lock, create if absent, check the owner).

The repository, its tool ledger, its export/import and its LangGraph tables each hold
the same :class:`Store` and call only its public methods; none reaches into another.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    MutableMapping,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, and_, delete, select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable

from . import migrate
from .backends import Backend
from .backends.records import Head, HeadWrite
from .backends.schema_facts import SchemaFacts, read_facts, read_identity
from .config import (
    RunIds,
    read_config,
    record_source,
    recorded_incarnation,
    recorded_version,
)
from .crypto import ENV, MESSAGE, KeyRing, Life
from .errors import ConfigError, SerializationError, StaleStateError, ThreadOwnershipError
from .serde import encode
from .statements import Statements, load
from .types import ReadSource
from .validate import IdType, message_id

#: How often a write creating a thread tries again when a concurrent delete took the
#: row it found away before its lock was granted (each try waits out one delete).
T = TypeVar("T")
_CLAIMS = 10

__all__ = ["Settings", "Store", "keyless_refusal", "message_role"]

MAX_ROLE = 255


def keyless_refusal(where: str, sealed_since: datetime | None) -> ConfigError | None:
    """The error of a write without a key ring to a store marked as holding sealed
    values since ``sealed_since`` (None: not marked, no error)."""
    if sealed_since is None:
        return None
    since = sealed_since.strftime("%Y-%m-%d %H:%M:%S UTC")
    return ConfigError(
        f"{where} holds values sealed under a key ring (marked {since}), and this "
        f"checkpointer has none: set {ENV} to the application's key ring (or pass "
        "keys=). Nothing was written: without it, values would be stored in clear"
    )


def _utc(when: datetime | None) -> datetime | None:
    """A stored time as an aware UTC datetime (SQLite returns it naive)."""
    if when is None or when.tzinfo is not None:
        return when
    return when.replace(tzinfo=timezone.utc)


def message_role(role: object) -> str | None:
    """The ``role`` column: a denormalized copy for queries, kept when it is a plain
    short text. A role a column cannot hold (a NUL, which PostgreSQL text refuses;
    absurd lengths) or that is not a str is stored as NULL; the payload keeps it exactly."""
    if isinstance(role, str) and len(role) <= MAX_ROLE and "\x00" not in role:
        return role
    return None


@dataclass(frozen=True)
class Settings:
    """The checked constructor arguments a repository's parts need."""

    enforce_user_isolation: bool
    id_type: IdType
    user_id_type: IdType
    state_history_limit: int
    tool_lease: timedelta
    keys: KeyRing | None = None
    """The key ring payloads are sealed with (None: stored in clear)."""


class Store:
    """The backend, statements and settings of one repository, and the shared steps."""

    def __init__(
        self, backend: Backend, sql: Statements, settings: Settings, schema: str | None
    ) -> None:
        self.backend = backend
        self.sql = sql
        self.tables = sql.tables
        threads = sql.tables.threads
        self.life_columns = (threads.c.incarnation, threads.c.user_id)
        """The columns of a thread's life (:func:`tenxstore.crypto.life_of` reads them):
        every read of a sealed value joins them in, to open it for its life."""
        backend.bind(sql)
        self.settings = settings
        self.schema = schema
        self.store_id: str | None = None
        """The store's id, known at first use (see :meth:`ensure_ready`)."""
        self.keys = settings.keys
        """The key ring payloads are sealed with, or None."""
        self.sealed_since: datetime | None = None
        """When the store was marked as holding sealed values, as read at first use
        (:meth:`ensure_ready`) or marked by this process; None: not marked."""
        self._writable = False  # ensure_writable passed: once per process, at first write

    # -- the schema ----------------------------------------------------------------

    def where(self) -> str:
        """The database (and schema) in words, for messages; never the password."""
        url = self.backend.describe()
        return f"schema {self.schema!r} of {url}" if self.schema else f"the database {url}"

    def ready(self) -> None:
        """A migration just ran: the schema's facts are read again at first use
        (:meth:`ensure_ready`)."""
        self.store_id = None
        self._writable = False

    async def at_head(self, conn: AsyncConnection | None = None) -> bool:
        """Whether the schema is plainly at head, read in ONE statement (the facts of
        :mod:`tenxstore.backends.schema_facts`) on ``conn`` (None: one of the
        backend's), and if so the store is ready: its id and sealed marker taken from
        that same row. False: the slow way says why (:meth:`ensure_ready`) or a
        migration is due (``asetup``)."""
        if conn is None:
            async with self.backend.connect() as own:
                return await self.at_head(own)
        facts = await read_facts(self.backend, conn, self.tables, self.schema)
        if conn.in_transaction():  # the read's: a migration on conn begins its own
            await conn.rollback()
        if facts is None or not facts.at(migrate.HEAD, self._id_kinds()):
            return False
        self._adopt(facts)
        return True

    async def ensure_ready(self) -> str:
        """Check once, at first use, that the schema is at head, and read whether the
        store holds sealed values (:attr:`sealed_since`); the store id. A schema at
        head costs one statement; any other is examined through Alembic, which says
        what is wrong.

        Raises:
            SchemaNotReady: Never set up, behind head, or set up by a newer release.
            ConfigError: Set up with other id types than this checkpointer's.
        """
        if self.store_id is not None:
            return self.store_id
        async with self.backend.connect() as conn:
            if not await self.at_head(conn):
                self._adopt(await self._examined(conn))
        assert self.store_id is not None
        return self.store_id

    def _id_kinds(self) -> tuple[IdType, IdType]:
        return (self.settings.id_type, self.settings.user_id_type)

    async def _examined(self, conn: AsyncConnection) -> SchemaFacts:
        """The schema's facts the slow way (the inspector, Alembic's history), which
        raises the error that says why it is not at head."""
        kinds = self._id_kinds()
        revision, store_id = await migrate.read_schema(conn, self.schema, kinds)
        found = migrate.check_schema(revision, store_id, self.where())
        identity = await read_identity(self.backend, conn, self.schema)
        marked = await conn.execute(select(self.tables.store.c.sealed_since))
        return SchemaFacts(1, revision, found, marked.scalar(), kinds, identity)

    def _adopt(self, facts: SchemaFacts) -> None:
        """Take a schema at head's facts: the store id (with the database's identity:
        a copy of the database is another store, see ``Backend.identity_columns``)
        and its sealed marker."""
        assert facts.store_id is not None
        found = facts.store_id
        if facts.identity:
            found += "-" + hashlib.sha256(facts.identity.encode()).hexdigest()[:12]
        self.sealed_since = _utc(facts.sealed_since)
        self._writable = False
        self.store_id = found

    # -- the sealed marker ---------------------------------------------------------

    def refusal(self) -> ConfigError | None:
        """Why this instance may not write to the store, as far as first use told:
        it has no key ring, and the store holds sealed values (None: it may)."""
        return keyless_refusal(self.where(), self.sealed_since) if self.keys is None else None

    async def ensure_writable(self) -> None:
        """Before the first write of this process that may store a payload: an
        instance without a key ring on a store marked as holding sealed values is
        refused, and an instance with one marks an unmarked store (one statement,
        once). Later calls cost an attribute read.

        Raises:
            ConfigError: No key ring, and the store holds sealed values (nothing is
                written; the error names ``TENXSTORE_KEYS``).
        """
        if self._writable:
            return
        if self.store_id is None:
            await self.ensure_ready()
        refused = self.refusal()
        if refused is not None:
            raise refused
        if self.keys is not None and self.sealed_since is None:
            self.sealed_since = await self.mark_sealed()
        self._writable = True

    async def mark_sealed(self) -> datetime:
        """Record in the store's row that it holds sealed values (kept when it is
        there already); when it was first marked."""
        if self.store_id is None:
            await self.ensure_ready()
        row = self.tables.store
        async with self.backend.write(select(row.c.sealed_since), {}) as (conn, found):
            since = None if found is None else _utc(found.sealed_since)
            if since is None:
                marked = update(row).where(row.c.sealed_since.is_(None))
                await conn.execute(marked.values(sealed_since=self.now()))
                # read back: another process may have marked it first (then its time)
                since = _utc((await conn.execute(select(row.c.sealed_since))).scalar())
        assert since is not None  # the row exists from 0003 on, and was just set
        self.sealed_since = since
        return since

    async def unmark_sealed(self) -> None:
        """Clear the marker (the caller has checked that no value is sealed)."""
        if self.store_id is None:
            await self.ensure_ready()
        row = self.tables.store
        async with self.backend.write(select(row.c.sealed_since), {}) as (conn, _):
            await conn.execute(update(row).values(sealed_since=None))
        self.sealed_since = None
        self._writable = False

    def ids(self, config: object, *, need_thread: bool = True) -> RunIds:
        """The validated ids of one call (``ConfigError`` before any I/O)."""
        return read_config(
            config,
            isolation=self.settings.enforce_user_isolation,
            id_type=self.settings.id_type,
            user_id_type=self.settings.user_id_type,
            need_thread=need_thread,
        )

    @staticmethod
    def now() -> datetime:
        """The time stamped on rows this call writes."""
        return datetime.now(timezone.utc)

    # -- transactions --------------------------------------------------------------

    @asynccontextmanager
    async def write(
        self, thread_id: Any, *, deletes_only: bool = False
    ) -> AsyncIterator[tuple[AsyncConnection, Any]]:
        """A write transaction holding the thread's row lock; yields (conn, row or None).

        Refused (:meth:`ensure_writable`) without a key ring on a sealed store, unless
        it ``deletes_only``: a delete stores nothing, and erasing a user needs no key.
        """
        if deletes_only:
            if self.store_id is None:
                await self.ensure_ready()
        elif not self._writable:
            await self.ensure_writable()
        try:
            async with self.backend.write(self.sql.lock, {"b_thread": thread_id}) as locked:
                yield locked
        finally:
            self.backend.writes.wrote([thread_id])  # committed or not: see Writes

    @asynccontextmanager
    async def write_rows(
        self, lock: Executable, params: dict[str, Any], *, deletes_only: bool = False
    ) -> AsyncIterator[tuple[AsyncConnection, Any]]:
        """A write transaction that has run ``lock`` (a row lock of the caller's, such
        as a memory's); yields (conn, its first row or None). Refused as :meth:`write`
        is: without a key ring on a sealed store, unless it ``deletes_only``."""
        if deletes_only:
            if self.store_id is None:
                await self.ensure_ready()
        elif not self._writable:
            await self.ensure_writable()
        try:
            async with self.backend.write(lock, params) as locked:
                yield locked
        finally:
            self.backend.writes.wrote()

    async def read_head(self, ids: RunIds) -> Head | None:
        """The head of the call's thread (as its caller may see it), or None."""
        if self.store_id is None:
            await self.ensure_ready()
        return await self.backend.read_head(ids.thread_id, ids.user_id if ids.isolated else None)

    async def commit_head(self, write: HeadWrite) -> Head | None:
        """The common state write in one step, or None (then take the locked path)."""
        if not self._writable:
            await self.ensure_writable()
        try:
            return await self.backend.commit_head(write)
        finally:
            self.backend.writes.wrote([write.thread_id])

    @asynccontextmanager
    async def write_many(
        self, thread_ids: Iterable[Any]
    ) -> AsyncIterator[tuple[AsyncConnection, dict[Any, Any]]]:
        """One write transaction holding the row locks of several threads, taken in id
        order (two such writers cannot deadlock); yields (conn, {thread_id: row or None})."""
        ordered = sorted(set(thread_ids))
        try:
            async with self.write(ordered[0]) as (conn, first):
                locked = {ordered[0]: first}
                for thread_id in ordered[1:]:
                    row = await conn.execute(self.sql.lock, {"b_thread": thread_id})
                    locked[thread_id] = row.first()
                yield conn, locked
        finally:
            self.backend.writes.wrote(ordered)

    async def read(self, stmt: Executable, params: dict[str, Any] | None = None) -> list[Row[Any]]:
        """One read statement (retried once on a connection found dead)."""
        if self.store_id is None:
            await self.ensure_ready()
        return list(await self.backend.read(stmt, params))

    async def read_lagging(
        self,
        stmt: Select[Any],
        *,
        guard: Sequence[ColumnElement[bool]] = (),
        config: MutableMapping[str, Any] | None = None,
        thread_id: Any = None,
    ) -> list[Row[Any]]:
        """One read that tolerates lag: on a replica within bound (see ``replica_urls``)
        that holds what this process wrote (of ``thread_id``; None: anything) and
        whose rows also meet ``guard`` there — when they are none, the primary answers
        the statement without it — else on the primary. Where is recorded in ``config``
        (:func:`tenxstore.config.read_source`)."""
        guarded = stmt.where(*guard) if guard else stmt
        rows, _ = await self.lagging(
            lambda backend, on_replica: backend.read_here(guarded if on_replica else stmt),
            accept=bool if guard else None,
            config=config,
            thread_id=thread_id,
        )
        return list(rows)

    def written(self, thread_id: Any = None) -> float:
        """When this process last wrote ``thread_id`` (None: anything)."""
        writes = self.backend.writes
        return writes.last if thread_id is None else writes.of_thread(thread_id)

    async def lagging(
        self,
        work: Callable[[Backend, bool], Awaitable[T]],
        *,
        accept: Callable[[T], bool] | None = None,
        config: MutableMapping[str, Any] | None = None,
        thread_id: Any = None,
    ) -> tuple[T, ReadSource]:
        """``work(backend, on_replica)`` on a replica within bound that holds what this
        process wrote (of ``thread_id``; None: anything) and whose result ``accept``
        takes, else on the primary; where is recorded in ``config``."""
        if self.store_id is None:
            await self.ensure_ready()
        result, source = await self.backend.lagging(work, accept, self.written(thread_id))
        if config is not None:
            record_source(config, source)
        return result, source

    def caught_up(
        self, config: Mapping[str, Any], threads: Any = None
    ) -> list[ColumnElement[bool]]:
        """What a replica's ``threads`` row (of ``threads``, an alias, or the table)
        must meet to hold the version ``config`` recorded (none recorded: nothing)."""
        version = recorded_version(config)
        if version is None:
            return []
        t = self.tables.threads if threads is None else threads
        life = recorded_incarnation(config)
        return [t.c.version >= version, *([] if life is None else [t.c.incarnation == life])]

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[AsyncConnection]:
        """A read transaction that sees one snapshot."""
        if self.store_id is None:
            await self.ensure_ready()
        async with self.backend.snapshot() as conn:
            yield conn

    # -- the steps of a write ------------------------------------------------------

    async def claim_thread(
        self, conn: AsyncConnection, ids: RunIds, row: Any, now: datetime
    ) -> Row[Any]:
        """Given the locked row (or None), create the thread if absent and check its
        owner; return its locked row (``user_id``, ``version``, ``incarnation``)."""
        key = {"b_thread": ids.thread_id}
        for _ in range(_CLAIMS):
            if row is not None:
                break
            # Absent when locked: create it, or find the one another writer created
            # meanwhile — which a concurrent delete may take away again before the
            # lock below is granted (then the lock finds nothing, and we try again).
            await conn.execute(self.sql.new_thread, {**key, "b_user": ids.user_id, "b_now": now})
            row = (await conn.execute(self.sql.lock, key)).first()
        if row is None:
            raise StaleStateError(
                ids.thread_id,
                0,
                0,
                replaced=True,
                message=f"thread {ids.thread_id!r} was deleted {_CLAIMS} times over while "
                "this call created it: run again",
            )
        self.check_owner(ids, row)
        locked: Row[Any] = row
        return locked

    @staticmethod
    def check_owner(ids: RunIds, row: Any) -> None:
        """Raise ThreadOwnershipError when isolation applies and another user owns it."""
        if ids.isolated and row.user_id != ids.user_id:
            raise ThreadOwnershipError(ids.thread_id, ids.user_id)

    async def delete_thread(self, conn: AsyncConnection, thread_id: Any) -> None:
        """Delete a thread and everything of it, under its lock."""
        # Children first and explicitly: no reliance on ON DELETE CASCADE being enforced.
        for table in self.tables.of_thread:
            await conn.execute(delete(table).where(table.c.thread_id == thread_id))

    # -- scoping -------------------------------------------------------------------

    def owned(self, ids: RunIds) -> ColumnElement[bool]:
        """The thread row of this call, scoped to its owner when isolation applies."""
        t = self.tables.threads
        clause: ColumnElement[bool] = t.c.thread_id == ids.thread_id
        if ids.isolated:
            clause = and_(clause, t.c.user_id == ids.user_id)
        return clause

    def visible_thread(self, ids: RunIds) -> Any:
        """A subquery of the call's thread id, empty when the caller may not see it."""
        return select(self.tables.threads.c.thread_id).where(self.owned(ids)).scalar_subquery()

    # -- payloads ------------------------------------------------------------------

    def seal(self, text: str, thread_id: Any, column: str, life: Life) -> str:
        """A payload as it is stored: sealed for ``thread_id``, ``column`` and the
        thread's ``life`` (its locked row's, or the one a compare-and-swap checks) when
        a key ring is configured, else as it is."""
        keys = self.keys
        return text if keys is None else keys.seal(text, thread_id, column, life)

    def load(self, text: str, thread_id: Any, column: str, life: Life) -> Any:
        """A stored JSON payload's value, for the thread's ``life`` as read with it (see
        :func:`tenxstore.statements.load`)."""
        return load(self.keys, text, thread_id, column, life)

    def seal_messages(
        self, rows: list[dict[str, Any]], thread_id: Any, life: Life
    ) -> list[dict[str, Any]]:
        """Rows of :meth:`encode_messages` with their payloads sealed for ``thread_id``
        and its ``life``."""
        keys = self.keys
        if keys is None:
            return rows
        return [
            {**row, "payload": keys.seal(row["payload"], thread_id, MESSAGE, life)} for row in rows
        ]

    @staticmethod
    def encode_object(value: object, what: str) -> str:
        """A JSON object (a dict) as text; anything else is a SerializationError."""
        if not isinstance(value, dict):
            raise SerializationError(f"{what} must be a dict, not {type(value).__name__}")
        return encode(value, what)

    @staticmethod
    def encode_messages(messages: Iterable[Any]) -> list[dict[str, Any]]:
        """Validate and encode messages into rows, first content per id.

        Ids are assigned to the caller's dicts only once every message has encoded,
        so a message that fails leaves all of them untouched.
        """
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
            raise SerializationError(
                f"messages must be a sequence of dicts, not {type(messages).__name__}"
            )
        rows: dict[str, dict[str, Any]] = {}
        assigned: list[tuple[dict[str, Any], str]] = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise SerializationError(
                    f"messages[{i}] must be a dict, not {type(message).__name__}"
                )
            given = message.get("id")
            if given is None:
                mid = uuid.uuid4().hex
                assigned.append((message, mid))
                payload = encode({**message, "id": mid}, "message")
            else:
                mid = message_id(given)
                payload = encode(message, "message")
            role = message.get("role")
            rows.setdefault(
                mid,
                {
                    "message_id": mid,
                    "role": message_role(role),
                    "payload": payload,
                },
            )
        for message, mid in assigned:
            message["id"] = mid
        return list(rows.values())
