"""Reading the tables of LangGraph's own savers, for :mod:`tenxstore.langgraph.importer`.

Two kinds of source, one small reader each, chosen by the URL:

* **PostgreSQL** (``PostgresSaver`` / ``AsyncPostgresSaver``): ``checkpoints`` (the
  checkpoint as JSONB, its primitive values inline), ``checkpoint_blobs`` (every other
  value, once per channel version), ``checkpoint_writes``; ``checkpoint_migrations``
  says which of the saver's migrations ran. Migrations 3 to 9 are read: every
  ``langgraph-checkpoint-postgres`` since it began to count them (1.0, August 2024)
  through 3.x, with or without ``task_path`` (migration 9). Anything else is refused.
* **SQLite** (``SqliteSaver`` / ``AsyncSqliteSaver``): ``checkpoints`` (the
  checkpoint serialized whole, values inline) and ``writes``, as every
  ``langgraph-checkpoint-sqlite`` writes them (``task_path`` or not). The tables of
  LangGraph before 0.2 (``thread_ts``, no namespaces) are refused.

Nothing here deserializes a value: rows come out as LangGraph stored them, and the
importer checks each one against the strict serde before it reads or writes it. A
thread is read in one snapshot, page by page in key order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    cast,
    distinct,
    func,
    inspect,
    literal,
    make_url,
    select,
    tuple_,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ..backends import async_url
from ..errors import ConfigError, SerializationError
from ..serde import decode

__all__ = [
    "POSTGRES_MIGRATIONS",
    "TASKS",
    "Source",
    "SourceCheckpoint",
    "SourceWrite",
    "open_source",
    "pages",
]

POSTGRES_MIGRATIONS = range(3, 10)
"""The ``checkpoint_migrations`` versions read: from the first with every table (3) to
the newest known (9, ``checkpoint_writes.task_path``)."""
TASKS = "__pregel_tasks"  # LangGraph's channel of the Sends a checkpoint before v4 kept


@dataclass(frozen=True, slots=True)
class SourceCheckpoint:
    """A checkpoint row as LangGraph stored it: ``checkpoint`` (PostgreSQL: the JSON,
    with only its inline values) or ``typed`` (SQLite: serialized whole)."""

    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    metadata: Any
    checkpoint: Any = None
    typed: tuple[str, bytes] | None = None


@dataclass(frozen=True, slots=True)
class SourceWrite:
    """A pending write row as LangGraph stored it."""

    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    type: Any
    value: Any
    task_path: str


def _json(what: str, text: Any) -> Any:
    """A JSON column (text or bytes) decoded; NULL is ``{}`` as LangGraph reads it."""
    if text is None:
        return {}
    try:
        return decode(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SerializationError(f"{what} is not JSON ({exc})") from None


async def pages(
    conn: AsyncConnection,
    table: Table,
    thread_id: Any,
    keys: Sequence[Any],
    columns: Sequence[Any],
    batch: int,
    *where: Any,
) -> AsyncIterator[list[Any]]:
    """A thread's rows of ``table`` in ``keys`` order, ``batch`` at a time (each page
    starts after the last one's key: no offset walks the rows again)."""
    after: tuple[Any, ...] | None = None
    base = select(*keys, *columns).where(table.c.thread_id == thread_id, *where)
    while True:
        page = base if after is None else base.where(tuple_(*keys) > tuple_(*after))
        rows = list((await conn.execute(page.order_by(*keys).limit(batch))).all())
        if rows:
            yield rows
        if len(rows) < batch:
            return
        after = tuple(rows[-1][: len(keys)])


