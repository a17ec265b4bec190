"""``arun_tool_once`` on top of the ledger methods, for every checkpointer."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from .errors import SerializationError
from .types import ToolExecution

__all__ = ["run_tool_once"]


class Ledger(Protocol):
    async def abegin_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, tool_name: str, args: dict[str, Any]
    ) -> ToolExecution: ...

    async def acomplete_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, result: Any
    ) -> ToolExecution: ...

    async def afail_tool_execution(
        self, config: dict[str, Any], tool_call_id: str, error: str | BaseException
    ) -> ToolExecution: ...


async def run_tool_once(
    ledger: Ledger,
    config: dict[str, Any],
    tool_call_id: str,
    tool_name: str,
    args: dict[str, Any],
    fn: Callable[..., Any],
) -> Any:
    """Claim, run, record; see ``CheckpointRepository.arun_tool_once``."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    record = await ledger.abegin_tool_execution(config, tool_call_id, tool_name, args)
    if record.status == "succeeded":
        return record.result
    try:
        outcome = fn(**args)
        if inspect.isawaitable(outcome):
            outcome = await outcome
    except Exception as exc:
        await ledger.afail_tool_execution(config, tool_call_id, exc)
        raise
    try:
        done = await ledger.acomplete_tool_execution(config, tool_call_id, outcome)
    except SerializationError as exc:
        await ledger.afail_tool_execution(config, tool_call_id, f"unserializable result: {exc}")
        raise
    return done.result
