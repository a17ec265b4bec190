"""``tenxstore``: migrate, inspect, export/import, copy and demo, for operators.

Every command takes ``--url`` (or ``TENXSTORE_DATABASE_URL``) and ``--schema`` (or
``TENXSTORE_SCHEMA``). Bad input — an unreachable database, a missing thread, a
malformed file — prints one line on stderr and exits with status 1.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

try:
    import typer
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Table
except ImportError as exc:  # pragma: no cover - the message is the point
    raise SystemExit("the tenxstore command needs its extra: pip install 'tenxstore[cli]'") from exc

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from . import archive, migrate
from .errors import TenxStoreError
from .repository import CheckpointRepository
from .serde import encode
from .types import AuthPolicy

__all__ = ["app", "main"]

T = TypeVar("T")
DEFAULT_URL = "sqlite:///tenxstore.db"
app = typer.Typer(
    help="Inspect and move tenxstore databases.", no_args_is_help=True, add_completion=False
)
out = Console(soft_wrap=True)  # lines stay whole when piped; tables still fit
err = Console(stderr=True)

Url = Annotated[str, typer.Option("--url", envvar="TENXSTORE_DATABASE_URL", help="Database URL.")]
Schema = Annotated[
    str | None, typer.Option("--schema", envvar="TENXSTORE_SCHEMA", help="PostgreSQL schema.")
]
User = Annotated[str | None, typer.Option("--user", help="Owner (omit to see every user's).")]


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)  # one plain line: rich would wrap it
    raise typer.Exit(1)


def command(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async command; expected failures become one line on stderr."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            asyncio.run(fn(*args, **kwargs))
        except typer.Exit:
            raise
        except (TenxStoreError, ValueError, OSError) as exc:
            _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except DBAPIError as exc:
            _fail(f"database error: {str(exc.orig).splitlines()[0] if exc.orig else exc}")
        except SQLAlchemyError as exc:
            _fail(f"database error: {str(exc).splitlines()[0]}")

    return run


def _repo(url: str, schema: str | None) -> CheckpointRepository:
    return CheckpointRepository(url, schema=schema, enforce_user_isolation=False)


def _scope(user: str | None) -> dict[str, Any]:
    """Every user's threads, or only ``user``'s (isolation applies to that call)."""
    if user is None:
        return dict(archive.OPERATOR)
    return {"user_id": user, "auth_policy": AuthPolicy(enforce_user_isolation=True)}


def _config(thread: str, user: str | None) -> dict[str, Any]:
    return {"thread_id": thread, **_scope(user)}


async def _with(
    url: str, schema: str | None, work: Callable[[CheckpointRepository], Awaitable[T]]
) -> T:
    async with _repo(url, schema) as repo:
        return await work(repo)


@app.command()
@command
async def upgrade(url: Url = DEFAULT_URL, schema: Schema = None) -> None:
    """Migrate the database to the newest schema (creating it when absent)."""
    await _with(url, schema, lambda repo: repo.asetup())
    out.print(f"[green]at head[/] ({migrate.head_revision()})")


@app.command()
@command
async def current(url: Url = DEFAULT_URL, schema: Schema = None) -> None:
    """Show the database's schema revision and the newest one."""
    revision = await _with(url, schema, lambda repo: migrate.current_revision(repo.engine, schema))
    head = migrate.head_revision()
    state = "[green]up to date[/]" if revision == head else "[yellow]behind: run upgrade[/]"
    out.print(f"current: {revision or '(none)'}\nhead:    {head}\n{state}")


@app.command()
@command
async def threads(
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    user: User = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
) -> None:
    """List threads, most recently updated first."""
    found = await _with(url, schema, lambda repo: repo.alist_threads(_scope(user), limit=limit))
    table = Table("thread", "owner", "name", "version", "updated")
    for t in found:
        table.add_row(
            str(t.thread_id),
            str(t.user_id),
            t.name or "",
            str(t.version),
            f"{t.updated_at:%Y-%m-%d %H:%M:%S}" if t.updated_at else "",
        )
    out.print(table)


@app.command()
@command
async def show(
    thread: str, url: Url = DEFAULT_URL, schema: Schema = None, user: User = None
) -> None:
    """The latest state of a thread, its version, message count and tool calls."""

    async def read(repo: CheckpointRepository) -> Any:
        config = _config(thread, user)
        info = await repo.aget_thread(config)
        if info is None:
            _fail(f"no thread {thread!r}" + (f" of user {user!r}" if user else ""))
        state = await repo.aget_state(config)
        return (
            info,
            state,
            len(await repo.aget_messages(config)),
            await repo.alist_tool_executions(config),
        )

    info, state, messages, calls = await _with(url, schema, read)
    out.print(
        f"thread {info.thread_id}  owner {info.user_id}  version {info.version}  "
        f"messages {messages}  tool calls {len(calls)}"
    )
    out.print_json(encode(state) if state is not None else "null")
    if calls:
        table = Table("tool call", "tool", "status", "attempts")
        for c in calls:
            table.add_row(c.tool_call_id, c.tool_name, c.status, str(c.attempts))
        out.print(table)


