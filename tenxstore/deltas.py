"""Channel values stored as what changed: a list that grew is kept as what it gained.

A LangGraph chat's ``messages`` channel gets a new version every step, and each is the
last one with a message or two appended. Stored whole, a thread of N messages holds
O(N²) bytes. Here a new version whose serialized form (LangGraph's serde, msgpack)
is the base version's with elements appended is stored as a *delta*: its own array
header and the appended bytes, with a link to the base. A reader joins the chain
back to the nearest full value.

The comparison is of serialized bytes, not of objects: a delta is written only when
the new value's bytes are exactly the base's elements followed by new ones, checked
byte for byte before it is written, so a reader rebuilds exactly the bytes LangGraph's
serde produced — an edited or removed message, a reordered list, any other type is
stored whole. Chains are bounded (:data:`MAX_DEPTH`, and a new full value once the
deltas since the last one weigh more than it), so a read joins a bounded number of
pieces, in time linear in the value's size.

Format of a delta row: ``value = blob[:splice] + value(base)[skip:] + blob[splice:]``.
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "Base",
    "Bases",
    "BlobWrite",
    "Stored",
    "array_header",
    "blob_write",
    "delta",
    "new_uid",
    "rebuild",
]

MAX_DEPTH = 100
"""Deltas in a row at most before a value is stored whole again: LangGraph's own
``DeltaChannel`` snapshots every 100 updates too. Each whole value of a growing list
is stored again in full, so the bound sets the bytes a long chat keeps (at 48, whole
values took 58% of a 200-turn chat's ``lg_blobs`` files on PostgreSQL), against the pieces
a read of the head joins (at most this many rows, fetched in one statement, each a
step's appended messages). Chains written under another bound read the same."""
_MSGPACK = "msgpack"  # LangGraph's JsonPlusSerializer type of a msgpack value


def new_uid() -> int:
    """A row's random identity (63 bits, never 0: rows written before deltas have 0)."""
    return random.getrandbits(63) or 1


def array_header(data: bytes) -> int | None:
    """The length of a msgpack array's header, or None when ``data`` is no array."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return 1
    if first == 0xDC and len(data) >= 3:
        return 3
    if first == 0xDD and len(data) >= 5:
        return 5
    return None


def delta(base: bytes, new: bytes) -> tuple[bytes, int, int] | None:
    """``(blob, splice, skip)`` storing ``new`` as ``base`` with elements appended, or
    None when it is not that (then store it whole)."""
    skip, splice = array_header(base), array_header(new)
    if skip is None or splice is None:
        return None
    body = len(base) - skip
    if len(new) - splice < body or new[splice : splice + body] != base[skip:]:
        return None
    return new[:splice] + new[splice + body :], splice, skip


@dataclass(frozen=True, slots=True)
class Stored:
    """One ``lg_blobs`` row as read: a whole value (``base`` None) or a delta."""

    type: str
    blob: bytes
    base: str | None = None
    splice: int | None = None
    skip: int | None = None
    uid: int = 0


class BrokenChain(LookupError):
    """A delta's base is not stored (a bug or a damaged database: never by design)."""


def rebuild(rows: Mapping[str, Stored], version: str) -> tuple[str, bytes, int, int]:
    """The value at ``version`` from its chain in ``rows`` (``{version: Stored}`` of
    one channel): ``(type, bytes, depth, tail bytes since the last whole value)``.

    Raises:
        BrokenChain: A base on the chain is missing.
    """
    chain: list[Stored] = []
    at = version
    while True:
        row = rows.get(at)
        if row is None:
            raise BrokenChain(f"version {at!r} of the chain to {version!r} is not stored")
        chain.append(row)
        if row.base is None:
            break
        if len(chain) > 4 * MAX_DEPTH:
            raise BrokenChain(f"the chain to {version!r} does not end")
        at = row.base
    root = chain[-1]
    if len(chain) == 1:
        return root.type, root.blob, 0, 0
    # value = join(pieces); each delta drops the first ``skip`` bytes (the previous
    # array header, usually all of pieces[0]) and adds its header and its tail.
    pieces: list[bytes | memoryview] = [memoryview(root.blob)]
    tails = 0
    for row in reversed(chain[:-1]):
        splice, skip = row.splice or 0, row.skip or 0
        if skip > len(pieces[0]):  # not the usual shape: join what there is first
            pieces = [memoryview(b"".join(pieces))]
        pieces[0] = pieces[0][skip:]
        pieces.insert(0, row.blob[:splice])
        pieces.append(row.blob[splice:])
        tails += len(row.blob)
    return root.type, b"".join(pieces), len(chain) - 1, tails


@dataclass(frozen=True, slots=True)
class Base:
    """The last value a process wrote or read of one channel: what the next version
    may be stored as a delta of (if the row is still there, with this ``uid``)."""

    version: str
    uid: int
    type: str
    value: bytes
    depth: int
    tails: int


@dataclass(frozen=True, slots=True)
class BlobWrite:
    """One value to store: ``blob`` is the whole value, or a delta of ``base`` (then
    ``whole`` is the whole value, written instead when that base is gone)."""

    channel: str
    version: str
    type: str
    blob: bytes
    uid: int
    whole: bytes
    base: Base | None = None
    splice: int | None = None
    skip: int | None = None

    def as_whole(self) -> BlobWrite:
        """This value stored whole."""
        return BlobWrite(self.channel, self.version, self.type, self.whole, self.uid, self.whole)

    def remembered(self) -> Base:
        """What the next version of the channel may be a delta of."""
        if self.base is None:
            return Base(self.version, self.uid, self.type, self.whole, 0, 0)
        depth, tails = self.base.depth + 1, self.base.tails + len(self.blob)
        return Base(self.version, self.uid, self.type, self.whole, depth, tails)


def blob_write(
    channel: str, version: str, typed: tuple[str, bytes], base: Base | None
) -> BlobWrite:
    """How to store a channel's new value: as a delta of ``base`` when it is that
    base with elements appended and the chain is short enough, else whole."""
    kind, whole = typed
    uid = new_uid()
    if (
        base is not None
        and kind == _MSGPACK
        and base.type == _MSGPACK
        and base.depth < MAX_DEPTH
        and base.version != version
    ):
        found = delta(base.value, whole)
        if found is not None:
            blob, splice, skip = found
            if base.tails + len(blob) <= len(whole):  # else a whole value costs less
                return BlobWrite(channel, version, kind, blob, uid, whole, base, splice, skip)
    return BlobWrite(channel, version, kind, whole, uid, whole)


class Bases:
    """Per (thread, namespace, channel), the last value this process wrote or read:
    bounded in entries and in bytes, least recently used first out. Safe to share
    between threads (the synchronous API runs on a loop of its own)."""

    def __init__(self, max_entries: int = 4096, max_bytes: int = 64 << 20) -> None:
        self._entries: OrderedDict[tuple[Any, str, str], Base] = OrderedDict()
        self._spaces: dict[tuple[Any, str], set[str]] = {}  # (thread, ns): its channels
        self._bytes = 0
        self._max_entries, self._max_bytes = max_entries, max_bytes
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, str, str]) -> Base | None:
        """The remembered value of a channel, or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def held(self, thread_id: Any, ns: str) -> dict[str, Base]:
        """The remembered values of a thread's namespace, ``{channel: Base}`` (a copy:
        what a read asked the database about, whatever is remembered meanwhile)."""
        with self._lock:
            channels = self._spaces.get((thread_id, ns), ())
            return {ch: self._entries[(thread_id, ns, ch)] for ch in channels}

    def put(self, key: tuple[Any, str, str], base: Base) -> None:
        """Remember a channel's value (one too large for the budget is not kept)."""
        with self._lock:
            self._drop(key)
            if len(base.value) > self._max_bytes // 4:
                return
            self._entries[key] = base
            self._spaces.setdefault((key[0], key[1]), set()).add(key[2])
            self._bytes += len(base.value)
            while self._entries and (
                len(self._entries) > self._max_entries or self._bytes > self._max_bytes
            ):
                self._drop(next(iter(self._entries)))

    def forget(self, match: Callable[[tuple[Any, str, str]], bool]) -> None:
        """Drop the entries whose key matches (a thread deleted, copied over...)."""
        with self._lock:
            for key in [k for k in self._entries if match(k)]:
                self._drop(key)

    def _drop(self, key: tuple[Any, str, str]) -> None:
        """Forget one entry, if remembered (the lock is held)."""
        old = self._entries.pop(key, None)
        if old is None:
            return
        self._bytes -= len(old.value)
        space = (key[0], key[1])
        channels = self._spaces.get(space)
        if channels is not None:
            channels.discard(key[2])
            if not channels:
                del self._spaces[space]
