"""What the cache passes to the wrapped checkpointer as it is.

Thread records, the tool ledger (durable only), iterating and exporting threads: none
of it is cached, so none of it touches Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from .boundary import guard_iter
from .cache_core import CacheCore
from .telemetry import traced
from .types import ThreadExport, ThreadInfo, ToolExecution

__all__ = ["CachePassthrough"]


class CachePassthrough(CacheCore):
    """The calls :class:`~tenxstore.cache.CachedCheckpointer` passes through."""

    # -- threads -----------------------------------------------------------------

    @traced(write=True)
    async def aput_thread(
        self,
        config: dict[str, Any],
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ThreadInfo:
        """Create or update the thread record (no state change, no cache change)."""
        return await self.inner.aput_thread(config, name, metadata)

    @traced()
    async def aget_thread(self, config: dict[str, Any]) -> ThreadInfo | None:
        """The thread record, or None."""
        return await self.inner.aget_thread(config)

    @traced()
    async def alist_threads(
        self, config: dict[str, Any], limit: int | None = 50, offset: int = 0
    ) -> list[ThreadInfo]:
        """The caller's threads, most recently updated first."""
        return await self.inner.alist_threads(config, limit, offset)

    # -- tool ledger: durable only, passed through -------------------------------

    @traced(write=True)
    async def abegin_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, tool_name: str, args: dict[str, Any]
    ) -> ToolExecution:
        """Claim a tool call (see the repository)."""
        return await self.inner.abegin_tool_execution(config, tool_call_id, tool_name, args)

    @traced(write=True)
    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any, *, attempt: int | None = None
    ) -> ToolExecution:
        """Record a tool call's result; the first success wins."""
        return await self.inner.acomplete_tool_execution(
            config, tool_call_id, result, attempt=attempt
        )

    @traced(write=True)
    async def afail_tool_execution(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        error: str | BaseException,
        *,
        attempt: int | None = None,
    ) -> ToolExecution:
        """Record a tool call's failure."""
        return await self.inner.afail_tool_execution(config, tool_call_id, error, attempt=attempt)

    @traced()
    async def aget_tool_execution(
        self, config: dict[str, Any], tool_call_id: str
    ) -> ToolExecution | None:
        """The ledger record of a tool call, or None."""
        return await self.inner.aget_tool_execution(config, tool_call_id)

    @traced(write=True)
    async def arun_tool_once(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        tool_name: str,
        args: dict[str, Any],
        fn: Callable[..., Any],
    ) -> Any:
        """Replay-safe tool call (see the repository)."""
        return await self.inner.arun_tool_once(config, tool_call_id, tool_name, args, fn)

    @traced()
    async def alist_tool_executions(self, config: dict[str, Any]) -> list[ToolExecution]:
        """Every tool call of the thread (see the repository)."""
        return await self.inner.alist_tool_executions(config)

    # -- whole threads: passed through -----------------------------------------

    @guard_iter
    async def aiter_threads(self, batch: int = 500) -> AsyncIterator[ThreadInfo]:
        """Every thread of every user, in ``thread_id`` order."""
        async for info in self.inner.aiter_threads(batch):
            yield info

    @traced()
    async def aexport_thread(self, config: dict[str, Any]) -> ThreadExport | None:
        """Everything stored of one thread (see the repository)."""
        return await self.inner.aexport_thread(config)
