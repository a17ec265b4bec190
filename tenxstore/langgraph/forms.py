"""The forms a :class:`~tenxstore.langgraph.TenxCheckpointSaver` stores LangGraph's
values in and reads them back from: a checkpoint's blob and values, a task's write rows,
a checkpoint tuple, and a ``DeltaChannel`` history.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..crypto import CHECKPOINT, WRITE, Life, life_of
from ..errors import SerializationError
from ..serde import decode
from .configs import checkpoint_config
from .core import KeyLimits, Values

__all__ = [
    "Dump",
    "Loads",
    "channel_name",
    "checkpoint_tuple",
    "delta_histories",
    "dump_typed",
    "restore_versions",
    "stored_form",
    "write_rows",
]

Dump = Callable[[str, Any], tuple[str, bytes]]
"""A value serialized (``what`` it is, for the error; the value): the saver's ``dump_value``."""
Loads = Callable[[str, bytes, Any, str, Life], Any]
"""A stored value opened and deserialized (type, bytes, thread, column, life): the
saver's ``_loads``."""


def channel_name(channel: Any, *, nul: bool = True) -> None:
    """A channel's name must be text every table can hold: a str without a lone
    surrogate (and, where it is a column of its own, without U+0000)."""
    if not isinstance(channel, str):
        raise SerializationError(f"a channel name must be a str, not {type(channel).__name__}")
    if not nul and "\x00" in channel:
        raise SerializationError(f"channel {channel!r}: a name with U+0000 cannot be stored")
    if not channel.isascii():
        try:
            channel.encode("utf-8")
        except UnicodeEncodeError:
            raise SerializationError(
                f"channel {channel!r}: a name with a lone surrogate is not valid Unicode"
            ) from None


def restore_versions(checkpoint: Checkpoint, versions: str | None) -> None:
    """Put back into a stored checkpoint the channel versions its row's ``versions``
    names (a put leaves them out of the blob); ``""`` marks a value kept inline, whose
    version the blob holds. Rows written before that kept every version in the blob."""
    if versions is None:
        return
    named = {ch: v for ch, v in decode(versions).items() if v != ""}
    checkpoint["channel_versions"] = {**named, **checkpoint["channel_versions"]}


def dump_typed(serde: SerializerProtocol, what: str, value: Any) -> tuple[str, bytes]:
    """LangGraph's serde of a value; one it cannot serialize is ``SerializationError``
    (nothing is written)."""
    try:
        return serde.dumps_typed(value)
    except SerializationError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(f"{what} cannot be serialized: {exc}") from exc


def stored_form(
    limits: KeyLimits,
    dump_value: Dump,
    checkpoint: Checkpoint,
    new_versions: ChannelVersions,
    *,
    dump: Callable[[str], tuple[str, bytes]] | None = None,
    keep_inline: Collection[str] = (),
) -> tuple[tuple[str, bytes], Values]:
    """How a put stores a checkpoint: its serialized blob (without the values
    kept in ``lg_blobs``, nor the versions its row names) and its values.

    ``dump`` serializes a channel's value (default: ``dump_value``, the serde);
    ``keep_inline`` channels stay in the checkpoint whatever their name and version
    (an import uses both: a value read from another saver is kept as it was written).
    """
    channel_values = checkpoint["channel_values"]
    for channel in (*checkpoint["channel_versions"], *channel_values):
        channel_name(channel)
    # The values go to lg_blobs, each version once; the checkpoint names them. A
    # name or version longer than the table's key holds (or with U+0000) stays
    # inline. A None value (a branch channel's, say) stays inline too, named by
    # version "" (no row has it): a row of its own would cost ~125 bytes a version.
    versions = {
        ch: "" if channel_values.get(ch, ...) is None else str(v)
        for ch, v in checkpoint["channel_versions"].items()
        if limits.storable(ch, str(v)) and ch not in keep_inline
    }
    inline = {ch: v for ch, v in channel_values.items() if versions.get(ch, "") == ""}
    # A version the row's ``versions`` names exactly is not stored again in a
    # msgpack blob (restored from it on read; migration 0007 can write it back):
    # ~60 bytes a channel on every checkpoint.
    kept = {
        ch: v
        for ch, v in checkpoint["channel_versions"].items()
        if not (isinstance(v, str) and v != "" and versions.get(ch) == v)
    }
    typed = dump_value(
        "the checkpoint", {**checkpoint, "channel_values": inline, "channel_versions": kept}
    )
    if typed[0] != "msgpack" and len(kept) < len(checkpoint["channel_versions"]):
        typed = dump_value("the checkpoint", {**checkpoint, "channel_values": inline})
    values = Values(
        versions=versions,
        stored=frozenset(ch for ch in channel_values if versions.get(ch, "") != ""),
        new=frozenset(new_versions),
        dump=dump or (lambda channel: dump_value(f"channel {channel!r}", channel_values[channel])),
    )
    return typed, values


