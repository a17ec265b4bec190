"""``tenxstore import-langgraph``: threads of LangGraph's own savers, brought in."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ..errors import ConfigError
from .common import (
    DEFAULT_URL,
    AllowType,
    Schema,
    Url,
    allowed_types,
    command,
    err,
    out,
    repository,
)

if TYPE_CHECKING:
    from ..langgraph.importer import LangGraphImport

__all__ = ["register"]


class OnConflict(enum.Enum):
    """What the import does with a thread the target holds with other content."""

    error = "error"
    skip = "skip"
    replace = "replace"


Source = Annotated[
    str,
    typer.Argument(
        help="LangGraph's saver database: postgresql://... (PostgresSaver) or a SQLite "
        "file / sqlite:///FILE (SqliteSaver)."
    ),
]
SourceSchema = Annotated[
    str | None, typer.Option(help="The PostgreSQL schema of LangGraph's tables.")
]
UserId = Annotated[
    str | None, typer.Option("--user-id", help="The owner of every imported thread.")
]
UserFromMetadata = Annotated[
    str | None,
    typer.Option(
        "--user-from-metadata",
        help="A checkpoint metadata key naming each thread's owner (a thread naming "
        "none, or several, is refused).",
    ),
]
Shared = Annotated[
    bool,
    typer.Option(
        "--shared",
        help="Threads without an owner, for an application that runs with "
        "enforce_user_isolation=False.",
    ),
]
Conflict = Annotated[
    OnConflict,
    typer.Option(case_sensitive=False, help="For a thread the target holds otherwise."),
]
Threads = Annotated[
    list[str] | None, typer.Option("--thread", help="Only this thread (repeatable).")
]
BatchSize = Annotated[int, typer.Option(help="Rows read from the source at a time.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Count and check owners; write nothing.")]


@command
async def import_langgraph(
    source: Source,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    source_schema: SourceSchema = None,
    user_id: UserId = None,
    user_from_metadata: UserFromMetadata = None,
    shared: Shared = False,
    on_conflict: Conflict = OnConflict.error,
    thread: Threads = None,
    batch_size: BatchSize = 500,
    dry_run: DryRun = False,
    allow_type: AllowType = None,
) -> None:
    """Import the threads of LangGraph's PostgresSaver or SqliteSaver (every namespace's
    checkpoints, pending writes and values), one transaction per thread, each verified;
    run it again after a failure to finish (imported threads are unchanged)."""
    from ..langgraph.importer import aimport_langgraph

    if shared and (user_id is not None or user_from_metadata is not None):
        raise ConfigError("--shared imports threads without an owner: no --user-id with it")
    allowed = allowed_types(allow_type)
    async with repository(url, schema) as repo:
        await repo.asetup()
        with Progress(
            TextColumn("importing" if not dry_run else "checking"),
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
        ) as bar:
            task = bar.add_task("import", total=None)
            done = await aimport_langgraph(
                source,
                repo,
                user_id=user_id,
                user_from_metadata=user_from_metadata,
                on_conflict=on_conflict.value,
                thread_ids=thread or None,
                batch_size=batch_size,
                dry_run=dry_run,
                source_schema=source_schema,
                allowed_types=allowed,
                isolated=not shared,
                progress=lambda _, __: bar.advance(task),
                total=lambda n: bar.update(task, total=n),
            )
    _report(done, dry_run)


def _report(done: LangGraphImport, dry_run: bool) -> None:
    """What an import did (or, ``dry_run``, found), and each thread it refused; exit
    status 1 when it refused any."""
    outcomes = ", ".join(f"{n} {k}" for k, n in sorted(done.outcomes.items())) or "none"
    if dry_run:
        out.print(
            f"{done.source}: {done.threads} thread(s) ({outcomes}), {done.checkpoints} "
            f"checkpoint(s), {done.writes} pending write(s), {done.values} stored value(s); "
            "nothing written"
        )
    else:
        out.print(
            f"imported from {done.source}: {outcomes}; {done.checkpoints} checkpoint(s), "
            f"{done.writes} pending write(s), {done.values} value(s) written; "
            f"{done.verified} thread(s) verified against the source"
        )
    for name, why in done.refused.items():
        err.print(f"refused thread {name!r}: {why}", highlight=False)
    if done.refused:
        err.print(
            f"{len(done.refused)} thread(s) refused, nothing of them written",
            style="red",
            highlight=False,
        )
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``import-langgraph`` to the ``tenxstore`` command."""
    app.command("import-langgraph")(import_langgraph)
