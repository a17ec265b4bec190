"""Moving in from LangGraph's own savers: :func:`aimport_langgraph`.

Threads written by ``PostgresSaver`` / ``AsyncPostgresSaver`` or ``SqliteSaver`` /
``AsyncSqliteSaver`` (see :mod:`tenxstore.langgraph.sources` for the versions read)
become tenxstore threads, stored as :class:`~tenxstore.langgraph.TenxCheckpointSaver`
stores what a graph writes: every namespace's checkpoints with their parents,
metadata and channel versions, pending writes, and each channel's value once per
version in ``lg_blobs`` (a list that grew as what it gained), sealed under the target's
key ring. Every value is checked against the saver's strict serde before anything of
its thread is written (``allowed_types`` for your own types).

Each thread is one transaction, read from the source in pages of ``batch_size`` rows
in one snapshot: memory is bounded by a page (and a namespace's channel versions), not
by the thread. A thread already in the target with the same checkpoints and writes is
``"unchanged"``, so an import killed at any point is finished by running it again,
never duplicating anything. Each imported thread is then verified: the newest
checkpoint of every namespace reads back from tenxstore as LangGraph's saver reads it
from the source.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..archive import OPERATOR
from ..crypto import BLOB, CHECKPOINT, WRITE, Life, life_of
from ..errors import ConfigError, ImportConflict, SerializationError, TenxStoreError
from ..loops import BackgroundLoop
from ..protocol import Checkpointer
from ..serde import decode, encode
from ..types import AuthPolicy
from ..validate import check_id, check_text
from .moves import Materializer, digest, keys_of, row_time
from .saver import TenxCheckpointSaver
from .sources import Source, SourceWrite, open_source
from .tables import run_id_of
from .values import AllowedTypes, check_value

__all__ = ["LangGraphImport", "aimport_langgraph", "import_langgraph"]

_SYNC = BackgroundLoop("tenxstore-langgraph-import")
_CONFLICTS = {"error": "error", "fail": "error", "skip": "skip", "replace": "replace"}
_DECIMAL = re.compile(r"-?[1-9][0-9]*|0")


@dataclass
class LangGraphImport:
    """What :func:`aimport_langgraph` did (or, ``dry_run``, found).

    Attributes:
        source: The saver that wrote the source, as read (``PostgresSaver, migration 9``).
        threads: Threads of the source looked at.
        outcomes: Threads by outcome: ``created``, ``unchanged``, ``skipped``,
            ``replaced`` (a dry run: ``in target`` for those already there).
        refused: Threads not imported, with why (no user, a value the strict serde
            refuses, an id the target cannot hold...): nothing of them was written.
        checkpoints: Checkpoints written (a dry run: in the source).
        writes: Pending writes written (a dry run: in the source).
        values: Channel values written, once per version (a dry run: PostgreSQL's
            stored values; SQLite keeps them inside the checkpoints).
        verified: Threads whose newest checkpoints read back equal to the source's.
        dry_run: Nothing was written.
    """

    source: str = ""
    threads: int = 0
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: dict[str, str] = field(default_factory=dict)
    checkpoints: int = 0
    writes: int = 0
    values: int = 0
    verified: int = 0
    dry_run: bool = False


class _Refused(TenxStoreError):
    """A source thread that cannot be imported (a user, a value, an id)."""


def _repository(target: Any) -> Any:
    """The repository behind a checkpointer (a cache decorator's ``.inner``)."""
    while hasattr(target, "inner"):
        target = target.inner
    if not hasattr(target, "store"):
        raise ConfigError(f"import into a tenxstore checkpointer, not {type(target).__name__}")
    return target


class _Importer:
    def __init__(self, source: Source, target: Any, options: dict[str, Any]) -> None:
        self.source, self.repo = source, _repository(target)
        self.store, self.tables = self.repo.store, self.repo.langgraph
        self.saver = TenxCheckpointSaver(
            self.repo,
            history_limit=None,
            auth_policy=AuthPolicy(enforce_user_isolation=False),
            allowed_types=options["allowed_types"],
        )
        self.o = options
        self.done = LangGraphImport(dry_run=options["dry_run"])

    # -- one thread -------------------------------------------------------------------

    def _thread_id(self, name: str) -> Any:
        id_type = self.store.settings.id_type
        if id_type != "string":
            if not _DECIMAL.fullmatch(name):
                raise _Refused(f"its id is not an {id_type}, as the target's thread ids are")
            return check_id("thread_id", int(name), id_type)
        return check_id("thread_id", name)

    async def _user(self, reader: Any) -> Any:
        key, user = self.o["user_from_metadata"], self.o["user_id"]
        if key is None:
            return user
        named: set[str] = set()
        async for page in reader.metadata(self.o["batch_size"]):
            named.update(encode(m[key]) for m in page if isinstance(m, dict) and m.get(key))
        if not named:
            raise _Refused(f"no checkpoint's metadata names its user ({key!r})")
        if len(named) > 1:
            shown = ", ".join(sorted(named)[:3])
            raise _Refused(f"its checkpoints name {len(named)} users in {key!r}: {shown}")
        try:
            return check_id("user_id", decode(named.pop()), self.store.settings.user_id_type)
        except ConfigError as exc:
            raise _Refused(f"metadata {key!r}: {exc}") from None

    async def thread(self, name: str) -> str:
        """Import one thread; its outcome."""
        thread_id = self._thread_id(name)
        async with self.source.thread(name) as reader:
            user = await self._user(reader)
            if self.o["dry_run"]:
                found = await self.repo.aget_thread({"thread_id": thread_id, **OPERATOR})
                return "in target" if found is not None else "new"
            async with self.store.write(thread_id) as (conn, locked):
                outcome = "created"
                if locked is not None:
                    if await self._same(conn, reader, thread_id, user, locked):
                        outcome = "unchanged"
                    elif self.o["on_conflict"] == "skip":
                        return "skipped"
                    elif self.o["on_conflict"] == "error":
                        raise ImportConflict(
                            f"thread {name!r} is in the target with other content: import "
                            "with on_conflict 'skip' or 'replace' (the threads before it are "
                            "imported)",
                            thread_id=thread_id,
                        )
                    else:
                        await self.store.delete_thread(conn, thread_id)
                        outcome = "replaced"
                if outcome != "unchanged":
                    await self._write(conn, reader, thread_id, user)
        if self.o["verify"]:
            await self._verify(name, thread_id)
            self.done.verified += 1
        return outcome

    async def _same(self, conn: Any, reader: Any, thread_id: Any, user: Any, row: Any) -> bool:
        """Whether the target's thread is this import's, done before: the same owner,
        no core-API state, and the same checkpoints (with parents) and writes."""
        if row.user_id != user or row.version != 0:
            return False
        batch = self.o["batch_size"]
        for mine, theirs in keys_of(self.store, conn, thread_id, batch):
            source = reader.checkpoint_keys if mine == "checkpoints" else reader.write_keys
            if await digest(source(batch)) != await digest(theirs):
                return False
        return True

    async def _write(self, conn: Any, reader: Any, thread_id: Any, user: Any) -> None:
        """The thread's rows, written under its lock (the thread created for ``user``)."""
        from sqlalchemy import insert, update

        from ..config import RunIds

        store, tables = self.store, self.store.tables
        ids = RunIds(thread_id=thread_id, user_id=user, isolated=False)
        claimed = await store.claim_thread(conn, ids, None, store.now())
        life = life_of(claimed)  # every value is sealed for the life the import made
        moves = Materializer(self.saver, self.o["allowed"])
        heads: dict[str, str] = {}
        first = last = None
        async for page in reader.checkpoints(self.o["batch_size"]):
            rows, blobs = [], []
            for source, checkpoint, dump, keep, ns in await moves.materialize(reader, page):
                row, values = self._checkpoint_row(thread_id, source, checkpoint, dump, keep, life)
                rows.append(row)
                blobs += [
                    self._blob_row(thread_id, ns.name, bw, life) for bw in ns.new_values(values)
                ]
                heads[ns.name] = source.checkpoint_id
                first = row["created_at"] if first is None else min(first, row["created_at"])
                last = row["created_at"] if last is None else max(last, row["created_at"])
            await conn.execute(insert(tables.lg_checkpoints), rows)
            if blobs:
                await conn.execute(insert(tables.lg_blobs), blobs)
            self.done.checkpoints += len(rows)
            self.done.values += len(blobs)
        async for writes in reader.writes(self.o["batch_size"]):
            await conn.execute(
                insert(tables.lg_writes), [self._write_row(thread_id, w, life) for w in writes]
            )
            self.done.writes += len(writes)
        if heads:
            await conn.execute(
                insert(tables.lg_heads),
                [
                    {"thread_id": thread_id, "checkpoint_ns": n, "checkpoint_id": c}
                    for n, c in heads.items()
                ],
            )
            t = tables.threads  # its times: LangGraph's first and last checkpoint
            await conn.execute(
                update(t)
                .where(t.c.thread_id == thread_id)
                .values(created_at=first, updated_at=last)
            )

    def _checkpoint_row(
        self, thread_id: Any, source: Any, checkpoint: Any, dump: Any, keep: Any, life: Life
    ) -> tuple[dict[str, Any], Any]:
        limits = self.tables.limits
        ns = check_text("checkpoint_ns", source.checkpoint_ns, limits.namespace, empty=True)
        parent = source.parent_checkpoint_id or None
        if parent is not None:
            check_text("parent_checkpoint_id", parent, limits.checkpoint_id)
        if not isinstance(source.metadata, dict):
            raise SerializationError(f"checkpoint {source.checkpoint_id!r}: metadata is no object")
        typed, values = self.saver.stored_form(checkpoint, {}, dump=dump, keep_inline=keep)
        kind, data = self.tables._seal(typed[0], typed[1], thread_id, CHECKPOINT, life)
        row = {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": check_text(
                "checkpoint_id", source.checkpoint_id, limits.checkpoint_id
            ),
            "parent_checkpoint_id": parent,
            "type": kind,
            "checkpoint": data,
            "metadata": encode(source.metadata, "metadata"),
            "created_at": row_time(checkpoint.get("ts"), self.store.now()),
            "run_id": run_id_of(source.metadata),
            "versions": encode(values.versions, "versions"),
        }
        return row, values

    def _blob_row(self, thread_id: Any, ns: str, bw: Any, life: Life) -> dict[str, Any]:
        kind, data = self.tables._seal(bw.type, bw.blob, thread_id, BLOB, life)
        return {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "channel": bw.channel,
            "version": bw.version,
            "type": kind,
            "blob": data,
            "base": None if bw.base is None else bw.base.version,
            "splice": bw.splice,
            "skip": bw.skip,
            "uid": bw.uid,
        }

    def _write_row(self, thread_id: Any, w: SourceWrite, life: Life) -> dict[str, Any]:
        limits = self.tables.limits
        where = f"the write {w.task_id!r}/{w.idx} to channel {w.channel!r}"
        if isinstance(w.idx, bool) or not isinstance(w.idx, int) or not -(2**31) <= w.idx < 2**31:
            raise SerializationError(f"{where}: idx {w.idx!r} is no 32-bit int")
        if not isinstance(w.type, str) or not isinstance(w.value, bytes):
            raise SerializationError(f"{where}: no serialized value (type {w.type!r})")
        check_value(w.type, w.value, where, self.o["allowed"])
        kind, data = self.tables._seal(w.type, w.value, thread_id, WRITE, life)
        return {
            "thread_id": thread_id,
            "checkpoint_ns": check_text(
                "checkpoint_ns", w.checkpoint_ns, limits.namespace, empty=True
            ),
            "checkpoint_id": check_text("checkpoint_id", w.checkpoint_id, limits.checkpoint_id),
            "task_id": check_text("task_id", w.task_id, limits.task_id, empty=True),
            "idx": w.idx,
            "channel": check_text("channel", w.channel, None),
            "type": kind,
            "value": data,
            "task_path": check_text("task_path", w.task_path, None, empty=True),
        }

    async def _verify(self, name: str, thread_id: Any) -> None:
        """The newest checkpoint of each namespace, read back, equals the source's.

        Raises:
            TenxStoreError: It does not (the message says what differs).
        """
        moves = Materializer(self.saver, self.o["allowed"])
        async with self.source.thread(name) as reader:
            for ns in await reader.namespaces():
                found = await reader.head(ns)
                if found is None:  # gone from the source since
                    continue
                expected = await moves.comparable(reader, *found)
                got = await self.saver.aget_tuple(
                    {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
                )
                mine = None if got is None else moves.comparable_tuple(got)
                if mine != expected:
                    what = moves.difference(expected, mine)
                    raise TenxStoreError(
                        f"thread {name!r}, namespace {ns!r}: the imported checkpoint differs "
                        f"from the source's ({what})"
                    )


def _options(**given: Any) -> dict[str, Any]:
    """The checked arguments of an import (before any I/O)."""
    from .values import allowed_set

    if given["user_id"] is not None and given["user_from_metadata"] is not None:
        raise ConfigError("give user_id or user_from_metadata, not both")
    key = given["user_from_metadata"]
    if key is not None and (not isinstance(key, str) or not key):
        raise ConfigError("user_from_metadata is the name of a metadata key (a str)")
    conflict = _CONFLICTS.get(given["on_conflict"])
    if conflict is None:
        raise ConfigError(
            f"on_conflict must be error, skip or replace, not {given['on_conflict']!r}"
        )
    batch = given["batch_size"]
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 100_000:
        raise ConfigError(f"batch_size must be an int from 1 to 100000, not {batch!r}")
    only = given["thread_ids"]
    if isinstance(only, str) or (only is not None and not all(isinstance(t, str) for t in only)):
        raise ConfigError("thread_ids must be a sequence of str (LangGraph's thread ids)")
    return {
        **given,
        "on_conflict": conflict,
        "allowed": allowed_set(given["allowed_types"]),
        "thread_ids": None if only is None else list(only),
    }


async def aimport_langgraph(
    source_url: str,
    target: Checkpointer,
    *,
    user_id: Any = None,
    user_from_metadata: str | None = None,
    on_conflict: str = "error",
    thread_ids: Sequence[str] | None = None,
    batch_size: int = 500,
    dry_run: bool = False,
    source_schema: str | None = None,
    allowed_types: AllowedTypes = (),
    isolated: bool | None = None,
    verify: bool = True,
    progress: Callable[[str, str], None] | None = None,
    total: Callable[[int], None] | None = None,
) -> LangGraphImport:
    """Import the threads LangGraph's PostgreSQL or SQLite saver wrote into ``target``.

    Each thread is one transaction (read in pages of ``batch_size`` rows) and then
    verified; a thread already imported is ``"unchanged"``, so run it again after a
    failure or a kill to finish. A refused thread (see ``refused``) writes nothing and
    the others go on; a conflict under ``on_conflict="error"`` stops the import there.

    Args:
        source_url: ``postgresql://...`` (``PostgresSaver`` tables, in
            ``source_schema``), or ``sqlite:///FILE`` or a file's path (``SqliteSaver``).
        target: A tenxstore checkpointer, set up.
        user_id: The owner of every imported thread.
        user_from_metadata: Instead, a metadata key naming each thread's owner
            (LangGraph copies ``configurable`` keys such as ``user_id`` there): a thread
            whose checkpoints name none, or several, is refused.
        on_conflict: For a thread already in the target with other content: ``"error"``
            (raise :class:`~tenxstore.ImportConflict`), ``"skip"``, ``"replace"``.
        thread_ids: Only these threads (each must be in the source).
        batch_size: Rows read from the source per page.
        dry_run: Count, check owners and ids, write nothing.
        source_schema: The PostgreSQL schema of LangGraph's tables.
        allowed_types: Types of your own that values may hold (classes or ``(module,
            name)``), beyond LangGraph's safe ones.
        isolated: Whether threads need an owner (default: the target's
            ``enforce_user_isolation``).
        verify: Read each imported thread back and compare it with the source.
        progress: Called with each thread's id and outcome (``"refused"`` included).
        total: Called once with the number of threads, before the first.

    Raises:
        ConfigError: Bad arguments; no owner under isolation; a source that is not a
            saver version read (the message names what is read).
        ImportConflict: A thread is in the target with other content (``"error"``).
        TenxStoreError: An imported thread does not read back as the source holds it.

    Long because its fourteen arguments are written out and documented here, the
    public signature; the work is in ``_checked_target`` and ``_import``.
    """
    options = _options(
        user_id=user_id,
        user_from_metadata=user_from_metadata,
        on_conflict=on_conflict,
        thread_ids=thread_ids,
        batch_size=batch_size,
        dry_run=dry_run,
        allowed_types=allowed_types,
        verify=verify,
    )
    repo = _checked_target(target, options, isolated)
    source = open_source(source_url, source_schema)
    try:
        return await _import(source, repo, options, progress, total)
    finally:
        await source.aclose()


def _checked_target(target: Checkpointer, options: dict[str, Any], isolated: bool | None) -> Any:
    """The repository behind ``target``, and the owner the import gives its threads
    checked against it (before any I/O); ``options['user_id']`` as the target holds it."""
    repo = _repository(target)
    user_id, user_from_metadata = options["user_id"], options["user_from_metadata"]
    if user_id is not None:
        options["user_id"] = check_id("user_id", user_id, repo.user_id_type)
    under = repo.enforce_user_isolation if isolated is None else bool(isolated)
    if under and user_id is None and user_from_metadata is None:
        raise ConfigError(
            "the target isolates users: give every thread an owner (--user-id / user_id=, "
            "or --user-from-metadata KEY / user_from_metadata=, a metadata key naming it), "
            "or import with --shared / isolated=False for an application that runs with "
            "enforce_user_isolation=False"
        )
    return repo


async def _import(
    source: Source,
    repo: Any,
    options: dict[str, Any],
    progress: Callable[[str, str], None] | None,
    total: Callable[[int], None] | None,
) -> LangGraphImport:
    """:func:`aimport_langgraph` from an opened source into a checked target: the
    source and target checked, then each thread imported (or refused) in turn."""
    dry_run = options["dry_run"]
    await source.check()
    if dry_run:  # the target's schema and keys are checked before any thread
        await repo.astore_id()
    else:
        await repo.store.ensure_writable()
    importer = _Importer(source, repo, options)
    done = importer.done
    done.source = source.version
    only = options["thread_ids"]
    counts = await source.count(only)
    if total is not None:
        total(counts["threads"])
    if dry_run:
        done.checkpoints, done.writes = counts["checkpoints"], counts["writes"]
        done.values = counts.get("values", 0)
    async for name in source.threads(only, options["batch_size"]):
        done.threads += 1
        try:
            outcome = await importer.thread(name)
        except (_Refused, SerializationError, ConfigError) as exc:
            done.refused[name] = str(exc)
            outcome = "refused"
        if outcome != "refused":
            done.outcomes[outcome] += 1
        if progress is not None:
            progress(name, outcome)
    return done


def import_langgraph(source_url: str, target: Checkpointer, **options: Any) -> LangGraphImport:
    """Synchronous :func:`aimport_langgraph` (from a thread without a running loop)."""
    return _SYNC.run(aimport_langgraph(source_url, target, **options), "aimport_langgraph")
