"""``tenxstore demo``: a small simulated agent loop on an embedded SQLite file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer
from rich.table import Table

from ..errors import ConfigError
from .common import (
    Schema,
    command,
    out,
)


@command
async def demo(
    path: Annotated[str, typer.Option(help="SQLite file to use.")] = "tenxstore-demo.db",
    url: Annotated[
        str | None, typer.Option(help="A database URL instead of the SQLite file.")
    ] = None,
    schema: Schema = None,
) -> None:
    """Run a small simulated agent loop on an embedded SQLite file (or --url)."""
    from ..demo import run_demo

    if url is None and schema is not None:
        raise ConfigError("--schema goes with --url (a PostgreSQL database)")
    say: Callable[[str], None] = lambda line: out.print(line, highlight=False)  # noqa: E731
    report = await run_demo(path, say=say, url=url, schema=schema)
    table = Table("thread", "head version", "retained versions", "messages")
    for thread, head in report.heads.items():
        table.add_row(
            thread,
            str(head),
            ", ".join(map(str, report.retained[thread])),
            str(report.messages[thread]),
        )
    out.print(table)
    out.print(
        f"{report.steps} steps written, {report.conflicts} conflicts caught and retried, "
        f"email sent {report.emails_sent} time(s) and replayed {report.replays} time(s)"
    )


def register(app: typer.Typer) -> None:
    """Add ``demo`` to the ``tenxstore`` command."""
    app.command()(demo)