def write_rows(
    dump_value: Dump, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
) -> list[dict[str, Any]]:
    """A task's writes as the rows ``lg_writes`` stores (values serialized)."""
    rows = []
    for index, (channel, value) in enumerate(writes):
        channel_name(channel, nul=False)
        type_, blob = dump_value(f"a write to channel {channel!r}", value)
        rows.append(
            {
                "task_id": task_id,
                "idx": WRITES_IDX_MAP.get(channel, index),
                "channel": channel,
                "type": type_,
                "value": blob,
                "task_path": task_path,
            }
        )
    return rows


def checkpoint_tuple(
    serde: SerializerProtocol,
    loads: Loads,
    row: Any,
    writes: list[Any],
    values: Mapping[str, tuple[str, bytes]],
) -> CheckpointTuple:
    """A stored checkpoint (its row, writes and ``lg_blobs`` values) as LangGraph's
    ``CheckpointTuple``."""
    thread, life = row.thread_id, life_of(row)
    checkpoint: Checkpoint = loads(row.type, row.checkpoint, thread, CHECKPOINT, life)
    restore_versions(checkpoint, row.versions)
    if values:  # kept in lg_blobs (a checkpoint written before 0005 has them inline)
        checkpoint["channel_values"] = {
            **checkpoint["channel_values"],
            **{ch: serde.loads_typed(typed) for ch, typed in values.items()},
        }
    config = checkpoint_config(row, row.checkpoint_id)
    parent = None
    if row.parent_checkpoint_id is not None:
        parent = checkpoint_config(row, row.parent_checkpoint_id)
    return CheckpointTuple(
        config=config,
        checkpoint=checkpoint,
        metadata=decode(row.metadata),
        parent_config=parent,
        pending_writes=[
            (w.task_id, w.channel, loads(w.type, w.value, thread, WRITE, life)) for w in writes
        ],
    )


def delta_histories(
    serde: SerializerProtocol,
    loads: Loads,
    thread: Any,
    life: Life | None,
    steps: Sequence[tuple[str, list[Any], dict[str, tuple[str, bytes]], Any]],
    channels: Sequence[str],
) -> dict[str, DeltaChannelHistory]:
    """A history's steps (parent first, as the tables read them) as LangGraph's
    ``DeltaChannelHistory`` per channel: the writes on the path oldest first, and the
    nearest stored value as the seed."""
    collected: dict[str, list[PendingWrite]] = {c: [] for c in channels}
    seeds: dict[str, Any] = {}
    remaining = set(channels)
    for _, writes, values, inline in steps:  # parent first
        if not remaining:
            break
        assert life is not None  # (read with the steps, in the same snapshot)
        for w in reversed(writes):
            if w.channel in remaining:
                collected[w.channel].append(
                    (w.task_id, w.channel, loads(w.type, w.value, thread, WRITE, life))
                )
        held = {ch: serde.loads_typed(typed) for ch, typed in values.items()}
        if inline is not None:  # values kept in the checkpoint itself
            checkpoint = loads(inline.type, inline.checkpoint, thread, CHECKPOINT, life)
            held = {**checkpoint["channel_values"], **held}
        for channel in [c for c in remaining if c in held]:
            seeds[channel] = held[channel]
            remaining.discard(channel)
    result: dict[str, DeltaChannelHistory] = {}
    for channel in channels:
        entry: DeltaChannelHistory = {"writes": list(reversed(collected[channel]))}
        if channel in seeds:
            entry["seed"] = seeds[channel]
        result[channel] = entry
    return result
