"""The synchronous face of :class:`~tenxstore.langgraph.TenxCheckpointSaver`: LangGraph's
sync calls, each its async twin run on tenxstore's background event loop.

They work from any thread whose own loop is not running (a plain program, or a worker
thread of an async application); from inside a running loop they raise
``RuntimeError`` (use the async method).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)

from ..loops import LANGGRAPH_LOOP
from .lives import config_life

__all__ = ["SyncSaver"]

_SYNC = LANGGRAPH_LOOP


class SyncSaver(BaseCheckpointSaver[str]):
    """LangGraph's synchronous saver calls, on a background event loop."""

    _tables: Any  # the saver's tables: whose lives a sync call records in the run

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Synchronous :meth:`aget_tuple` (from a thread without a running loop)."""
        found = _SYNC.run(self.aget_tuple(config), "aget_tuple")
        if found is not None:
            config_life(self._tables, found.config, reading=True)
        return found

    def list(  # LangGraph's name
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Synchronous :meth:`alist` (read at once, then iterated)."""

        async def read() -> Sequence[CheckpointTuple]:
            listed = self.alist(config, filter=filter, before=before, limit=limit)
            return [found async for found in listed]

        return iter(_SYNC.run(read(), "alist"))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Synchronous :meth:`aput`."""
        stored = _SYNC.run(self.aput(config, checkpoint, metadata, new_versions), "aput")
        config_life(self._tables, stored, reading=False)
        return stored

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Synchronous :meth:`aput_writes`."""
        _SYNC.run(self.aput_writes(config, writes, task_id, task_path), "aput_writes")

    def delete_thread(self, thread_id: str) -> None:
        """Synchronous :meth:`adelete_thread`."""
        _SYNC.run(self.adelete_thread(thread_id), "adelete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Synchronous :meth:`adelete_for_runs`."""
        _SYNC.run(self.adelete_for_runs(run_ids), "adelete_for_runs")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Synchronous :meth:`acopy_thread`."""
        _SYNC.run(self.acopy_thread(source_thread_id, target_thread_id), "acopy_thread")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Synchronous :meth:`aprune`."""
        _SYNC.run(self.aprune(thread_ids, strategy=strategy), "aprune")

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Synchronous :meth:`aget_delta_channel_history`."""
        work = self.aget_delta_channel_history(config=config, channels=channels)
        return _SYNC.run(work, "aget_delta_channel_history")
