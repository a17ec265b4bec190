"""Whole threads: every thread of a store, and one thread's export and import.

The CLI's ``export``, ``import`` and ``copy`` are built on these operator calls: they
take no run config (or one with an operator ``AuthPolicy``) and read or write a whole
thread — record, retained states, messages, tool ledger — in one transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from .backends import Backend
from .crypto import check_type, life_of
from .errors import ConfigError, ImportConflict, SerializationError
from .export_rows import (
    ThreadRows,
    check_langgraph_values,
    import_rows,
    sealed_rows,
    thread_export,
)
from .langgraph.values import AllowedTypes, allowed_set
from .statements import thread_info, utc
from .store import Store
from .types import Commit, Imported, ImportOutcome, OnConflict, ThreadExport, ThreadInfo
from .validate import check_choice, check_count

ON_CONFLICT: tuple[OnConflict, ...] = ("fail", "skip", "replace")

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
            rows = await self._store.read_lagging(stmt)
            for row in rows:
                yield thread_info(row, self._store.keys)
            if len(rows) < batch:
                return
            after = rows[-1].thread_id

    async def _export(
        self, conn: AsyncConnection, thread_id: Any, guard: Sequence[Any] = ()
    ) -> ThreadExport | None:
        t = self._store.tables.threads
        row = (await conn.execute(select(*t.c).where(t.c.thread_id == thread_id, *guard))).first()
        if row is None:
            return None
        rows = await self._thread_rows(conn, thread_id)
        return thread_export(thread_id, row, rows, self._store.keys)

    async def _thread_rows(self, conn: AsyncConnection, thread_id: Any) -> ThreadRows:
        """The rows of a thread besides its own, in an export's order."""
        _, s, m, x = self._store.tables[:4]
        c, w = self._store.tables.lg_checkpoints, self._store.tables.lg_writes
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
        return ThreadRows(states, messages, calls, checkpoints, writes, blobs)

    async def aexport_thread(self, config: dict[str, Any]) -> ThreadExport | None:
        """Everything stored of one thread, read in one snapshot; None when absent
        (or another user's while isolation applies)."""
        ids = self._store.ids(config)
        held = self._store.caught_up(config)  # a replica must hold the run's version

        async def read(backend: Backend, on_replica: bool) -> ThreadExport | None:
            async with backend.snapshot_here() as conn:
                return await self._export(conn, ids.thread_id, held if on_replica else ())

        export, _ = await self._store.lagging(
            read, accept=(lambda found: found is not None) if held else None, config=config
        )
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
            new = sealed_rows(store.keys, thread_id, new, life)
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