class Reader:
    """One thread of a source, read in one snapshot (a transaction of its own)."""

    def __init__(self, source: Source, conn: AsyncConnection, thread_id: str) -> None:
        self._s, self._conn, self.thread_id = source, conn, thread_id
        self.kind = source.kind

    def _pages(
        self, table: Table, keys: Sequence[Any], columns: Sequence[Any], batch: int, *where: Any
    ) -> AsyncIterator[list[Any]]:
        return pages(self._conn, table, self.thread_id, keys, columns, batch, *where)

    def _checkpoint(self, r: Any) -> SourceCheckpoint:
        where = f"thread {self.thread_id!r}, checkpoint {r.checkpoint_id!r}"
        metadata = _json(f"{where}: the metadata", r.metadata)
        if self._s.kind == "postgresql":
            body = _json(f"{where}: the checkpoint", r.checkpoint)
            return SourceCheckpoint(
                r.checkpoint_ns, r.checkpoint_id, r.parent_checkpoint_id, metadata, body
            )
        data = r.checkpoint
        typed = (r.type, bytes(data) if data is not None else b"")
        return SourceCheckpoint(
            r.checkpoint_ns, r.checkpoint_id, r.parent_checkpoint_id, metadata, typed=typed
        )

    def _checkpoint_columns(self) -> list[Any]:
        c = self._s.checkpoints
        return [c.c.parent_checkpoint_id, c.c.type, self._s.payload(c.c.checkpoint, "checkpoint")]

    async def checkpoints(self, batch: int) -> AsyncIterator[list[SourceCheckpoint]]:
        """Every checkpoint, by namespace then id (a parent before its children)."""
        c = self._s.checkpoints
        columns = [*self._checkpoint_columns(), self._s.payload(c.c.metadata, "metadata")]
        async for rows in self._pages(c, (c.c.checkpoint_ns, c.c.checkpoint_id), columns, batch):
            yield [self._checkpoint(r) for r in rows]

    async def metadata(self, batch: int) -> AsyncIterator[list[Any]]:
        """Every checkpoint's metadata, decoded."""
        c = self._s.checkpoints
        columns = [self._s.payload(c.c.metadata, "metadata")]
        async for rows in self._pages(c, (c.c.checkpoint_ns, c.c.checkpoint_id), columns, batch):
            yield [_json(f"checkpoint {r.checkpoint_id!r}: the metadata", r.metadata) for r in rows]

    async def checkpoint_keys(self, batch: int) -> AsyncIterator[list[Any]]:
        """``(namespace, id, parent)`` of every checkpoint."""
        c = self._s.checkpoints
        keys = (c.c.checkpoint_ns, c.c.checkpoint_id)
        async for rows in self._pages(c, keys, [c.c.parent_checkpoint_id], batch):
            yield rows

    async def writes(self, batch: int, *where: Any) -> AsyncIterator[list[SourceWrite]]:
        """Every pending write, by namespace, checkpoint, task and index."""
        w = self._s.writes
        keys = (w.c.checkpoint_ns, w.c.checkpoint_id, w.c.task_id, w.c.idx)
        columns = [w.c.channel, w.c.type, self._s.write_value, self._s.task_path]
        async for rows in self._pages(w, keys, columns, batch, *where):
            yield [
                SourceWrite(
                    r.checkpoint_ns,
                    r.checkpoint_id,
                    r.task_id,
                    r.idx,
                    r.channel,
                    r.type,
                    r.value,
                    r.task_path or "",
                )
                for r in rows
            ]

    async def write_keys(self, batch: int) -> AsyncIterator[list[Any]]:
        """``(namespace, checkpoint, task, index)`` of every pending write."""
        w = self._s.writes
        keys = (w.c.checkpoint_ns, w.c.checkpoint_id, w.c.task_id, w.c.idx)
        async for rows in self._pages(w, keys, [], batch):
            yield rows

    async def head(self, ns: str) -> tuple[SourceCheckpoint, list[SourceWrite]] | None:
        """A namespace's newest checkpoint (as LangGraph's ``get_tuple`` finds it) and
        its pending writes."""
        c = self._s.checkpoints
        found = (
            await self._conn.execute(
                select(
                    c.c.checkpoint_ns,
                    c.c.checkpoint_id,
                    *self._checkpoint_columns(),
                    self._s.payload(c.c.metadata, "metadata"),
                )
                .where(c.c.thread_id == self.thread_id, c.c.checkpoint_ns == ns)
                .order_by(c.c.checkpoint_id.desc())
                .limit(1)
            )
        ).first()
        if found is None:
            return None
        checkpoint = self._checkpoint(found)
        w = self._s.writes
        here = (w.c.checkpoint_ns == ns, w.c.checkpoint_id == checkpoint.checkpoint_id)
        writes = [x async for page in self.writes(500, *here) for x in page]
        return checkpoint, writes

    async def namespaces(self) -> list[str]:
        """The thread's namespaces."""
        c = self._s.checkpoints
        rows = await self._conn.execute(
            select(c.c.checkpoint_ns).distinct().where(c.c.thread_id == self.thread_id)
        )
        return sorted(r[0] for r in rows)

    async def blobs(
        self, ns: str, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[Any, Any]]:
        """PostgreSQL: ``(type, bytes)`` of the values stored at these channel
        versions (an ``"empty"`` one included: LangGraph's mark of no value)."""
        b = self._s.blobs
        wanted, found = sorted(set(keys)), {}
        if b is None:
            return {}
        for start in range(0, len(wanted), 500):
            rows = await self._conn.execute(
                select(b.c.channel, b.c.version, b.c.type, b.c.blob).where(
                    b.c.thread_id == self.thread_id,
                    b.c.checkpoint_ns == ns,
                    tuple_(b.c.channel, b.c.version).in_(wanted[start : start + 500]),
                )
            )
            found.update({(r.channel, r.version): (r.type, r.blob) for r in rows})
        return found

    async def sends(self, parents: Iterable[str]) -> dict[str, list[tuple[Any, Any]]]:
        """PostgreSQL: the Sends a checkpoint before v4 reads from its parent's
        writes to the tasks channel, ``(type, bytes)`` in LangGraph's order."""
        w = self._s.writes
        wanted = sorted(set(parents))
        found: dict[str, list[tuple[Any, Any]]] = {}
        for start in range(0, len(wanted), 500):
            rows = await self._conn.execute(
                select(w.c.checkpoint_id, w.c.type, self._s.write_value)
                .where(
                    w.c.thread_id == self.thread_id,
                    w.c.checkpoint_id.in_(wanted[start : start + 500]),
                    w.c.channel == TASKS,
                )
                .order_by(w.c.checkpoint_id, self._s.task_path, w.c.task_id, w.c.idx)
            )
            for r in rows:
                found.setdefault(r.checkpoint_id, []).append((r.type, r.value))
        return found


