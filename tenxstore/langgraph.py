"""A LangGraph checkpoint saver backed by any tenxstore checkpointer.

``TenxCheckpointSaver(checkpointer)`` is a ``BaseCheckpointSaver`` for async graphs:
checkpoints, namespaces, parents, channel values, metadata and pending writes live in
tenxstore's ``lg_checkpoints`` and ``lg_writes`` tables (values serialized by
LangGraph's serde), on PostgreSQL, SQLite or in memory, behind the cache or not.

Beyond LangGraph's own savers:

* **one writer per parent**: a checkpoint written from a parent that is no longer the
  namespace's newest checkpoint raises :class:`~tenxstore.StaleStateError`, so two runs
  that resumed from the same checkpoint cannot both commit (they would silently fork
  the thread's history otherwise); writes are serialized by the thread's row lock;
* **bounded history**: ``history_limit`` keeps the newest N checkpoints per namespace.

Needs the ``langgraph`` extra. The synchronous methods are LangGraph's defaults, which
raise ``NotImplementedError``: use the graph's async API (``ainvoke``, ``astream``).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("tenxstore.langgraph needs: pip install 'tenxstore[langgraph]'") from exc

from .errors import ConfigError
from .protocol import Checkpointer
from .serde import decode, encode
from .types import AuthPolicy

__all__ = ["TenxCheckpointSaver"]

_OPERATOR = AuthPolicy(enforce_user_isolation=False)


def _configurable(config: RunnableConfig | None) -> dict[str, Any]:
    return dict((config or {}).get("configurable") or {})


class TenxCheckpointSaver(BaseCheckpointSaver[str]):
    """LangGraph's ``BaseCheckpointSaver`` on tenxstore.

    Args:
        checkpointer: Any tenxstore checkpointer. Its user isolation applies: with
            ``enforce_user_isolation`` on, put ``user_id`` into the run's
            ``configurable``.
        serde: LangGraph serializer (default: LangGraph's ``JsonPlusSerializer``).
        history_limit: Checkpoints kept per thread and namespace (None: all).
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        *,
        serde: SerializerProtocol | None = None,
        history_limit: int | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if history_limit is not None and (
            isinstance(history_limit, bool)
            or not isinstance(history_limit, int)
            or history_limit < 1
        ):
            raise ConfigError(
                f"history_limit must be a positive int or None, not {history_limit!r}"
            )
        self.checkpointer = checkpointer
        self.history_limit = history_limit
        self._tables = checkpointer.langgraph

    # -- versions ----------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """Monotonic string versions, as LangGraph's own savers make them."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- writes ------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint; its parent (``config``'s checkpoint_id) must be the newest.

        Raises:
            StaleStateError: Another writer already committed a checkpoint after the
                parent this one was built on.
        """
        conf = _configurable(config)
        ns = conf.get("checkpoint_ns", "")
        parent = conf.get("checkpoint_id")
        typed = self.serde.dumps_typed(dict(checkpoint))
        meta = encode(get_checkpoint_metadata(config, metadata), "metadata")
        await self._tables.put(
            {"configurable": conf}, ns, checkpoint["id"], parent, typed, meta, self.history_limit
        )
        return {
            "configurable": {
                **{k: v for k, v in conf.items() if k in ("thread_id", "user_id")},
                "thread_id": conf["thread_id"],
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store the writes a task made against the checkpoint in ``config``."""
        conf = _configurable(config)
        rows = []
        for index, (channel, value) in enumerate(writes):
            type_, blob = self.serde.dumps_typed(value)
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
        await self._tables.put_writes(
            {"configurable": conf}, conf.get("checkpoint_ns", ""), conf["checkpoint_id"], rows
        )

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of a thread (and the tenxstore thread)."""
        await self.checkpointer.aclean_thread({"thread_id": thread_id, "auth_policy": _OPERATOR})

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only the newest checkpoint per namespace (``"keep_latest"``), or delete
        every checkpoint (``"delete"``), of each thread."""
        if strategy not in ("keep_latest", "delete"):
            raise ConfigError(f"strategy must be keep_latest or delete, not {strategy!r}")
        await self._tables.prune(thread_ids, keep_latest=strategy == "keep_latest")

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread to another thread id."""
        await self._tables.copy(source_thread_id, target_thread_id)

    # -- reads -------------------------------------------------------------------

    def _tuple(self, row: Any, writes: list[Any]) -> CheckpointTuple:
        checkpoint: Checkpoint = self.serde.loads_typed((row.type, row.checkpoint))
        config: RunnableConfig = {
            "configurable": {
                "thread_id": row.thread_id,
                "checkpoint_ns": row.checkpoint_ns,
                "checkpoint_id": row.checkpoint_id,
            }
        }
        parent: RunnableConfig | None = None
        if row.parent_checkpoint_id is not None:
            parent = {
                "configurable": {
                    "thread_id": row.thread_id,
                    "checkpoint_ns": row.checkpoint_ns,
                    "checkpoint_id": row.parent_checkpoint_id,
                }
            }
        return CheckpointTuple(
            config=config,
            checkpoint=checkpoint,
            metadata=decode(row.metadata),
            parent_config=parent,
            pending_writes=[
                (w.task_id, w.channel, self.serde.loads_typed((w.type, w.value))) for w in writes
            ],
        )

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named in ``config``, or the namespace's newest."""
        conf = _configurable(config)
        rows = await self._tables.rows(
            {"configurable": conf},
            conf.get("checkpoint_ns", ""),
            get_checkpoint_id(config),
            None,
            1,
        )
        return self._tuple(*rows[0]) if rows else None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, by thread, namespace, metadata and ``before``."""
        conf = _configurable(config)
        scope = {"configurable": conf} if conf.get("thread_id") is not None else None
        if scope is None and self.checkpointer.enforce_user_isolation:
            raise ConfigError("listing every thread's checkpoints needs user isolation off")
        rows = await self._tables.rows(
            scope,
            conf.get("checkpoint_ns"),
            conf.get("checkpoint_id"),
            get_checkpoint_id(before) if before else None,
            None if filter else limit,
        )
        count = 0
        for row, writes in rows:
            if filter:
                metadata = decode(row.metadata)
                if any(metadata.get(k) != v for k, v in filter.items()):
                    continue
            yield self._tuple(row, writes)
            count += 1
            if limit is not None and count >= limit:
                return
