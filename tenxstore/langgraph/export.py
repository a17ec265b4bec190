"""The way back: a thread copied from one LangGraph saver into another —
:class:`~tenxstore.langgraph.TenxCheckpointSaver` into LangGraph's own
``PostgresSaver`` or ``SqliteSaver`` (or any saver into any).

Every checkpoint of every namespace is put oldest first on its parent, with the
channels that changed since the parent as its new versions (so a saver that stores
values once per version, as LangGraph's PostgreSQL saver does, stores each once), and
then its pending writes, each task's in one call as LangGraph made it. From a
tenxstore saver the writes keep their ``task_path`` (the order LangGraph applies them
in); from another saver, whose reads do not give it, they get none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP, BaseCheckpointSaver, CheckpointTuple
from sqlalchemy import select

from .saver import TenxCheckpointSaver

__all__ = ["acopy_langgraph_thread"]


async def _tuples(
    source: BaseCheckpointSaver[Any], thread_id: str
) -> list[tuple[CheckpointTuple, dict[str, str]]]:
    """Every checkpoint of the thread, with its writes' task paths by task."""
    config: Any = {"configurable": {"thread_id": thread_id}}
    found = [t async for t in source.alist(config)]
    if not isinstance(source, TenxCheckpointSaver) or not found:
        return [(t, {}) for t in found]
    # the task paths are in its rows (read after the checkpoints the caller may see)
    store = source.checkpointer.store
    w = store.tables.lg_writes
    thread = source.checkpointer.langgraph.thread_id_of(source.scoped(config))
    rows = await store.read(
        select(w.c.checkpoint_ns, w.c.checkpoint_id, w.c.task_id, w.c.task_path).where(
            w.c.thread_id == thread
        )
    )
    paths: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        paths.setdefault((r.checkpoint_ns, r.checkpoint_id), {})[r.task_id] = r.task_path
    return [
        (t, paths.get((_at(t.config)["checkpoint_ns"], _at(t.config)["checkpoint_id"]), {}))
        for t in found
    ]


async def acopy_langgraph_thread(
    source: BaseCheckpointSaver[Any],
    target: BaseCheckpointSaver[Any],
    thread_id: str,
    *,
    target_thread_id: str | None = None,
) -> int:
    """Copy every checkpoint (every namespace, oldest first) and pending write of a
    thread from ``source`` to ``target``; the number of checkpoints copied.

    A graph compiled with ``target`` then goes on from the thread's head as it would
    have on ``source``. Copying a thread again puts the same checkpoints again.

    Args:
        source: The saver to read (a tenxstore saver bound to the thread's owner, or
            an operator's, under isolation).
        target: The saver to write, LangGraph's ``AsyncPostgresSaver`` or
            ``AsyncSqliteSaver`` say (set up).
        thread_id: The thread to copy.
        target_thread_id: Its id in ``target`` (default: the same).
    """
    into = thread_id if target_thread_id is None else target_thread_id
    found = await _tuples(source, thread_id)
    found.sort(key=lambda f: (_at(f[0].config)["checkpoint_ns"], _at(f[0].config)["checkpoint_id"]))
    versions: dict[tuple[str, str], dict[str, Any]] = {}
    for t, paths in found:
        ns, checkpoint_id = _at(t.config)["checkpoint_ns"], _at(t.config)["checkpoint_id"]
        parent = None if t.parent_config is None else _at(t.parent_config)["checkpoint_id"]
        config: Any = {"configurable": {"thread_id": into, "checkpoint_ns": ns}}
        if parent:
            config["configurable"]["checkpoint_id"] = parent
        before = versions.get((ns, parent or ""), {})
        current = dict(t.checkpoint["channel_versions"])
        new = {ch: v for ch, v in current.items() if before.get(ch) != v}
        stored = await target.aput(config, t.checkpoint, t.metadata, new)
        versions[(ns, checkpoint_id)] = current
        await _put_writes(target, stored, t.pending_writes or [], paths)
    return len(found)


async def _put_writes(
    target: BaseCheckpointSaver[Any],
    config: Any,
    writes: Sequence[tuple[str, str, Any]],
    paths: dict[str, str],
) -> None:
    """A checkpoint's pending writes, a task's in one call (its indexes are their
    order there); the special channels' (errors, interrupts) in a call of their own."""
    tasks: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in writes:
        tasks.setdefault(task_id, []).append((channel, value))
    for task_id, made in tasks.items():
        plain = [w for w in made if w[0] not in WRITES_IDX_MAP]
        special = [w for w in made if w[0] in WRITES_IDX_MAP]
        for group in (plain, special):
            if group:
                await target.aput_writes(config, group, task_id, paths.get(task_id, ""))


def _at(config: Any) -> dict[str, Any]:
    conf: dict[str, Any] = config["configurable"]
    return {"checkpoint_ns": conf.get("checkpoint_ns", ""), **conf}