@app.command()
@command
async def history(
    thread: str,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    user: User = None,
    version: Annotated[int | None, typer.Option(help="Print this version's state.")] = None,
) -> None:
    """The retained versions of a thread, or one of them (``--version``)."""
    snapshots = await _with(url, schema, lambda repo: repo.alist_states(_config(thread, user)))
    if not snapshots:
        _fail(f"no retained versions of thread {thread!r}")
    if version is not None:
        match = [s for s in snapshots if s.version == version]
        if not match:
            _fail(
                f"version {version} of {thread!r} is not retained "
                f"(retained: {snapshots[-1].version}..{snapshots[0].version})"
            )
        out.print_json(encode(match[0].state))
        return
    table = Table("version", "created", "bytes")
    for s in snapshots:
        table.add_row(
            str(s.version), f"{s.created_at:%Y-%m-%d %H:%M:%S.%f}", str(len(encode(s.state)))
        )
    out.print(table)


@app.command("export")
@command
async def export_(
    thread_ids: Annotated[list[str] | None, typer.Argument(help="Threads to export.")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="JSON Lines file.")] = Path("-"),
    all_threads: Annotated[bool, typer.Option("--all", help="Every thread.")] = False,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
) -> None:
    """Export threads (record, retained states, messages, tool ledger) as JSON Lines."""
    if bool(thread_ids) == all_threads:
        _fail("name threads to export, or pass --all")
    if str(output) == "-":
        _fail("give the output file with -o FILE.jsonl")
    count = await _with(
        url,
        schema,
        lambda repo: archive.export_threads(repo, output, None if all_threads else thread_ids),
    )
    out.print(f"exported {count} thread(s) to {output}")


@app.command("import")
@command
async def import_(
    path: Annotated[Path, typer.Argument(help="A JSON Lines file written by export.")],
    on_conflict: Annotated[str, typer.Option(help="fail, skip or replace.")] = "fail",
    url: Url = DEFAULT_URL,
    schema: Schema = None,
) -> None:
    """Import threads; importing the same file twice changes nothing."""

    async def run(repo: CheckpointRepository) -> Any:
        await repo.asetup()
        return await archive.import_file(repo, path, on_conflict)

    outcomes = await _with(url, schema, run)
    out.print("imported: " + ", ".join(f"{v} {k}" for k, v in sorted(outcomes.items())))


@app.command()
@command
async def copy(
    source: Annotated[str, typer.Argument(help="Database URL to copy from.")],
    destination: Annotated[str, typer.Argument(help="Database URL to copy to.")],
    source_schema: Annotated[str | None, typer.Option(help="Schema of the source.")] = None,
    destination_schema: Annotated[
        str | None, typer.Option(help="Schema of the destination.")
    ] = None,
    on_conflict: Annotated[str, typer.Option(help="fail, skip or replace.")] = "fail",
) -> None:
    """Copy every thread to another database, verifying each; resumable."""
    async with _repo(source, source_schema) as src, _repo(destination, destination_schema) as dst:
        await dst.asetup()
        total = sum([1 async for _ in src.aiter_threads()])
        with Progress(TextColumn("copying"), BarColumn(), MofNCompleteColumn(), console=err) as bar:
            task = bar.add_task("copy", total=total)
            outcomes = await archive.copy_threads(
                src, dst, on_conflict, progress=lambda _: bar.advance(task)
            )
        copied = sum([1 async for _ in dst.aiter_threads()])
    out.print(
        "copied: "
        + ", ".join(f"{v} {k}" for k, v in sorted(outcomes.items()))
        + f"; the destination holds {copied} thread(s), every copy verified"
    )


@app.command()
@command
async def demo(
    path: Annotated[str, typer.Option(help="SQLite file to use.")] = "tenxstore-demo.db",
) -> None:
    """Run a small simulated agent loop on an embedded SQLite file."""
    from .demo import run_demo

    report = await run_demo(path, say=lambda line: out.print(line, highlight=False))
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


def main() -> None:
    """Entry point of the ``tenxstore`` console script."""
    app()


if __name__ == "__main__":
    main()
