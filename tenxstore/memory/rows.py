"""The memories' rows: scoping clauses, the steps of a write under a memory's row lock,
and rows turned into :class:`~tenxstore.types.Memory` values (ORM rows never leave).

Every write of one memory runs under its row's lock (``SELECT ... FOR UPDATE``;
SQLite: the immediate write transaction), so its writers take turns, and each one
compares and bumps ``version``: the version a caller read is either still the head,
or the write raises :class:`~tenxstore.errors.StaleStateError` and writes nothing.
The version a write replaces moves to ``memory_versions`` unchanged (its sealed
values stay bound to the memory's ``uid``), and versions beyond the history limit
are deleted in the same transaction.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    String,
    Table,
    and_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
)
from sqlalchemy import update as sql_update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..crypto import MEMORY_CONTENT, MEMORY_METADATA
from ..statements import load, utc
from ..store import Store
from ..types import Memory
from .validation import split

__all__ = ["BUMPED", "MemoryRows", "Written"]

BUMPED: ContextVar[dict[tuple[str, str], tuple[int | None, int]] | None] = ContextVar(
    "tenxstore_memory_bumped", default=None
)
"""Set by a write that a vector index follows (:mod:`.indexing`): each (user,
namespace) its transaction bumped, with the revision before it (read under the
revision's lock; None: a new scope) and the one written."""


class Written:
    """What one write stores: its values as text (not sealed yet) and its times."""

    __slots__ = ("content", "expires_at", "metadata", "now", "terms")

    def __init__(
        self,
        content: str | None,
        metadata: str | None,
        terms: str | None,
        now: datetime,
        expires_at: datetime | None,
    ) -> None:
        self.content, self.metadata, self.terms = content, metadata, terms
        self.now, self.expires_at = now, expires_at


class MemoryRows:
    """The statements of the memories' tables over one :class:`~tenxstore.store.Store`."""

    def __init__(self, store: Store, history_limit: int) -> None:
        self.store = store
        self.m = m = store.tables.memories
        self.v = store.tables.memory_versions
        self.history_limit = history_limit
        self.lock = (
            select(*m.c)
            .where(
                m.c.user_id == bindparam("b_user"),
                m.c.namespace == bindparam("b_ns"),
                m.c.memory_key == bindparam("b_key"),
            )
            .with_for_update()  # dropped on SQLite, where BEGIN IMMEDIATE serializes
        )
        self.insert_new = store.backend.insert_ignore(m, "user_id", "namespace", "memory_key")
        self.r = r = store.tables.memory_revisions
        self.vt = store.tables.memory_vectors
        self.insert_revision = store.backend.insert_ignore(r, "user_id", "namespace")

    # -- scoping -------------------------------------------------------------------

    def live(self, now: datetime) -> ColumnElement[bool]:
        """Not expired at ``now`` (expired rows wait for a sweep, never shown)."""
        m = self.m
        return or_(m.c.expires_at.is_(None), m.c.expires_at > now)

    def within(self, namespace: str, table: Table | None = None) -> ColumnElement[bool]:
        """In ``namespace`` or under it (labels compared whole, LIKE-free: ``%``, ``_``
        and ``*`` match only themselves); of ``table``'s ``namespace`` (None:
        ``memories``')."""
        column = (self.m if table is None else table).c.namespace
        under = namespace + "."
        return or_(
            column == namespace,
            func.substr(column, 1, len(under)) == bindparam(None, under, type_=String()),
        )

    def revision_scope(self, users: Any, namespace: str | None) -> list[ColumnElement[bool]]:
        """The clauses of the ``memory_revisions`` rows of a search's scope: the user's
        (None: every user's), in the namespace or under it (None or "": any)."""
        r = self.r
        clauses: list[ColumnElement[bool]] = []
        if users is not None:
            clauses.append(r.c.user_id == users)
        if namespace:
            clauses.append(self.within(namespace, r))
        return clauses

    def scope(
        self, user_id: Any, namespace: str | None, now: datetime, *, exact: bool = False
    ) -> list[ColumnElement[bool]]:
        """The clauses of a call's memories: the user's (None: every user's), in the
        namespace (``exact``) or under it (None: any), not expired."""
        m = self.m
        clauses = [self.live(now)]
        if user_id is not None:
            clauses.append(m.c.user_id == user_id)
        if namespace:
            clauses.append(m.c.namespace == namespace if exact else self.within(namespace))
        return clauses

    def one(self, user_id: Any, namespace: str, key: str) -> dict[str, Any]:
        """The parameters of :attr:`lock` for one memory."""
        return {"b_user": user_id, "b_ns": namespace, "b_key": key}

    # -- values ----------------------------------------------------------------------

    def seal(self, text: str, uid: str, column: str) -> str:
        """A value as it is stored: sealed for the memory (``uid``) with a key ring."""
        keys = self.store.keys
        # bound to the memory's uid (a life of its key of its own): no thread life
        return text if keys is None else keys.seal(text, uid, column, None)

    def memory(self, row: Any, *, created_at: Any = None, key: Any = None) -> Memory:
        """A ``memories`` row (or a ``memory_versions`` row, given the memory's
        ``created_at`` and the memory row as ``key``) as a :class:`Memory`."""
        keys = self.store.keys
        owner = row if key is None else key
        return Memory(
            key=owner.memory_key,
            namespace=split(owner.namespace),
            user_id=owner.user_id,
            content=load(keys, row.content, row.uid, MEMORY_CONTENT, None),
            metadata=load(keys, row.metadata, row.uid, MEMORY_METADATA, None),
            version=row.version,
            created_at=utc(owner.created_at if created_at is None else created_at),  # type: ignore[arg-type]
            updated_at=utc(row.updated_at),  # type: ignore[arg-type]
            expires_at=utc(row.expires_at),
        )

    # -- the steps of a write (under the memory's lock) --------------------------------

    async def bump(self, conn: AsyncConnection, scopes: Sequence[tuple[Any, str]]) -> None:
        """Write a new revision for each (user, namespace) a write changes, in its
        transaction (taken in a fixed order: two writers cannot deadlock on them), so
        a matrix of vectors cached by any process is known to be stale. A revision is
        a random 62-bit stamp, not a counter: a table emptied or restored from a
        backup and written again never repeats the revision a matrix was built at."""
        r = self.r
        noted = BUMPED.get()
        for user_id, namespace in sorted(set(scopes), key=lambda s: (str(s[0]), s[1])):
            stamp = secrets.randbits(62)
            await conn.execute(
                self.insert_revision,
                {"user_id": user_id, "namespace": namespace, "revision": stamp},
            )
            if noted is not None:  # the revision this write moves from, under its lock
                here = (r.c.user_id == user_id, r.c.namespace == namespace)
                was = (
                    await conn.execute(select(r.c.revision).where(*here).with_for_update())
                ).scalar()
                scope = (str(user_id), namespace)
                before = noted[scope][0] if scope in noted else None if was == stamp else was
                noted[scope] = (before, stamp)
            await conn.execute(
                sql_update(r)
                .where(r.c.user_id == user_id, r.c.namespace == namespace)
                .values(revision=stamp)
            )

    async def create(
        self,
        conn: AsyncConnection,
        user_id: Any,
        namespace: str,
        key: str,
        w: Written,
        *,
        bump: bool = True,
    ) -> tuple[Any, bool]:
        """Insert version 1 unless another writer made the memory meanwhile; the locked
        row, and whether it is the one made here. A memory another writer deleted
        between the insert (which found it) and the lock is made again here.
        ``bump=False``: the caller bumps the revision (see :meth:`replace`)."""
        assert w.content is not None and w.metadata is not None
        while True:
            uid = uuid.uuid4().hex
            await conn.execute(
                self.insert_new,
                {
                    "uid": uid,
                    "user_id": user_id,
                    "namespace": namespace,
                    "memory_key": key,
                    "content": self.seal(w.content, uid, MEMORY_CONTENT),
                    "metadata": self.seal(w.metadata, uid, MEMORY_METADATA),
                    "terms": w.terms,
                    "version": 1,
                    "created_at": w.now,
                    "updated_at": w.now,
                    "expires_at": w.expires_at,
                },
            )
            row = (await conn.execute(self.lock, self.one(user_id, namespace, key))).first()
            if row is not None:  # else deleted since the insert found it: insert again
                break
        if row.uid == uid and bump:
            await self.bump(conn, [(user_id, namespace)])
        return row, row.uid == uid

    async def replace(
        self, conn: AsyncConnection, row: Any, w: Written, *, keep_expiry: bool, bump: bool = True
    ) -> Any:
        """The next version of a locked memory: the current one moved to its history,
        the given values written (None keeps one: its stored text as it is), versions
        beyond the history limit deleted; the row as written. ``bump=False``: the
        caller bumps the scope's revision itself, last (a bulk write, which must not
        hold the revision's lock while it takes more rows' locks)."""
        m, v = self.m, self.v
        await conn.execute(
            insert(v),
            {
                "memory_id": row.id,
                "version": row.version,
                "uid": row.uid,
                "content": row.content,
                "metadata": row.metadata,
                "updated_at": row.updated_at,
                "expires_at": row.expires_at,
            },
        )
        version = row.version + 1
        values: dict[str, Any] = {"version": version, "updated_at": w.now}
        if not keep_expiry:
            values["expires_at"] = w.expires_at
        if w.content is not None:
            values["content"] = self.seal(w.content, row.uid, MEMORY_CONTENT)
            values["terms"] = w.terms
        if w.metadata is not None:
            values["metadata"] = self.seal(w.metadata, row.uid, MEMORY_METADATA)
        here = and_(m.c.id == row.id, m.c.version == row.version)
        await conn.execute(sql_update(m).where(here).values(**values))
        if bump:
            await self.bump(conn, [(row.user_id, row.namespace)])
        # the current version is one of the limit: keep limit - 1 past ones
        oldest = version - self.history_limit
        if oldest >= 1:
            await conn.execute(delete(v).where(v.c.memory_id == row.id, v.c.version <= oldest))
        return (await conn.execute(select(*m.c).where(m.c.id == row.id))).one()

    async def remove(
        self, conn: AsyncConnection, ids: Sequence[int], *, bump: bool = True
    ) -> tuple[int, int]:
        """Delete memories with their history and vectors (children first: no reliance
        on ON DELETE CASCADE being enforced), their scopes' revisions bumped (unless
        the caller does, as :meth:`replace` says); (memories, versions) deleted."""
        if not ids:
            return 0, 0
        m, v = self.m, self.v
        if bump:
            scopes = await conn.execute(
                select(m.c.user_id, m.c.namespace).where(m.c.id.in_(ids)).distinct()
            )
            await self.bump(conn, [(s.user_id, s.namespace) for s in scopes])
        await conn.execute(delete(self.vt).where(self.vt.c.memory_id.in_(ids)))
        versions = await conn.execute(delete(v).where(v.c.memory_id.in_(ids)))
        memories = await conn.execute(delete(m).where(m.c.id.in_(ids)))
        return max(memories.rowcount, 0), max(versions.rowcount, 0)

    # -- reads -----------------------------------------------------------------------

    async def history(
        self, conn: AsyncConnection, user_id: Any, namespace: str, key: str, now: datetime
    ) -> list[Memory]:
        """The memory's current version and its past ones, newest first, at most the
        history limit (in the caller's snapshot)."""
        m, v = self.m, self.v
        head = (
            await conn.execute(
                select(*m.c).where(
                    *self.scope(user_id, namespace, now, exact=True), m.c.memory_key == key
                )
            )
        ).first()
        if head is None:
            return []
        past = await conn.execute(
            select(*v.c)
            .where(v.c.memory_id == head.id, v.c.version < head.version)
            .order_by(v.c.version.desc())
            .limit(self.history_limit - 1)
        )
        older = [self.memory(r, created_at=head.created_at, key=head) for r in past]
        return [self.memory(head), *older]
