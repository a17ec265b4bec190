"""A memory's put and get in one step, where the backend has a path for them
(:meth:`~tenxstore.backends.base.Backend.memory_fast_path`: ONE statement on
PostgreSQL, one thread hop on a SQLite file).

A put commits only the common cases — a new memory, or the next version of a live one
— or writes nothing and says so (see :class:`~tenxstore.backends.records.MemoryPut`);
the locked path of :mod:`.writes` then does the work. Its values are checked, encoded
and sealed before it is sent, as the locked path's are. Sealed values are bound to the
memory's ``uid``: a new memory's is made here, and the next version of one whose uid
the first attempt did not know is sealed for the uid it reported, and sent again.
"""

from __future__ import annotations

import secrets
import uuid
from typing import TYPE_CHECKING, Any

from ..backends.records import MemoryPut
from ..crypto import MEMORY_CONTENT, MEMORY_METADATA
from ..types import Memory
from .rows import Written

if TYPE_CHECKING:
    from .store import MemoryStore

__all__ = ["get", "put", "ready"]


def ready(store: MemoryStore) -> bool:
    """Whether the store's backend has a one-step path, to be taken now."""
    path = store.fast
    return path is not None and path.available


async def get(store: MemoryStore, owner: Any, ns: str, name: str) -> Memory | None:
    """``aget`` in one step (only when :func:`ready`): the memory, or None."""
    path = store.fast
    assert path is not None
    base = store.base
    if base.store_id is None:
        await base.ensure_ready()
    found = await path.get(owner, ns, name, base.now())
    return None if found is None else store.rows.memory(found)


async def put(
    store: MemoryStore, owner: Any, ns: str, name: str, new: Written, blob: bytes | None
) -> Memory | None:
    """``astore`` in one step: the memory as stored, or None when nothing was written
    (the locked path must do the work)."""
    path = store.fast
    if path is None or not path.available:
        return None
    base, rows = store.base, store.rows
    await base.ensure_writable()  # refused before any write, as the locked path is
    assert new.content is not None and new.metadata is not None
    vectors = store.vectors
    model = dims = vector_type = None
    if blob is not None:
        assert vectors is not None
        model, dims = vectors.model_id, vectors.dims
        vector_type = None if vectors.pg is None else vectors.pg.vector_type()

    def sealed(uid: str) -> tuple[str, str]:
        assert new.content is not None and new.metadata is not None
        return rows.seal(new.content, uid, MEMORY_CONTENT), rows.seal(
            new.metadata, uid, MEMORY_METADATA
        )

    uid, make = uuid.uuid4().hex, True
    for _ in range(2):
        content, metadata = sealed(uid)
        outcome = await path.put(
            MemoryPut(
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
        )
        if outcome.written is not None:
            return rows.memory(outcome.written)
        if outcome.uid is None:
            return None
        uid, make = outcome.uid, False  # sealed for the live memory there, then sent again
    return None
