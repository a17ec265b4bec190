"""Declarative models of the tables.

The annotations are the schema for the default id types (``"string"``). Thread and
user ids may instead be ``int`` or ``bigint`` columns (``id_type`` /
``user_id_type``); :func:`tables_for` gives the same tables with those column
types, and the initial migration creates them accordingly.

Payload columns (``state_data``, ``payload``, ``metadata``, ``args``...) are TEXT
holding JSON written by :mod:`tenxstore.serde`, not JSONB: JSONB rejects
``\\u0000`` and integers it cannot hold exactly, and every JSON value must
round-trip.

The declared tables carry no schema: migrations place them with a transaction-local
``search_path`` (and ``version_table_schema``), and the repository uses copies bound
to its schema (:func:`tables_for`).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, ClassVar, NamedTuple

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.mysql import DATETIME, LONGBLOB, LONGTEXT
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

from .validate import IdType

__all__ = [
    "NAMING_CONVENTION",
    "Base",
    "MemoryRow",
    "MemoryVersionRow",
    "MessageRow",
    "StateRow",
    "StoreRow",
    "Tables",
    "ThreadRow",
    "ToolExecutionRow",
    "id_sql_type",
    "tables_for",
]

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# A surrogate key that autoincrements everywhere: SQLite only does so for INTEGER.
SurrogateKey = BigInteger().with_variant(Integer(), "sqlite")
# MySQL's TEXT and BLOB hold 64 KB, its DATETIME no fraction of a second; its InnoDB
# keys at most 3072 bytes (768 utf8mb4 characters): the LangGraph key columns are
# shorter there (as migrations 0002 and 0005 make them).
_MYSQL = ("mysql", "mariadb")
LongText = Text().with_variant(LONGTEXT(), *_MYSQL)
LongBlob = LargeBinary().with_variant(LONGBLOB(), *_MYSQL)
Timestamp = DateTime(timezone=True).with_variant(DATETIME(fsp=6), *_MYSQL)


def _key(length: int) -> TypeEngine[Any]:
    return String(255).with_variant(String(length), *_MYSQL)


def id_sql_type(id_type: IdType) -> TypeEngine[Any]:
    """The column type of a thread or user id of the given kind."""
    if id_type == "int":
        return Integer()
    if id_type == "bigint":
        return BigInteger()
    return String(255)


class Base(DeclarativeBase):
    """Declarative base: naming convention (needed by SQLite batch migrations)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: Timestamp,
        str: LongText,
    }


class ThreadRow(Base):
    """One conversation: its owner, record and head version."""

    __tablename__ = "threads"

    thread_id: Mapped[str] = mapped_column(String(255), primary_key=True, autoincrement=False)
    user_id: Mapped[str | None] = mapped_column(String(255))
    name: Mapped[str | None]
    # JSON text; "metadata" is reserved on declarative classes, hence the attribute name.
    thread_metadata: Mapped[str | None] = mapped_column("metadata")
    # The head version: the compare-and-swap target of every state write.
    version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    # Which life of this thread id: larger for every new one (created again after a
    # delete, or replaced by an import). Assigned by the database (migration 0003).
    incarnation: Mapped[int] = mapped_column(BigInteger)

    # user_id alone: an index on updated_at would make every version bump a non-HOT
    # update on PostgreSQL (migration 0004); fillfactor leaves room for HOT updates.
    # Migration 0004 sets the fillfactor (90) too; it is not stated here, where
    # SQLAlchemy would load PostgreSQL's dialect to check the keyword in every process.
    __table_args__ = (Index("ix_threads_user_id", "user_id"),)


class StateRow(Base):
    """One retained version of a thread's state."""

    __tablename__ = "states"

    state_id: Mapped[int] = mapped_column(SurrogateKey, primary_key=True, autoincrement=True)
    thread_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("threads.thread_id", ondelete="CASCADE")
    )
    version: Mapped[int] = mapped_column(BigInteger)
    state_data: Mapped[str]
    meta: Mapped[str | None]
    created_at: Mapped[datetime]
    # A random number a one-step write stores (0013): what tells, after its connection
    # broke mid-flight, whether it committed. NULL when written by the locked path.
    write_id: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (UniqueConstraint("thread_id", "version"),)


class MessageRow(Base):
    """One message of a thread; ``seq`` orders a thread's messages by insertion."""

    __tablename__ = "messages"

    seq: Mapped[int] = mapped_column(SurrogateKey, primary_key=True, autoincrement=True)
    thread_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("threads.thread_id", ondelete="CASCADE")
    )
    message_id: Mapped[str] = mapped_column(String(255))
    role: Mapped[str | None]
    payload: Mapped[str]
    created_at: Mapped[datetime]

    __table_args__ = (UniqueConstraint("thread_id", "message_id"),)


class ToolExecutionRow(Base):
    """The ledger entry of one tool call."""

    __tablename__ = "tool_executions"

    thread_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("threads.thread_id", ondelete="CASCADE"), primary_key=True
    )
    tool_call_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    tool_name: Mapped[str]
    args: Mapped[str]
    status: Mapped[str] = mapped_column(String(16))
    result: Mapped[str | None]
    error: Mapped[str | None]
    attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    lease_expires_at: Mapped[datetime | None]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


class LangGraphCheckpointRow(Base):
    """A LangGraph checkpoint kept by :mod:`tenxstore.langgraph` (serialized by its serde)."""

    __tablename__ = "lg_checkpoints"

    thread_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("threads.thread_id", ondelete="CASCADE"), primary_key=True
    )
    checkpoint_ns: Mapped[str] = mapped_column(_key(191), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    parent_checkpoint_id: Mapped[str | None] = mapped_column(String(64))
    type: Mapped[str] = mapped_column(String(64))
    checkpoint: Mapped[bytes] = mapped_column(LongBlob)
    checkpoint_metadata: Mapped[str] = mapped_column("metadata")
    created_at: Mapped[datetime]
    run_id: Mapped[str | None] = mapped_column(String(255), index=True)
    #: ``{channel: version}`` of the values kept in ``lg_blobs`` (JSON); NULL for a
    #: checkpoint written with its values inline (before 0005).
    versions: Mapped[str | None]


class LangGraphHeadRow(Base):
    """The checkpoint a LangGraph namespace's last put wrote, as that put left it (no
    row, or a row naming another checkpoint: not known): the compare-and-swap of a
    put's one-statement path (0008; ``lg_checkpoints.is_head`` before). A row of its
    own, so that moving the mark rewrites this small row, not a checkpoint's."""

    __tablename__ = "lg_heads"

    thread_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("threads.thread_id", ondelete="CASCADE"), primary_key=True
    )
    checkpoint_ns: Mapped[str] = mapped_column(_key(191), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(String(64))


class LangGraphWriteRow(Base):
    """A pending write of a LangGraph task against a checkpoint."""

    __tablename__ = "lg_writes"

    thread_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("threads.thread_id", ondelete="CASCADE"), primary_key=True
    )
    checkpoint_ns: Mapped[str] = mapped_column(_key(191), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(_key(191), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    channel: Mapped[str]
    type: Mapped[str] = mapped_column(String(64))
    value: Mapped[bytes] = mapped_column(LongBlob)
    task_path: Mapped[str]


class LangGraphBlobRow(Base):
    """One version of one channel's value (LangGraph's serde), shared by every
    checkpoint of the namespace that has that version: a value is stored when it
    changes, not with every checkpoint."""

    __tablename__ = "lg_blobs"

    thread_id: Mapped[str] = mapped_column(
        String(255), ForeignKey("threads.thread_id", ondelete="CASCADE"), primary_key=True
    )
    checkpoint_ns: Mapped[str] = mapped_column(_key(191), primary_key=True)
    channel: Mapped[str] = mapped_column(_key(191), primary_key=True)
    version: Mapped[str] = mapped_column(_key(128), primary_key=True)
    type: Mapped[str] = mapped_column(String(64))
    #: The value, or with ``base`` a delta of that version's value (0006, see
    #: :mod:`tenxstore.deltas`): ``blob[:splice] + value(base)[skip:] + blob[splice:]``.
    blob: Mapped[bytes] = mapped_column(LongBlob)
    base: Mapped[str | None] = mapped_column(String(255))
    splice: Mapped[int | None] = mapped_column(Integer)
    skip: Mapped[int | None] = mapped_column(Integer)
    #: The row's random identity: a delta is written on a base only while it is there.
    uid: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class StoreRow(Base):
    """The store's one row: its identity, SQLite's incarnation counter, and whether it
    holds sealed values."""

    __tablename__ = "tenxstore_store"

    store_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_incarnation: Mapped[int] = mapped_column(BigInteger, server_default="0")
    created_at: Mapped[datetime]
    #: When the store was first marked as holding sealed values (0009): an instance
    #: without a key ring refuses to write from then on. NULL: never.
    sealed_since: Mapped[datetime | None]


class MemoryRow(Base):
    """One long-term memory of a user (:mod:`tenxstore.memory`): its current version.

    ``content`` (a JSON string) and ``metadata`` (a JSON object) are sealed under the
    key ring like every payload, bound to ``uid``: random, and new with every life of
    a key (a memory deleted and stored again is another one). ``terms`` is the keyword
    index's text — the content's words, in clear, as the database's full-text engine
    reads them (NULL when the store keeps no keyword index); the engine's index over
    it is made by migration 0010 for each database (SQLite: the FTS5 table
    ``memories_fts``, kept by triggers; PostgreSQL: a GIN index of its ``simple``
    ``tsvector``; MySQL: a FULLTEXT index).
    """

    __tablename__ = "memories"

    id: Mapped[int] = mapped_column(SurrogateKey, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True)
    user_id: Mapped[str] = mapped_column(String(255))
    #: The namespace's labels joined with "." (a label holds none).
    namespace: Mapped[str] = mapped_column(String(255))
    memory_key: Mapped[str] = mapped_column(String(255))
    content: Mapped[str]
    memory_metadata: Mapped[str] = mapped_column("metadata")
    terms: Mapped[str | None]
    #: 1 on creation, + 1 per write: the compare-and-swap target of an update.
    version: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    expires_at: Mapped[datetime | None] = mapped_column(index=True)

    __table_args__ = (UniqueConstraint("user_id", "namespace", "memory_key"),)


class MemoryVersionRow(Base):
    """A past version of a memory (the current one is its ``memories`` row), sealed
    as it was: bound to the memory's ``uid``, like the current one."""

    __tablename__ = "memory_versions"

    memory_id: Mapped[int] = mapped_column(
        SurrogateKey,
        ForeignKey("memories.id", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    )
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    uid: Mapped[str] = mapped_column(String(32))
    content: Mapped[str]
    memory_metadata: Mapped[str] = mapped_column("metadata")
    updated_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]


class MemoryVectorRow(Base):
    """The vector of a memory's current content (:mod:`tenxstore.memory.vectors`):
    float32 little-endian bytes of ``dims`` numbers, by the embedding ``model_id``,
    written in the memory's own write transaction (0011), each write stamped
    (``written``, 0012). Not sealed: see
    docs/memory.md. On PostgreSQL with pgvector, ``tenxstore memories enable-pgvector``
    adds a ``vector`` column ``embedding`` beside it (not declared here)."""

    __tablename__ = "memory_vectors"

    memory_id: Mapped[int] = mapped_column(
        SurrogateKey,
        ForeignKey("memories.id", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    )
    model_id: Mapped[str] = mapped_column(String(255), index=True)
    dims: Mapped[int]
    vector: Mapped[bytes] = mapped_column(LongBlob)
    written: Mapped[int] = mapped_column(BigInteger, server_default="0")
    """A random stamp every write of the vector writes anew (0012): what tells a
    cached matrix that a vector was rewritten at the same version and model."""


class MemoryRevisionRow(Base):
    """A revision every write to one user's namespace writes anew (a random stamp), in
    the write's transaction (0011): what a cached matrix of vectors is checked against
    before it is used."""

    __tablename__ = "memory_revisions"

    user_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(255), primary_key=True)
    revision: Mapped[int] = mapped_column(BigInteger)


class Tables(NamedTuple):
    """The tables, with the column types of one id configuration."""

    threads: Table
    states: Table
    messages: Table
    tool_executions: Table
    lg_checkpoints: Table
    lg_writes: Table
    store: Table
    lg_blobs: Table
    lg_heads: Table
    memories: Table
    memory_versions: Table
    memory_vectors: Table
    memory_revisions: Table

    @property
    def of_thread(self) -> tuple[Table, ...]:
        """The tables holding a thread's data, children first (deleted in this order)."""
        return (
            self.states,
            self.messages,
            self.tool_executions,
            self.lg_writes,
            self.lg_blobs,
            self.lg_heads,
            self.lg_checkpoints,
            self.threads,
        )


@functools.lru_cache(maxsize=256)
def tables_for(
    id_type: IdType = "string", user_id_type: IdType = "string", schema: str | None = None
) -> Tables:
    """The tables with thread and user id columns of the given types, in ``schema``:
    one set per process for each (a copy of the metadata costs ~3 ms; the set is never
    changed, so repositories of one configuration share it).

    The repository's statements name the schema directly rather than through the
    engine's ``schema_translate_map``: a translate map is applied to the SQL string of
    every execution, which costs more on a one-row read than the work around it.
    """
    if id_type == "string" and user_id_type == "string" and schema is None:
        metadata = Base.metadata
    else:
        metadata = MetaData(naming_convention=NAMING_CONVENTION)
        for table in Base.metadata.sorted_tables:
            copy = (
                table.to_metadata(metadata, schema=schema)
                if schema
                else table.to_metadata(metadata)
            )
            if "thread_id" in copy.c:
                copy.c.thread_id.type = id_sql_type(id_type)
            if "user_id" in copy.c:
                copy.c.user_id.type = id_sql_type(user_id_type)
    prefix = f"{schema}." if schema else ""
    t = metadata.tables
    names = {"store": "tenxstore_store"}
    return Tables(*(t[prefix + names.get(field, field)] for field in Tables._fields))
