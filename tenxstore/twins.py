"""The synchronous API: each public ``a*`` method of a checkpointer has a twin named
without the leading ``a`` (``put_checkpoint``, ``get_state``, ``delete_user``...;
``aimport`` is ``import_``, ``import`` being Python's), with the same arguments and
result, plus ``close()`` and ``with``.

One mechanism makes every twin: :func:`twin` of the protocol's async method runs it on
tenxstore's background event loop (:data:`~tenxstore.loops.SYNC_LOOP`, the one the
LangGraph saver's sync methods use), so one pool of connections serves every sync call
of the process, from any number of threads (a Flask view, a Celery task, a script, a
thread pool). After ``fork`` the child starts a loop of its own at its first sync call,
with connections of its own. Called from a thread whose event loop is running, a twin
raises ``RuntimeError`` naming the async method to await instead (``setup()`` is the
exception: it works there, on a private loop).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from .loops import SYNC_LOOP
from .protocol import Checkpointer
from .types import ThreadInfo

__all__ = ["SyncCheckpointer", "twin"]

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")


def twin(method: Callable[Concatenate[S, P], Awaitable[R]]) -> Callable[Concatenate[S, P], R]:
    """The synchronous twin of the async ``method`` (the protocol's function): same
    parameters and result, run on :data:`~tenxstore.loops.SYNC_LOOP`; the name is
    ``method``'s without its leading ``a``."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        return SYNC_LOOP.run(getattr(self, name)(*args, **kwargs), name)

    call.__name__ = call.__qualname__ = "import_" if name == "aimport" else name[1:]
    call.__doc__ = (
        f"Synchronous :meth:`{name}` (see :mod:`tenxstore.twins`): "
        + (method.__doc__ or "").strip().split("\n", 1)[0]
    )
    call.__dict__["twin_of"] = name
    return cast(Callable[Concatenate[S, P], R], call)


class SyncCheckpointer:
    """The synchronous twins of :class:`~tenxstore.protocol.Checkpointer`'s methods
    (mixed into every checkpointer; see the module)."""

    store_id = twin(Checkpointer.astore_id)
    check = twin(Checkpointer.acheck)
    close = twin(Checkpointer.aclose)
    put_checkpoint = twin(Checkpointer.aput_checkpoint)
    commit = twin(Checkpointer.acommit)
    put_state = twin(Checkpointer.aput_state)
    get_state = twin(Checkpointer.aget_state)
    get_state_cache = twin(Checkpointer.aget_state_cache)
    put_state_cache = twin(Checkpointer.aput_state_cache)
    list_states = twin(Checkpointer.alist_states)
    get_messages = twin(Checkpointer.aget_messages)
    put_thread = twin(Checkpointer.aput_thread)
    get_thread = twin(Checkpointer.aget_thread)
    list_threads = twin(Checkpointer.alist_threads)
    clean_thread = twin(Checkpointer.aclean_thread)
    delete = twin(Checkpointer.adelete)
    begin_tool_execution = twin(Checkpointer.abegin_tool_execution)
    complete_tool_execution = twin(Checkpointer.acomplete_tool_execution)
    fail_tool_execution = twin(Checkpointer.afail_tool_execution)
    get_tool_execution = twin(Checkpointer.aget_tool_execution)
    list_tool_executions = twin(Checkpointer.alist_tool_executions)
    export_thread = twin(Checkpointer.aexport_thread)
    import_thread = twin(Checkpointer.aimport_thread)
    import_threads = twin(Checkpointer.aimport_threads)
    import_ = twin(Checkpointer.aimport)
    import_stream = twin(Checkpointer.aimport_stream)
    delete_user = twin(Checkpointer.adelete_user)
    prune_idle = twin(Checkpointer.aprune_idle)
    stats = twin(Checkpointer.astats)

    def run_tool_once(
        self,
        config: dict[str, Any],
        tool_call_id: str,
        tool_name: str,
        args: dict[str, Any],
        fn: Callable[..., Any],
    ) -> Any:
        """Synchronous :meth:`arun_tool_once`: ``fn`` is a plain function (or a
        coroutine function), run at most once per live claim, in a worker thread of
        the background loop so that other sync calls go on while it runs."""

        async def body(**kwargs: Any) -> Any:
            if asyncio.iscoroutinefunction(fn):
                return await fn(**kwargs)
            return await asyncio.to_thread(fn, **kwargs)

        work = cast(Checkpointer, self).arun_tool_once(config, tool_call_id, tool_name, args, body)
        return SYNC_LOOP.run(work, "arun_tool_once")

    def iter_threads(self, batch: int = 500) -> Iterator[ThreadInfo]:
        """Synchronous :meth:`aiter_threads`: every thread of every user, in
        ``thread_id`` order, read ``batch`` at a time as it is iterated."""
        found = cast(Checkpointer, self).aiter_threads(batch)
        try:
            while True:
                try:
                    thread = SYNC_LOOP.run(_next(found), "aiter_threads")
                except StopAsyncIteration:
                    return
                yield thread
        finally:
            SYNC_LOOP.run(found.aclose(), "aiter_threads")  # type: ignore[attr-defined]

    def __enter__(self: S) -> S:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        SYNC_LOOP.run(cast(Checkpointer, self).aclose(), "aclose")


async def _next(found: Any) -> ThreadInfo:
    thread: ThreadInfo = await found.__anext__()
    return thread
