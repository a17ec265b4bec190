"""Replay-safe tools inside LangGraph graphs: ``ReplaySafeToolNode``.

LangGraph's ``ToolNode`` runs every tool call it is given. A graph resumed after a
crash between a tool's side effect and the checkpoint, a node retried, a time-travel
replay from a checkpoint before the tools, or a second worker running the same thread
all run the call again: the card is charged twice. ``ReplaySafeToolNode`` is that node
with every call run through tenxstore's tool ledger (``arun_tool_once``), keyed by the
call's ``tool_call_id`` in the run's thread, for the run's user:

* a call that already succeeded returns what it returned then (the ``ToolMessage``, or
  the ``Command``, as LangGraph's serde stored it) and the tool does not run;
* a call another worker holds a live claim on is waited for (``wait_timeout``), then
  ``ToolExecutionInProgress``;
* a call that raised, or that ``handle_tool_errors`` turned into an error
  ``ToolMessage``, is recorded as failed: the next run of it runs the tool again;
* the ledger's semantics hold: at most once while a claim is live, at least once
  across expired leases (``tool_lease_seconds``): make long tools idempotent at their
  destination or give them a longer lease.

Tool call ids come from the model and must be unique within a thread (every
provider's are); an id reused with another tool or other arguments is
``ToolExecutionMismatch``, never a stored answer to another question.

Needs ``langgraph`` (its ``langgraph.prebuilt``), not only ``langgraph-checkpoint``.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "ReplaySafeToolNode needs LangGraph's prebuilt nodes: pip install langgraph"
    ) from exc

from ..config import INCARNATION_KEY
from ..errors import ConfigError, ToolExecutionInProgress
from ..loops import LANGGRAPH_LOOP
from ..protocol import Checkpointer
from ..types import AuthPolicy
from .saver import TenxCheckpointSaver, run_life

__all__ = ["ReplaySafeToolNode"]

_OUTPUT = "langgraph_output"
"""The key of a stored result that holds the node's output, as LangGraph's serde
wrote it (``[type, base64 bytes]``)."""
_FIRST_POLL, _LONGEST_POLL = 0.01, 0.5


class _Handled(Exception):
    """A tool error that ``handle_tool_errors`` turned into a message: the call failed
    (recorded, so the next run runs it again), and the message is the node's output."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(f"the tool failed: {message.content!s:.200}")
        self.message = message


