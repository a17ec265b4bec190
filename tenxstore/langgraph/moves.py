"""The pieces of :mod:`tenxstore.langgraph.importer`: a source checkpoint made whole as
LangGraph's saver reads it, the values a namespace stores once, and what an import
compares (keys to tell a thread imported before, checkpoints to verify one).

A value is never opened before :func:`~tenxstore.langgraph.values.check_value` has
found it one that the strict serde opens: PostgreSQL's stored values are carried over
as LangGraph serialized them, SQLite's (kept inside each checkpoint) are read through
the saver's strict serde and serialized again per channel.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timezone
from itertools import groupby
from typing import Any

from ..deltas import Base, BlobWrite, blob_write
from ..errors import SerializationError
from ..serde import encode
from .sources import TASKS, Reader, SourceCheckpoint, SourceWrite, pages
from .tables import Values
from .values import check_value

__all__ = ["Materializer", "Namespace", "digest", "keys_of", "row_time"]

_STORED = object()  # a channel whose value at this version an earlier checkpoint stored


def row_time(ts: Any, now: datetime) -> datetime:
    """A checkpoint's ``ts`` as the time of its row (``now`` when it has none)."""
    try:
        when = datetime.fromisoformat(ts) if isinstance(ts, str) else None
    except ValueError:
        when = None
    if when is None:
        return now
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when


class Namespace:
    """One namespace of the thread being imported: the channel versions seen (True:
    stored by an earlier checkpoint; False: the source holds no value at it), and each
    channel's last value written, the base of the next one's delta."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: dict[tuple[str, str], bool] = {}
        self.bases: dict[str, Base] = {}

    def new_values(self, values: Values) -> list[BlobWrite]:
        """The values of a checkpoint not stored yet, each a delta of the channel's
        last one where it is that with elements appended (as a put stores them)."""
        written = []
        for channel in sorted(values.stored):
            key = (channel, values.versions[channel])
            if self.seen.get(key):
                continue
            bw = blob_write(channel, key[1], values.dump(channel), self.bases.get(channel))
            self.bases[channel], self.seen[key] = bw.remembered(), True
            written.append(bw)
        return written


Made = tuple[
    SourceCheckpoint, dict[str, Any], Callable[[str], tuple[str, bytes]], set[str], Namespace
]


class Materializer:
    """Source checkpoints made whole: LangGraph ``Checkpoint`` dicts, values checked."""

    def __init__(self, saver: Any, allowed: frozenset[tuple[str, ...]]) -> None:
        self.saver, self.serde, self.allowed = saver, saver.serde, allowed
        self.ns: Namespace | None = None

    def _open(self, kind: Any, data: Any, where: str) -> Any:
        """A value checked, then read through the strict serde."""
        if not isinstance(kind, str) or not isinstance(data, bytes):
            raise SerializationError(f"{where}: no serialized value (type {kind!r})")
        check_value(kind, data, where, self.allowed)
        return self.serde.loads_typed((kind, data))

    async def materialize(self, reader: Reader, page: list[SourceCheckpoint]) -> list[Made]:
        """Each checkpoint of a page with its values (PostgreSQL's as LangGraph stored
        them), the dump of a channel, the channels kept inline, and its namespace."""
        made: list[Made] = []
        for name, group in groupby(page, key=lambda c: c.checkpoint_ns):
            if self.ns is None or self.ns.name != name:
                self.ns = Namespace(name)
            ns, run = self.ns, list(group)
            if reader.kind != "postgresql":
                made += [(c, *self._whole(reader, c), ns) for c in run]
                continue
            wanted = {
                (ch, str(v))
                for c in run
                for ch, v in _versions(c).items()
                if (ch, str(v)) not in ns.seen
            }
            found = await reader.blobs(name, wanted)
            for key in wanted:
                kind, blob = found.get(key, ("empty", None))
                if kind == "empty" or blob is None:
                    ns.seen[key] = False
            old = [c.parent_checkpoint_id for c in run if _before_v4(c) and c.parent_checkpoint_id]
            sends = await reader.sends(old) if old else {}
            made += [(c, *self._joined(reader, c, found, sends), ns) for c in run]
        return made

    def _whole(self, reader: Reader, c: SourceCheckpoint) -> tuple[Any, ...]:
        """SQLite: the checkpoint serialized whole, values inline."""
        kind, data = c.typed or (None, None)
        checkpoint = self._open(kind, data, f"checkpoint {c.checkpoint_id!r}")
        if not (
            isinstance(checkpoint, dict)
            and isinstance(checkpoint.get("channel_values"), dict)
            and isinstance(checkpoint.get("channel_versions"), dict)
        ):
            raise SerializationError(
                f"checkpoint {c.checkpoint_id!r} is not a LangGraph checkpoint"
            )
        return checkpoint, self._dump(checkpoint, {}), set()

    def _joined(
        self,
        reader: Reader,
        c: SourceCheckpoint,
        found: dict[tuple[str, str], tuple[Any, Any]],
        sends: dict[str, list[tuple[Any, Any]]],
    ) -> tuple[Any, ...]:
        """PostgreSQL: the JSON with its stored values (a stored value wins over the
        inline ``true`` of a ``DeltaChannel`` snapshot), as LangGraph's read joins them."""
        body = c.checkpoint
        if not isinstance(body, dict) or not isinstance(body.get("channel_versions", {}), dict):
            raise SerializationError(
                f"checkpoint {c.checkpoint_id!r} is not a LangGraph checkpoint"
            )
        versions = dict(body.get("channel_versions") or {})
        values = dict(body.get("channel_values") or {})
        raws: dict[str, tuple[str, bytes]] = {}
        limits = self.saver._tables.limits
        for ch, v in versions.items():
            key = (ch, str(v))
            kind, blob = found.get(key, (None, None))
            where = f"checkpoint {c.checkpoint_id!r}, channel {ch!r} at {key[1]}"
            if blob is not None and kind != "empty":
                if limits.storable(*key):
                    check_value(kind, bytes(blob), where, self.allowed)
                    raws[ch], values[ch] = (kind, bytes(blob)), _STORED
                else:  # kept inline in its checkpoint: opened, serialized with it
                    values[ch] = self._open(kind, bytes(blob), where)
            elif self.ns is not None and self.ns.seen.get(key):
                values.setdefault(ch, _STORED)
        keep = set()
        parent_sends = sends.get(c.parent_checkpoint_id or "") if _before_v4(c) else None
        if parent_sends:  # LangGraph moves a parent's Sends into the tasks channel
            where = f"checkpoint {c.parent_checkpoint_id!r}: a send"
            values[TASKS] = [self._open(kind, bytes(b), where) for kind, b in parent_sends]
            versions[TASKS] = (
                max(versions.values()) if versions else self.saver.get_next_version(None, None)
            )
            keep.add(TASKS)  # its version is another channel's: no row of its own
        checkpoint = {**body, "channel_versions": versions, "channel_values": values}
        return checkpoint, self._dump(checkpoint, raws), keep

    def _dump(
        self, checkpoint: dict[str, Any], raws: dict[str, tuple[str, bytes]]
    ) -> Callable[[str], tuple[str, bytes]]:
        values = checkpoint["channel_values"]

        def dump(channel: str) -> tuple[str, bytes]:
            if channel in raws:
                return raws[channel]
            if values[channel] is _STORED:  # never asked: it is not written again
                raise AssertionError(f"channel {channel!r} was stored already")
            typed: tuple[str, bytes] = self.saver.dump_value(
                f"channel {channel!r}", values[channel]
            )
            return typed

        return dump

    # -- verification -----------------------------------------------------------------

    def _canon(self, value: Any) -> bytes:
        kind, data = self.serde.dumps_typed(value)
        return f"{kind}:".encode() + bytes(data)

    async def comparable(
        self, reader: Reader, c: SourceCheckpoint, writes: list[SourceWrite]
    ) -> dict[str, Any]:
        """A source checkpoint as LangGraph's saver reads it, in a form to compare."""
        self.ns = None  # every value fetched anew
        [(_, checkpoint, dump, _, _)] = await self.materialize(reader, [c])
        values = {
            ch: self._canon(self.serde.loads_typed(dump(ch)) if v is _STORED else v)
            for ch, v in checkpoint["channel_values"].items()
        }
        opened = [
            (w.task_id, w.channel, self._canon(self._open(w.type, w.value, "a write")))
            for w in writes
        ]
        return _comparable(
            c.checkpoint_id, c.parent_checkpoint_id, c.metadata, checkpoint, values, opened
        )

    def comparable_tuple(self, t: Any) -> dict[str, Any]:
        """A ``CheckpointTuple`` read from tenxstore, in the same form."""
        parent = None if t.parent_config is None else t.parent_config["configurable"]
        values = {ch: self._canon(v) for ch, v in t.checkpoint["channel_values"].items()}
        opened = [(task, ch, self._canon(v)) for task, ch, v in t.pending_writes or ()]
        return _comparable(
            t.config["configurable"]["checkpoint_id"],
            None if parent is None else parent.get("checkpoint_id"),
            t.metadata,
            t.checkpoint,
            values,
            opened,
        )

    @staticmethod
    def difference(expected: dict[str, Any], got: dict[str, Any] | None) -> str:
        """What differs, in words."""
        if got is None:
            return "not found"
        keys = [k for k in expected if expected[k] != got.get(k)]
        fields = expected["checkpoint"], got["checkpoint"]
        if "checkpoint" in keys:
            keys += [f"checkpoint.{k}" for k in fields[0] if fields[0][k] != fields[1].get(k)]
        if "values" in keys:
            keys += [
                f"channel {ch!r}"
                for ch in expected["values"]
                if expected["values"][ch] != got["values"].get(ch)
            ]
        return ", ".join(keys)