class Source:
    """A database LangGraph's savers wrote: its kind, tables, and what differs."""

    def __init__(self, kind: str, engine: AsyncEngine, schema: str | None, where: str) -> None:
        self.kind, self.engine, self.schema, self.where = kind, engine, schema, where
        meta = MetaData(schema=schema)
        blob = LargeBinary()

        def table(name: str, *columns: Column[Any]) -> Table:
            return Table(
                name, meta, Column("thread_id", Text), Column("checkpoint_ns", Text), *columns
            )

        payload = Text() if kind == "postgresql" else blob
        self.checkpoints = table(
            "checkpoints",
            Column("checkpoint_id", Text),
            Column("parent_checkpoint_id", Text),
            Column("type", Text),
            Column("checkpoint", payload),
            Column("metadata", payload),
        )
        value = "blob" if kind == "postgresql" else "value"
        self.writes = table(
            "checkpoint_writes" if kind == "postgresql" else "writes",
            Column("checkpoint_id", Text),
            Column("task_id", Text),
            Column("idx", Integer),
            Column("channel", Text),
            Column("type", Text),
            Column(value, blob),
            Column("task_path", Text),
        )
        self.write_value = self.writes.c[value].label("value")
        self.task_path: Any = self.writes.c.task_path
        self.blobs: Table | None = None
        if kind == "postgresql":
            self.blobs = table(
                "checkpoint_blobs",
                Column("channel", Text),
                Column("version", Text),
                Column("type", Text),
                Column("blob", blob),
            )
        self.version = ""
        """Which saver wrote it, in words (known once :meth:`check` has run)."""

    def payload(self, column: Any, name: str) -> Any:
        """A JSON or serialized column as the driver should hand it over (JSONB as text)."""
        if self.kind == "postgresql":
            return cast(column, Text).label(name)
        return column

    async def check(self) -> None:
        """Refuse a database that is not one of the saver versions this release reads.

        Raises:
            ConfigError: The tables are not there, or of a version not read.
        """
        async with self.engine.connect() as conn:
            found = await conn.run_sync(lambda c: _shape(c, self.schema))
            if self.kind == "postgresql":
                await self._check_postgres(conn, found)
            else:
                self._check_sqlite(found)

    async def _check_postgres(self, conn: AsyncConnection, found: dict[str, set[str]]) -> None:
        wanted = {"checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations"}
        if not wanted <= set(found):
            missing = ", ".join(sorted(wanted - set(found)))
            raise ConfigError(
                f"{self.where} holds no tables of LangGraph's PostgresSaver (missing: {missing})"
                + ("" if self.schema else "; is --source-schema needed?")
            )
        m = Table("checkpoint_migrations", MetaData(schema=self.schema), Column("v", Integer))
        version = (await conn.execute(select(func.max(m.c.v)))).scalar()
        if version not in POSTGRES_MIGRATIONS or "checkpoint_id" not in found["checkpoints"]:
            raise ConfigError(
                f"{self.where}: LangGraph's PostgresSaver tables at migration {version}; this "
                f"release reads migrations {POSTGRES_MIGRATIONS.start}-"
                f"{POSTGRES_MIGRATIONS.stop - 1} (langgraph-checkpoint-postgres 1.0 through "
                "3.x): run that saver's setup() on it first, or use a release of tenxstore "
                "that knows this one"
            )
        if "task_path" not in found["checkpoint_writes"]:  # before migration 9
            self.task_path = literal("", Text).label("task_path")
        self.version = f"PostgresSaver, migration {version}"

    def _check_sqlite(self, found: dict[str, set[str]]) -> None:
        checkpoints = found.get("checkpoints", set())
        if "thread_ts" in checkpoints:
            raise ConfigError(
                f"{self.where} holds the checkpoints of LangGraph before 0.2 (thread_ts, no "
                "namespaces), which this release does not read: open it with "
                "langgraph-checkpoint-sqlite 1.x once to move it on, or start anew"
            )
        wanted = {"checkpoint_ns", "checkpoint_id", "type", "checkpoint", "metadata"}
        if not wanted <= checkpoints or "writes" not in found:
            raise ConfigError(f"{self.where} holds no tables of LangGraph's SqliteSaver")
        if "task_path" not in found["writes"]:
            self.task_path = literal("", Text).label("task_path")
        self.version = "SqliteSaver" + ("" if "task_path" in found["writes"] else " (no task_path)")

    @asynccontextmanager
    async def thread(self, thread_id: str) -> AsyncIterator[Reader]:
        """A reader of one thread, in one snapshot."""
        async with self.engine.connect() as conn:
            if self.kind == "postgresql":
                conn = await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                yield Reader(self, conn, thread_id)

    async def threads(self, only: Sequence[str] | None, batch: int) -> AsyncIterator[str]:
        """The threads holding checkpoints, in id order (or the ones named).

        Raises:
            ConfigError: A thread named is not in the source.
        """
        c = self.checkpoints
        if only is not None:
            for thread_id in dict.fromkeys(only):
                async with self.engine.connect() as conn:
                    there = await conn.execute(
                        select(c.c.thread_id).where(c.c.thread_id == thread_id).limit(1)
                    )
                    if there.first() is None:
                        raise ConfigError(f"{self.where} has no checkpoint of thread {thread_id!r}")
                yield thread_id
            return
        after: str | None = None
        while True:
            page = select(c.c.thread_id).distinct().order_by(c.c.thread_id).limit(batch)
            if after is not None:
                page = page.where(c.c.thread_id > after)
            async with self.engine.connect() as conn:
                rows = [r[0] for r in await conn.execute(page)]
            for thread_id in rows:
                yield thread_id
            if len(rows) < batch:
                return
            after = rows[-1]

    async def count(self, only: Sequence[str] | None) -> dict[str, int]:
        """How many threads, checkpoints, pending writes and stored values there are."""
        tables = {"checkpoints": self.checkpoints, "writes": self.writes}
        if self.blobs is not None:
            tables["values"] = self.blobs
        counts: dict[str, int] = {}
        async with self.engine.connect() as conn:
            for name, t in tables.items():
                stmt = select(func.count()).select_from(t)
                if only is not None:
                    stmt = stmt.where(t.c.thread_id.in_(list(only)))
                counts[name] = int((await conn.execute(stmt)).scalar() or 0)
            c = self.checkpoints
            threads = select(func.count(distinct(c.c.thread_id)))
            if only is not None:
                threads = threads.where(c.c.thread_id.in_(list(only)))
            counts["threads"] = int((await conn.execute(threads)).scalar() or 0)
        return counts

    async def aclose(self) -> None:
        """Close the source's connections."""
        await self.engine.dispose()


