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
import json
import multiprocessing
import subprocess
import sys
from collections.abc import Mapping
from multiprocessing.context import BaseContext

__all__ = ["context", "loaded_packages", "python_output"]

_PRELOAD = ["tenxstore", "sqlalchemy.ext.asyncio", "asyncpg", "aiosqlite"]


@functools.cache
def context() -> BaseContext:
    """The multiprocessing context of the tests' worker processes."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def python_output(code: str, *args: str, env: Mapping[str, str] | None = None) -> str:
    """What a fresh interpreter printed running ``code`` (with ``args`` as sys.argv[1:]),
    which must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=None if env is None else dict(env),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def loaded_packages(
    code: str, packages: tuple[str, ...], *args: str, env: Mapping[str, str] | None = None
) -> list[str]:
    """The packages among ``packages`` a fresh interpreter has loaded (``sys.modules``)
    once it has run ``code``, sorted."""
    probe = (
        f"{code}\nimport json as _json, sys as _sys\n"
        f"print(_json.dumps(sorted({{m.split('.')[0] for m in _sys.modules}} & {set(packages)!r})))"
    )
    found: list[str] = json.loads(python_output(probe, *args, env=env).strip().splitlines()[-1])
    return found
