"""The commit path of a state write (:meth:`CheckpointRepository.acommit`): the write
encoded (and sealed) before any I/O, tried in one step where the backend can, and
otherwise made under the thread's lock, which creates the thread or raises the
precise error.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .backends.records import HeadWrite
from .config import RunIds, record_read, recorded_incarnation, recorded_version
from .crypto import META, STATE, Life, life_of
from .errors import StaleStateError
from .serde import encode_state
from .store import Store
from .types import Commit

__all__ = ["commit"]

_Sealed = tuple[str, str | None, list[dict[str, Any]]]


@dataclass
class _Write:
    """One state write, encoded: what the run recorded, and the values as stored."""

    ids: RunIds
    expected: int | None
    expected_life: int | None
    payload: str
    meta_text: str | None
    message_rows: list[dict[str, Any]]
    presumed: Life | None
    sealed: _Sealed
    now: datetime


def _seal_write(
    store: Store,
    thread_id: Any,
    state: str,
    meta: str | None,
    messages: list[dict[str, Any]],
    life: Life,
) -> _Sealed:
    """A state write's state, meta and message rows sealed for the thread's ``life``."""
    return (
        store.seal(state, thread_id, STATE, life),
        None if meta is None else store.seal(meta, thread_id, META, life),
        store.seal_messages(messages, thread_id, life),
    )


def _prepare(
    store: Store,
    config: dict[str, Any],
    state: dict[str, Any],
    messages: Iterable[dict[str, Any]],
    meta: dict[str, Any] | None,
) -> _Write:
    """The write checked and encoded before any I/O (sealed when its life is known)."""
    ids = store.ids(config)
    expected = recorded_version(config)
    expected_life = recorded_incarnation(config)
    payload = encode_state(state)
    meta_text = None if meta is None else store.encode_object(meta, "meta")
    message_rows = store.encode_messages(messages)
    # Sealed values name the thread's life (incarnation and owner). Before any I/O
    # that is known only as the life the run recorded, owned by the caller: sealed
    # for it, the write may commit in one step only in that life (the step's
    # compare-and-swap checks both). Otherwise they are sealed under the lock, for
    # the row found or created there: never for a life they are not stored in.
    presumed = None if expected_life is None else Life(expected_life, ids.user_id)
    sealed: _Sealed = (payload, meta_text, message_rows)  # as stored; the cache gets the plaintext
    if store.keys is not None and presumed is not None:
        sealed = _seal_write(store, ids.thread_id, payload, meta_text, message_rows, presumed)
    now = store.now()
    return _Write(
        ids, expected, expected_life, payload, meta_text, message_rows, presumed, sealed, now
    )


async def _in_one_step(
    store: Store, config: dict[str, Any], write: _Write, history_limit: int
) -> Commit | None:
    """The common case: the head written in one step; None when that cannot be."""
    ids, sealed = write.ids, write.sealed
    head = await store.commit_head(
        HeadWrite(
            ids.thread_id,
            ids.user_id if store.keys is not None or ids.isolated else None,
            store.keys is not None or ids.isolated,
            write.expected,
            write.expected_life,
            sealed[0],
            sealed[1],
            write.now,
            sealed[2],
            history_limit,
        )
    )
    if head is None:
        return None
    record_read(config, head.version, head.incarnation)
    return Commit(ids.thread_id, head.user_id, head.incarnation, head.version, write.payload)


async def _under_lock(
    store: Store, config: dict[str, Any], write: _Write, history_limit: int
) -> Commit:
    """The thread locked, created when absent, checked, and the state written."""
    ids, expected, sealed = write.ids, write.expected, write.sealed
    async with store.write(ids.thread_id) as (conn, locked):
        row = await store.claim_thread(conn, ids, locked, write.now)
        version, life = row.version, row.incarnation
        replaced = write.expected_life is not None and write.expected_life != life
        if expected is not None and (expected != version or replaced):
            raise StaleStateError(ids.thread_id, expected, version, replaced)
        if store.keys is not None and life_of(row) != write.presumed:
            bound = life_of(row)  # the life found, or made, under the lock
            sealed = _seal_write(
                store, ids.thread_id, write.payload, write.meta_text, write.message_rows, bound
            )
        version += 1
        upto = version - history_limit
        await store.backend.write_state(
            conn,
            store.sql,
            {
                "b_thread": ids.thread_id,
                "b_version": version,
                "b_state": sealed[0],
                "b_meta": sealed[1],
                "b_now": write.now,
                "b_upto": upto,
                "messages": sealed[2],
            },
            prune=upto > 0,
        )
    record_read(config, version, life)
    return Commit(ids.thread_id, row.user_id, life, version, write.payload)


async def commit(
    store: Store,
    config: dict[str, Any],
    state: dict[str, Any],
    messages: Iterable[dict[str, Any]],
    meta: dict[str, Any] | None,
    history_limit: int,
) -> Commit:
    """Write a new state version and the messages not yet stored (see
    :meth:`CheckpointRepository.acommit`), keeping ``history_limit`` versions."""
    write = _prepare(store, config, state, messages, meta)
    if store.keys is None or write.presumed is not None:
        done = await _in_one_step(store, config, write, history_limit)
        if done is not None:
            return done
    # The thread is absent, another user's, or not at the version the run read (or
    # this mode has no one-step write): lock it, create it or raise the precise error.
    return await _under_lock(store, config, write, history_limit)