def _shape(conn: Any, schema: str | None) -> dict[str, set[str]]:
    """Each table of the schema with its column names."""
    found = inspect(conn)
    return {
        name: {col["name"] for col in found.get_columns(name, schema=schema)}
        for name in found.get_table_names(schema=schema)
    }


def open_source(url: str, schema: str | None = None) -> Source:
    """The source a URL names: ``postgresql://...`` or ``sqlite:///FILE`` (or the path
    of a SQLite file).

    Raises:
        ConfigError: Another kind of URL, a schema for SQLite, or no such file.
    """
    if "://" not in url:
        url = f"sqlite:///{url}"
    parsed = async_url(url)
    kind = parsed.get_backend_name()
    where = repr(parsed.render_as_string(hide_password=True))
    if kind == "sqlite":
        if schema is not None:
            raise ConfigError("--source-schema is for a PostgreSQL source; SQLite has none")
        path = parsed.database or ""
        if not path or path == ":memory:" or not Path(path).is_file():
            raise ConfigError(f"there is no SQLite file at {path or '(none)'}")
        return Source("sqlite", create_async_engine(parsed, poolclass=NullPool), None, path)
    if kind != "postgresql":
        raise ConfigError(
            f"LangGraph's savers are read from PostgreSQL or SQLite, not {kind}: {where}"
        )
    engine = create_async_engine(make_url(parsed), pool_size=2, max_overflow=2)
    return Source(
        kind, engine, schema, where if schema is None else f"schema {schema!r} of {where}"
    )
