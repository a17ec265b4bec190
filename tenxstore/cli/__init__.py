"""``tenxstore``: migrate, check, inspect, export/import, copy and demo, for operators.

Every command that works on one database takes ``--url`` (or
``TENXSTORE_DATABASE_URL``) and ``--schema`` (or ``TENXSTORE_SCHEMA``); ``copy``
takes the two URLs as arguments and a schema option for each. Commands that only
read never create a database: a SQLite file that does not exist is an error. Bad
input — an unreachable database, a missing thread, a malformed file — prints one
line on stderr and exits with status 1.

One module a group of commands; each module's ``register`` adds its commands to
:data:`app` (in :mod:`.common`, with what they share), in the order ``--help``
lists them.
"""

from __future__ import annotations

from ..errors import MissingExtra
from ..extras import require_extra

try:
    require_extra("cli", "typer", "rich", needed_by="the tenxstore command")
except MissingExtra as exc:  # a console script: one line, not a traceback
    raise SystemExit(str(exc)) from None

from . import demo, langgraph, memories, moves, ops, schema, threads
from .common import app

__all__ = ["app", "main"]

for _group in (schema, threads, moves, demo, ops, memories, langgraph):
    _group.register(app)


def main() -> None:
    """Entry point of the ``tenxstore`` console script."""
    app()