def _comparable(
    checkpoint_id: str,
    parent: str | None,
    metadata: Any,
    checkpoint: dict[str, Any],
    values: dict[str, bytes],
    writes: list[tuple[str, str, bytes]],
) -> dict[str, Any]:
    return {
        "id": checkpoint_id,
        "parent": parent or None,
        "metadata": metadata,
        "checkpoint": {k: v for k, v in checkpoint.items() if k != "channel_values"},
        "values": values,
        "writes": sorted(writes),
    }


def _versions(c: SourceCheckpoint) -> dict[str, Any]:
    body = c.checkpoint if isinstance(c.checkpoint, dict) else {}
    versions = body.get("channel_versions")
    return versions if isinstance(versions, dict) else {}


def _before_v4(c: SourceCheckpoint) -> bool:
    """A checkpoint of LangGraph before 0.3 (format 1-3), whose Sends its parent kept."""
    v = c.checkpoint.get("v") if isinstance(c.checkpoint, dict) else None
    return isinstance(v, int) and v < 4


async def digest(rows: AsyncIterator[list[Any]]) -> tuple[int, int]:
    """How many rows, and a digest of them in any order (the sum of their hashes)."""
    count = total = 0
    async for page in rows:
        for row in page:
            values = [None if v == "" and i == 2 else v for i, v in enumerate(row)]
            data = encode(values).encode("utf-8", "surrogatepass")
            total += int.from_bytes(hashlib.blake2b(data, digest_size=16).digest(), "big")
            count += 1
    return count, total % (1 << 128)


def keys_of(store: Any, conn: Any, thread_id: Any, batch: int) -> Iterator[tuple[str, Any]]:
    """The target thread's keys as the source's come: checkpoints ``(namespace, id,
    parent)``, writes ``(namespace, checkpoint, task, index)``."""
    c, w = store.tables.lg_checkpoints, store.tables.lg_writes
    at = (c.c.checkpoint_ns, c.c.checkpoint_id)
    yield "checkpoints", pages(conn, c, thread_id, at, [c.c.parent_checkpoint_id], batch)
    by = (w.c.checkpoint_ns, w.c.checkpoint_id, w.c.task_id, w.c.idx)
    yield "writes", pages(conn, w, thread_id, by, [], batch)