class ReplaySafeToolNode(ToolNode):
    """LangGraph's ``ToolNode`` whose every tool call runs once, through the ledger.

    Same inputs, same outputs (``ToolMessage``\\ s, or the ``Command`` a tool returns),
    same error handling options as ``ToolNode``; sync and async graphs.

    Args:
        tools: The tools, as ``ToolNode`` takes them.
        checkpointer: A tenxstore checkpointer, or a
            :class:`~tenxstore.langgraph.TenxCheckpointSaver` (its checkpointer, its
            bound user and its ``auth_policy`` are used, and its serde stores outputs).
        wait_timeout: Seconds to wait for a call another worker is running before
            raising ``ToolExecutionInProgress`` (0: do not wait).
        name: The node's name.
        tags: The node's tags.
        handle_tool_errors: As ``ToolNode``'s; a handled error is recorded as a
            failure (the next run tries again), and its message is the output.
        messages_key: The state key holding the messages.
        wrap_tool_call: A wrapper of your own, as ``ToolNode`` takes it: it runs
            around the ledger (a retry it makes is a new run of the call).
        awrap_tool_call: Its async form.

    Raises:
        ConfigError: ``checkpointer`` is not a tenxstore checkpointer or saver, or
            ``wait_timeout`` is not a number of seconds >= 0.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        checkpointer: Any,
        *,
        wait_timeout: float = 30.0,
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: Any = None,
        messages_key: str = "messages",
        wrap_tool_call: Callable[..., Any] | None = None,
        awrap_tool_call: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        owner, user_id, policy, serde = _owner_of(checkpointer)
        # Given the graph's saver, a call is made only in the life of the thread the
        # run read: a run that read a thread erased since writes nothing.
        self._check_life = serde is not None
        if (
            isinstance(wait_timeout, bool)
            or not isinstance(wait_timeout, (int, float))
            or not wait_timeout >= 0
        ):
            raise ConfigError(f"wait_timeout must be seconds >= 0, not {wait_timeout!r}")
        self.checkpointer: Checkpointer = owner
        self.wait_timeout = float(wait_timeout)
        self._user_id, self._policy = user_id, policy
        self._serde: SerializerProtocol = serde or JsonPlusSerializer(allowed_msgpack_modules=None)
        self._outer_sync, self._outer_async = wrap_tool_call, awrap_tool_call
        options: dict[str, Any] = {}
        if handle_tool_errors is not None:
            options["handle_tool_errors"] = handle_tool_errors
        super().__init__(
            tools,
            name=name,
            tags=tags,
            messages_key=messages_key,
            wrap_tool_call=self._wrap,
            awrap_tool_call=self._awrap,
            **options,
        )

    # -- the wrappers ToolNode calls ---------------------------------------------

    async def _awrap(self, request: ToolCallRequest, execute: Callable[..., Any]) -> Any:
        async def once(req: ToolCallRequest) -> Any:
            async def body() -> Any:
                return await execute(req)

            return await self._once(req, body)

        if self._outer_async is not None:
            return await self._outer_async(request, once)
        if self._outer_sync is not None:  # ToolNode's own rule: a sync wrapper, sync calls
            return self._outer_sync(request, self._once_sync_of(execute))
        return await once(request)

    def _wrap(self, request: ToolCallRequest, execute: Callable[..., Any]) -> Any:
        once = self._once_sync_of(execute)
        if self._outer_sync is not None:
            return self._outer_sync(request, once)
        return once(request)

    def _once_sync_of(self, execute: Callable[..., Any]) -> Callable[[ToolCallRequest], Any]:
        """The ledger around a sync ``execute``: the ledger's calls run on tenxstore's
        background loop, the tool in this thread's context (in a worker thread, so the
        loop serves other calls meanwhile)."""

        def once(req: ToolCallRequest) -> Any:
            context = contextvars.copy_context()

            async def body() -> Any:
                return await asyncio.to_thread(context.run, execute, req)

            return LANGGRAPH_LOOP.run(self._once(req, body), "ainvoke")

        return once

    # -- the ledger ----------------------------------------------------------------

    async def _once(self, request: ToolCallRequest, body: Callable[[], Awaitable[Any]]) -> Any:
        """Run one tool call through the ledger (see the module's docstring)."""
        call = request.tool_call
        if request.tool is None:  # not one of ours: ToolNode's own error, nothing to run
            return await body()
        call_id = call.get("id")
        if not call_id:
            raise ConfigError(
                f"tool call of {call['name']!r} has no id: the ledger keys a call by its id"
            )
        config = self._ledger_config(request)
        if self._check_life:
            self._in_its_life(config)

        async def run(**_args: Any) -> Any:  # the ledger passes the call's arguments
            output = await body()
            if isinstance(output, ToolMessage) and output.status == "error":
                raise _Handled(output)
            return self._stored(output)

        deadline = time.monotonic() + self.wait_timeout
        pause = _FIRST_POLL
        while True:
            try:
                stored = await self.checkpointer.arun_tool_once(
                    config, call_id, call["name"], dict(call["args"]), run
                )
            except _Handled as handled:
                return handled.message
            except ToolExecutionInProgress:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(pause, left))  # polling the ledger for its outcome
                pause = min(pause * 2, _LONGEST_POLL)
                continue
            return self._loaded(stored, call_id, call["name"])

    def _ledger_config(self, request: ToolCallRequest) -> dict[str, Any]:
        """The ledger's run config: the run's thread and user (the saver's bound user
        and policy where the run gives none), and the life of the thread the run read."""
        runtime = request.runtime
        run_config = getattr(runtime, "config", None) or {}
        conf = run_config.get("configurable") or {}
        if not isinstance(conf, Mapping):
            raise ConfigError("the run's config['configurable'] must be a dict")
        config: dict[str, Any] = {"thread_id": conf.get("thread_id")}
        user = conf.get("user_id", self._user_id)
        if self._user_id is not None and user != self._user_id:
            raise ConfigError(f"this node acts for user {self._user_id!r}; the run names {user!r}")
        if user is not None:
            config["user_id"] = user
        policy = conf.get("auth_policy", self._policy)
        if policy is not None:
            config["auth_policy"] = policy
        if conf.get(INCARNATION_KEY) is not None:  # a claim on another life is refused
            config[INCARNATION_KEY] = conf[INCARNATION_KEY]
        return config

    def _in_its_life(self, config: dict[str, Any]) -> None:
        """Record in ``config`` the life of the thread this run read or wrote through
        the saver: the ledger then refuses a claim once the thread was deleted or
        replaced (StaleStateError; an erased thread is never brought back)."""
        if INCARNATION_KEY in config:
            return
        life = run_life(self.checkpointer, config["thread_id"])
        if life is not None:
            config[INCARNATION_KEY] = life

    def _stored(self, output: Any) -> dict[str, Any]:
        """A node output as the ledger stores it: LangGraph's serde of it, and the
        message's content in the clear JSON for operators (``tenxstore show``)."""
        kind, data = self._serde.dumps_typed(output)
        stored: dict[str, Any] = {_OUTPUT: [kind, base64.b64encode(data).decode("ascii")]}
        if isinstance(output, ToolMessage) and isinstance(output.content, str):
            stored["content"] = output.content
        return stored

    def _loaded(self, stored: Any, call_id: str, name: str) -> Any:
        """The node output a stored result holds (a result stored by other code that
        used the same call id: its JSON as the message's content)."""
        if isinstance(stored, Mapping) and isinstance(stored.get(_OUTPUT), list):
            kind, data = stored[_OUTPUT]
            return self._serde.loads_typed((kind, base64.b64decode(data)))
        return ToolMessage(content=str(stored), name=name, tool_call_id=call_id)


def _owner_of(
    checkpointer: Any,
) -> tuple[Checkpointer, Any, AuthPolicy | None, SerializerProtocol | None]:
    """(the tenxstore checkpointer, bound user, policy, serde) of a checkpointer or of a
    ``TenxCheckpointSaver``."""
    if isinstance(checkpointer, TenxCheckpointSaver):
        return (
            checkpointer.checkpointer,
            checkpointer.user_id,
            checkpointer.auth_policy,
            checkpointer.serde,
        )
    if not callable(getattr(checkpointer, "arun_tool_once", None)):
        raise ConfigError(
            "checkpointer must be a tenxstore checkpointer or a TenxCheckpointSaver, not "
            f"{type(checkpointer).__name__}"
        )
    return checkpointer, None, None, None
