"""``tenxstore export``, ``import`` and ``copy``: threads and memories as JSON Lines, and
from one database to another."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ..errors import SchemaNotReady
from ..validate import masked_url
from .common import (
    DEFAULT_URL,
    AllowType,
    Conflict,
    KeyPrefix,
    OnConflict,
    RedisUrl,
    Schema,
    Url,
    allowed_types,
    cached,
    command,
    err,
    fail,
    out,
    repository,
    with_repository,
)

if TYPE_CHECKING:  # the archive and the backends: imported by the command that runs
    from ..repository import CheckpointRepository


@command
async def export_(
    thread_ids: Annotated[list[str] | None, typer.Argument(help="Threads to export.")] = None,
    output: Annotated[
        str, typer.Option("-o", "--output", help="JSON Lines file ('-': standard output).")
    ] = "-",
    all_threads: Annotated[
        bool, typer.Option("--all", help="Every thread and every memory.")
    ] = False,
    user: Annotated[
        str | None, typer.Option("--user", help="Every thread and memory of this user.")
    ] = None,
    sealed: Annotated[
        bool,
        typer.Option(
            "--sealed",
            help="Keep the export encrypted: each line sealed under the current key of "
            "TENXSTORE_KEYS (import opens it with the same key ring).",
        ),
    ] = False,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
) -> None:
    """Export threads (record, retained states, messages, tool ledger) and long-term
    memories (with their retained versions) as JSON Lines: named threads, a user's
    threads and memories (--user), or everything (--all)."""
    from .. import archive

    if sum((bool(thread_ids), all_threads, user is not None)) != 1:
        fail("name threads to export, or pass --user USER, or --all")
    chosen = thread_ids or None
    if output == "-":
        count = await with_repository(
            url,
            schema,
            lambda repo: archive.write_exports(
                repo, sys.stdout, chosen, sealed=sealed, user_id=user
            ),
        )
        err.print(f"exported {count} line(s)")
        return
    path = Path(output)
    count = await with_repository(
        url,
        schema,
        lambda repo: archive.export_threads(repo, path, chosen, sealed=sealed, user_id=user),
    )
    out.print(f"exported {count} line(s) to {path}")


@command
async def import_(
    path: Annotated[Path, typer.Argument(help="A JSON Lines file written by export.")],
    on_conflict: Conflict = OnConflict.fail,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    redis_url: RedisUrl = None,
    key_prefix: KeyPrefix = None,
    allow_type: AllowType = None,
) -> None:
    """Import threads, all or nothing, then the file's memories, all or nothing;
    importing the same file twice changes nothing."""
    from .. import archive

    allowed = allowed_types(allow_type)
    if not path.is_file():
        fail(f"no such file: {path}")

    async def run(repo: CheckpointRepository) -> Any:
        await repo.asetup()
        async with cached(repo, redis_url, key_prefix) as cp:
            return await archive.import_file(cp, path, on_conflict.value, allowed_types=allowed)

    outcomes = await with_repository(url, schema, run, reads_only=False)
    out.print("imported: " + ", ".join(f"{v} {k}" for k, v in sorted(outcomes.items())))


_SAME_STORE = "the source and the destination are the same store: nothing was copied"


async def _refuse_same_store(source_id: str, destination: CheckpointRepository) -> None:
    """Fail when ``destination`` is the store whose id is ``source_id`` (two URLs of one
    database: another host name, PgBouncer, another path to one file), before any
    write: a copy onto itself would replace every thread with itself."""
    try:
        destination_id = await destination.astore_id()
    except SchemaNotReady:
        return  # never set up, so not the source, which is
    if destination_id == source_id:
        fail(f"{_SAME_STORE} (store id {source_id})")


@command
async def copy(
    source: Annotated[str, typer.Argument(help="Database URL to copy from.")],
    destination: Annotated[str, typer.Argument(help="Database URL to copy to.")],
    source_schema: Annotated[str | None, typer.Option(help="Schema of the source.")] = None,
    destination_schema: Annotated[
        str | None, typer.Option(help="Schema of the destination.")
    ] = None,
    on_conflict: Conflict = OnConflict.fail,
    redis_url: RedisUrl = None,
    key_prefix: KeyPrefix = None,
    allow_type: AllowType = None,
) -> None:
    """Copy every thread and every memory to another database, verifying each;
    resumable. With --redis-url, the destination's cache entries of every copied
    thread are fenced."""
    from .. import archive
    from ..backends import async_url

    allowed = allowed_types(allow_type)
    async_url(destination)  # a bad destination fails before the source is read
    if (source, source_schema) == (destination, destination_schema):
        fail(f"{_SAME_STORE}: both are {masked_url(source)}")
    src_repo = repository(source, source_schema, reads_only=True)
    async with (
        src_repo as src,
        repository(destination, destination_schema) as dst_repo,
        cached(dst_repo, redis_url, key_prefix) as dst,
    ):
        # The source is set up (fail before touching the destination), and the
        # destination is another store, however its URL names it.
        await _refuse_same_store(await src.astore_id(), dst_repo)
        await dst.asetup()
        total = sum([1 async for _ in src.aiter_threads()])
        with Progress(TextColumn("copying"), BarColumn(), MofNCompleteColumn(), console=err) as bar:
            task = bar.add_task("copy", total=total)
            outcomes = await archive.copy_threads(
                src,
                dst,
                on_conflict.value,
                progress=lambda _: bar.advance(task),
                allowed_types=allowed,
            )
        copied = sum([1 async for _ in dst.aiter_threads()])
        memories = await archive.copy_memories(src, dst, on_conflict.value)
    memory_outcomes = ", ".join(f"{v} {k}" for k, v in sorted(memories.items())) or "none"
    out.print(
        "copied: "
        + ", ".join(f"{v} {k}" for k, v in sorted(outcomes.items()))
        + f"; the destination holds {copied} thread(s), every copy verified; "
        + f"memories: {memory_outcomes}"
    )


def register(app: typer.Typer) -> None:
    """Add ``export``, ``import``, ``copy`` to the ``tenxstore`` command."""
    app.command("export")(export_)
    app.command("import")(import_)
    app.command()(copy)
