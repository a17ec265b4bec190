"""One spelling of the public surface: a method passed on under the protocol's own signature.

The :class:`~tenxstore.protocol.Checkpointer` protocol writes each public signature and
its documentation once. A method that only hands the call to a collaborator (the
repository's tool ledger, exports, lifecycle and stats; the cache decorator's wrapped
checkpointer) is not written again: it is :func:`forward` of the protocol's method,
which keeps the protocol's name, signature, annotations and docstring (for ``help()``,
``inspect.signature`` and mypy alike) and calls the method of the same name on the
collaborator, inside the span and error boundary of :func:`~tenxstore.telemetry.traced`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

from .boundary import guard_iter
from .telemetry import traced

__all__ = ["forward", "forward_iter"]

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])
_G = TypeVar("_G", bound=Callable[..., AsyncIterator[Any]])


def forward(method: _F, to: str, *, write: bool = False) -> _F:
    """The protocol's ``method``, done by ``self.<to>``'s method of the same name.

    Args:
        method: The protocol's function (``Checkpointer.aget_thread``): its name,
            signature and docstring are the forward's.
        to: The attribute holding the collaborator (``"ledger"``, ``"inner"``).
        write: A successful call counts as a write (see :func:`traced`).
    """
    name = method.__name__

    @functools.wraps(method)
    async def call(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        return await getattr(getattr(self, to), name)(*args, **kwargs)

    call.__dict__["forwards_to"] = to  # for the façade's parity test

    return cast(_F, traced(write=write)(call))


def forward_iter(method: _G, to: str) -> _G:
    """:func:`forward` for an async iterator method (inside the error boundary)."""
    name = method.__name__

    @functools.wraps(method)
    async def call(self: Any, /, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for item in getattr(getattr(self, to), name)(*args, **kwargs):
            yield item

    call.__dict__["forwards_to"] = to

    return cast(_G, guard_iter(call))
