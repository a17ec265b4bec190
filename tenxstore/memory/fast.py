"""A memory's put and get in one step, where the backend has a path for them
(:meth:`~tenxstore.backends.base.Backend.memory_fast_path`: ONE statement on
PostgreSQL, one thread hop on a SQLite file).

A put commits only the common cases — a new memory, or the next version of a live one
— or writes nothing and says so (see :class:`~tenxstore.backends.records.MemoryPut`);
the locked path of :mod:`.writes` then does the work. Its values are checked, encoded
and sealed before it is sent, as the locked path's are. Sealed values are bound to the
memory's ``uid``: a new memory's is made here; the next version of one is sealed for
its uid where the path reads it (SQLite's, under the write lock), or else for the uid
the first attempt reported, and sent again (PostgreSQL: a second statement).
"""

from __future__ import annotations

import secrets
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..backends.records import MemoryFastPath, MemoryPut
from ..crypto import MEMORY_CONTENT, MEMORY_METADATA
from ..types import Memory
from .rows import Written

if TYPE_CHECKING:
    from .store import MemoryStore

__all__ = ["OneStep", "get", "put", "ready"]


class OneStep:
    """A backend's one-step path (:class:`~tenxstore.backends.records.MemoryFastPath`)
    and, for a store that seals, the uid of each memory it last wrote or read here: a
    next version sealed for it is one statement, not two (a uid that is no longer the
    memory's writes nothing, and the put goes on as without it). At most
    :attr:`REMEMBERED` uids, the least recent forgotten."""

    REMEMBERED = 4096

    def __init__(self, path: MemoryFastPath, sealed: bool) -> None:
        self.path, self.sealed = path, sealed
        self._uids: OrderedDict[tuple[Any, str, str], str] = OrderedDict()
        self._lock = threading.Lock()  # the sync twins may share a store across threads

    @property
    def available(self) -> bool:
        """Whether the path may be taken now."""
        return self.path.available

    def uid(self, memory: tuple[Any, str, str]) -> str | None:
        """The uid last seen of the memory (user, namespace, key), or None."""
        with self._lock:
            return self._uids.get(memory)

    def seen(self, memory: tuple[Any, str, str], uid: str) -> None:
        """The memory has this uid (remembered only where values are sealed)."""
        if not self.sealed:
            return
        with self._lock:
            self._uids[memory] = uid
            self._uids.move_to_end(memory)
            if len(self._uids) > self.REMEMBERED:
                self._uids.popitem(last=False)


def ready(store: MemoryStore) -> bool:
    """Whether the store's backend has a one-step path, to be taken now."""
    one = store.fast
    return one is not None and one.available


async def get(store: MemoryStore, owner: Any, ns: str, name: str) -> Memory | None:
    """``aget`` in one step (only when :func:`ready`): the memory, or None."""
    one = store.fast
    assert one is not None
    base = store.base
    if base.store_id is None:
        await base.ensure_ready()
    found = await one.path.get(owner, ns, name, base.now())
    if found is None:
        return None
    one.seen((owner, ns, name), found.uid)
    return store.rows.memory(found)


async def put(
    store: MemoryStore, owner: Any, ns: str, name: str, new: Written, blob: bytes | None
) -> Memory | None:
    """``astore`` in one step: the memory as stored, or None when nothing was written
    (the locked path must do the work).

    A first attempt seals for the uid last seen of the memory (then it may only write
    its next version) or a new one (then it may make it too). Written: done. Else a
    live memory of another uid is sealed for and sent again; a remembered uid that
    found no memory is tried as a new one; anything else is the locked path's.
    """
    one = store.fast
    # with a vector index, the locked path: it reports the revision it moved from
    if one is None or not one.available or store.vector_index is not None:
        return None
    await store.base.ensure_writable()  # refused before any write, as the locked path is
    put_for = _prepared(store, owner, ns, name, new, blob)
    memory = (owner, ns, name)
    known = one.uid(memory)
    uid, make = (uuid.uuid4().hex, True) if known is None else (known, False)
    for _ in range(2):
        outcome = await one.path.put(put_for(uid, make))
        if outcome.written is not None:
            one.seen(memory, outcome.written.uid)
            return store.rows.memory(outcome.written)
        if outcome.uid is not None:  # sealed for the live memory there, and sent again
            uid, make = outcome.uid, False
        elif not make:  # the uid remembered found no live memory: as a new one
            uid, make = uuid.uuid4().hex, True
        else:
            return None
    return None


def _prepared(
    store: MemoryStore, owner: Any, ns: str, name: str, new: Written, blob: bytes | None
) -> Callable[[str, bool], MemoryPut]:
    """The put's values, sealed for a given uid (and whether it may make the memory)."""
    base, rows = store.base, store.rows
    text, meta = new.content, new.metadata
    assert text is not None and meta is not None  # a put writes both
    vectors = store.vectors
    model = dims = vector_type = None
    if blob is not None:
        assert vectors is not None
        model, dims = vectors.model_id, vectors.dims
        vector_type = None if vectors.pg is None else vectors.pg.vector_type()

    def sealed(uid: str) -> tuple[str, str]:
        return rows.seal(text, uid, MEMORY_CONTENT), rows.seal(meta, uid, MEMORY_METADATA)

    def put_for(uid: str, make: bool) -> MemoryPut:
        content, metadata = sealed(uid)
        return MemoryPut(
            user_id=owner,
            namespace=ns,
            key=name,
            uid=uid,
            make=make,
            sealed=base.keys is not None,
            content=content,
            metadata=metadata,
            terms=new.terms,
            now=new.now,
            expires_at=new.expires_at,
            history_limit=store.memory_history_limit,
            revision=secrets.randbits(62),  # as MemoryRows.bump stamps one
            vector=blob,
            model_id=model,
            dims=dims,
            vector_type=vector_type,
            reseal=sealed if base.keys is not None else None,
        )

    return put_for
