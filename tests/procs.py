"""Worker processes for the tests that prove what holds across OS processes.

A ``spawn`` child is a fresh interpreter that imports tenxstore, SQLAlchemy and the
test module again (~1 s each on two cores: four of them cost a test 4 s before it did
anything). A ``forkserver`` child is forked from a server that imported them once per
test process: it starts in milliseconds, and it is still a process of its own — its
own interpreter state, connections and event loop, nothing inherited from the test's
running loop or pools (the server never ran one).
"""

from __future__ import annotations

import functools
import multiprocessing
from multiprocessing.context import BaseContext

__all__ = ["context"]

_PRELOAD = ["tenxstore", "sqlalchemy.ext.asyncio", "asyncpg", "aiosqlite"]


@functools.cache
def context() -> BaseContext:
    """The multiprocessing context of the tests' worker processes."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx
