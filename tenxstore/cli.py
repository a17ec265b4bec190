"""``tenxstore``: migrate, check, inspect, export/import, copy and demo, for operators.

Every command that works on one database takes ``--url`` (or
``TENXSTORE_DATABASE_URL``) and ``--schema`` (or ``TENXSTORE_SCHEMA``); ``copy``
takes the two URLs as arguments and a schema option for each. Commands that only
read never create a database: a SQLite file that does not exist is an error. Bad
input — an unreachable database, a missing thread, a malformed file — prints one
line on stderr and exits with status 1.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

try:
    import typer
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.table import Column, Table
    from rich.text import Text
except ImportError as exc:  # pragma: no cover - the message is the point
    raise SystemExit("the tenxstore command needs its extra: pip install 'tenxstore[cli]'") from exc

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from . import __version__, archive, migrate, views
from .backends import async_url
from .cache import DEFAULT_KEY_PREFIX, CachedCheckpointer
from .errors import ConfigError, TenxStoreError
from .keyusage import MAX_NAMED, KeyUsage, akey_usage
from .protocol import Checkpointer
from .repository import CheckpointRepository
from .serde import encode
from .types import AuthPolicy

__all__ = ["app", "main"]

T = TypeVar("T")
DEFAULT_URL = "sqlite:///tenxstore.db"
app = typer.Typer(
    help="Operate tenxstore databases: migrate, check, inspect, export, import, copy.",
    no_args_is_help=True,
    add_completion=False,
)
# Lines stay whole when piped; tables still fit. No markup: what is printed holds ids,
# names and errors of the user's data, and rich would take "[/]" in them for a tag (and
# fail) or "[bold]" for a style; tenxstore's own colours are given as styles.
out = Console(soft_wrap=True, markup=False)
err = Console(stderr=True, markup=False)


class OnConflict(enum.Enum):
    """What an import does with a thread that exists with other content."""

    fail = "fail"
    skip = "skip"
    replace = "replace"


Url = Annotated[str, typer.Option("--url", envvar="TENXSTORE_DATABASE_URL", help="Database URL.")]
Schema = Annotated[
    str | None, typer.Option("--schema", envvar="TENXSTORE_SCHEMA", help="PostgreSQL schema.")
]
User = Annotated[str | None, typer.Option("--user", help="Owner (omit to see every user's).")]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar="TENXSTORE_REDIS_URL",
        help="The application's Redis cache, so what this command changes is not served stale.",
    ),
]
KeyPrefix = Annotated[
    str | None,
    typer.Option(help="The cache's key prefix, if the application sets one explicitly."),
]
Conflict = Annotated[
    OnConflict, typer.Option(case_sensitive=False, help="For a thread that exists already.")
]
AllowType = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-type",
        help="A type of your own that LangGraph values may hold, as module:Name "
        "(repeatable); every other type beyond LangGraph's safe ones is refused.",
    ),
]


def _allowed(types: list[str] | None) -> list[tuple[str, str]]:
    """``--allow-type module:Name`` values as (module, name) pairs."""
    pairs = []
    for given in types or ():
        module, sep, name = given.partition(":")
        if not sep or not module or not name:
            raise ConfigError(f"--allow-type takes module:Name, not {given!r}")
        pairs.append((module, name))
    return pairs


def _fail(message: str) -> NoReturn:
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


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tenxstore {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Operate tenxstore databases: migrate, check, inspect, export, import, copy."""


def _existing(url: str) -> None:
    """A command that only reads must not create a SQLite file that is not there."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # CheckpointRepository reports a malformed URL
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    if not Path(parsed.database).exists():
        _fail(
            f"there is no SQLite database at {parsed.database}: "
            f"run `tenxstore upgrade --url {url}` to create one"
        )


def _repo(url: str, schema: str | None, *, reads_only: bool = False) -> CheckpointRepository:
    if reads_only:
        _existing(url)
    return CheckpointRepository(url, schema=schema, enforce_user_isolation=False)


@asynccontextmanager
async def _cached(
    repo: CheckpointRepository, redis_url: str | None, key_prefix: str | None
) -> AsyncIterator[Checkpointer]:
    """The repository behind the application's cache (when given), so what a command
    changes is fenced there too."""
    if redis_url is None:
        yield repo
        return
    prefix = key_prefix or DEFAULT_KEY_PREFIX
    cached = CachedCheckpointer(repo, redis_url=redis_url, key_prefix=prefix)
    try:
        yield cached
        left = cached.pending_invalidations
        if left:  # this process ends: nothing would ever send them
            problem = (await cached.acheck()).cache_error or "Redis did not answer in time"
            raise CacheNotInvalidated(
                f"the database was changed, but {left} cache invalidation(s) did not reach "
                f"Redis ({problem}): the application may serve the replaced threads from "
                "its cache until their entries expire. Run the command again once Redis "
                "answers (it changes nothing twice, and fences the threads again)"
            )
    finally:
        await cached.aclose()


class CacheNotInvalidated(TenxStoreError):
    """A CLI command changed the database but could not fence the cache."""


def _scope(user: str | None) -> dict[str, Any]:
    """Every user's threads, or only ``user``'s (isolation applies to that call)."""
    if user is None:
        return dict(archive.OPERATOR)
    return {"user_id": user, "auth_policy": AuthPolicy(enforce_user_isolation=True)}


def _config(thread: str, user: str | None) -> dict[str, Any]:
    return {"thread_id": thread, **_scope(user)}


def _print_table(table: Table) -> None:
    """A table on stdout: as wide as the terminal, or as its rows when piped (a pipe
    has no width: rich would cut every line at 80 columns)."""
    if out.is_terminal:
        out.print(table)
    else:
        Console(file=out.file, width=_PIPED_WIDTH, markup=False).print(table)


_PIPED_WIDTH = 200


def _when(value: datetime | None) -> str:
    """Every time the command prints, in one format, in UTC."""
    if value is None:
        return ""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


async def _with(
    url: str,
    schema: str | None,
    work: Callable[[CheckpointRepository], Awaitable[T]],
    *,
    reads_only: bool = True,
) -> T:
    async with _repo(url, schema, reads_only=reads_only) as repo:
        return await work(repo)


@app.command()
@command
async def upgrade(url: Url = DEFAULT_URL, schema: Schema = None) -> None:
    """Migrate the database to the newest schema (creating it when absent)."""
    await _with(url, schema, lambda repo: repo.asetup(), reads_only=False)
    out.print(Text.assemble(("at head", "green"), f" ({migrate.head_revision()})"))


@app.command()
@command
async def downgrade(
    revision: Annotated[str, typer.Argument(help="Revision to go down to; 'base' empties it.")],
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    yes: Annotated[bool, typer.Option("--yes", help="Drop what the revisions added.")] = False,
) -> None:
    """Migrate the database down to REVISION, dropping the tables and columns (and
    their data) of every later revision."""
    if not yes:
        _fail(f"downgrading to {revision} drops tables and columns with their data: add --yes")

    async def run(repo: CheckpointRepository) -> None:
        await migrate.downgrade(repo.backend, schema=schema, revision=revision)

    await _with(url, schema, run)
    out.print(f"at {revision}")


@app.command()
@command
async def current(url: Url = DEFAULT_URL, schema: Schema = None) -> None:
    """Show the database's schema revision and the newest one; exit 1 when behind."""
    revision = await _with(url, schema, lambda repo: migrate.current_revision(repo.engine, schema))
    head = migrate.head_revision()
    out.print(f"current: {revision or '(none)'}\nhead:    {head}")
    if revision != head:
        out.print("behind: run `tenxstore upgrade`", style="yellow")
        raise typer.Exit(1)
    out.print("up to date", style="green")


@app.command()
@command
async def doctor(
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    redis_url: RedisUrl = None,
    key_prefix: KeyPrefix = None,
) -> None:
    """Check the database, its schema, what its values are sealed under (against
    TENXSTORE_KEYS) and the Redis cache; exit 1 if something is wrong."""
    async with (
        _repo(url, schema, reads_only=True) as repo,
        _cached(repo, redis_url, key_prefix) as cp,
    ):
        health = await cp.acheck()
        usage = memories = vectors = None
        if health.database_error is None and health.revision == health.head:
            usage = await akey_usage(repo)
            from .cli_memories import memory_counts, pgvector_line

            memories = await memory_counts(repo)
            vectors = await pgvector_line(repo)
    out.print(f"database  {health.database}")
    out.print(f"schema    {health.revision or '(none)'} (this release needs {health.head})")
    if memories is not None:
        held, expired = memories
        waiting = f", {expired} expired waiting for `tenxstore memories sweep`" if expired else ""
        out.print(f"memories  {held}{waiting}")
    if vectors is not None:
        out.print(vectors)
    problems = list(health.problems)
    if usage is not None:
        problems += _encryption(repo, usage)
    if health.cache is not None:
        state = "answers" if health.cache_error is None else "fails open"
        out.print(f"cache     {health.cache}: {state}")
        if health.pending_invalidations:
            out.print(f"          {health.pending_invalidations} invalidation(s) pending")
    if not problems:
        out.print("healthy", style="green")
        return
    for problem in problems:
        out.print(Text.assemble(("problem", "red"), f" {problem}"), highlight=False)
    raise typer.Exit(1)


def _encryption(repo: CheckpointRepository, usage: KeyUsage) -> list[str]:
    """Print what the values are sealed under; the problems of it: values no key of
    TENXSTORE_KEYS opens (under keys it lacks, damaged, or under a key of its id that
    is not the key that sealed them), plaintext a strict ring refuses."""
    keys = repo.keys
    missing = ", ".join(f"{n:,} under {key} (not in the ring)" for key, n in usage.unknown.items())
    damaged = f"{usage.unnamed:,} naming no key" if usage.unnamed else ""
    elsewhere = ", ".join(part for part in (missing, damaged) if part)
    clear = ", ".join(f"{table} {n:,}" for table, n in usage.plaintext_by_table.items())
    if keys is None:
        sealed = f"; {elsewhere}" if elsewhere else ""
        out.print(
            f"keys      none (TENXSTORE_KEYS unset); {usage.plaintext:,} value(s) in clear{sealed}"
        )
    else:
        under = ", ".join(f"{n:,} under {key}" for key, n in usage.by_key.items())
        strict = ", sealed values required" if keys.require_sealed else ""
        more = f", {elsewhere}" if elsewhere else ""
        out.print(
            f"keys      {', '.join(keys.key_ids)} (sealing under {keys.current}{strict}); "
            f"values: {under}, {usage.plaintext:,} in clear{more}"
        )
        others = [k for k in keys.key_ids if k != keys.current]
        behind = sum(n for k, n in usage.by_key.items() if k != keys.current)
        if behind:
            out.print(
                f"          {behind:,} value(s) under {', '.join(others)}, not under "
                f"{keys.current}: keep those keys in TENXSTORE_KEYS; `tenxstore rotate-keys` "
                "seals the values again"
            )
        elif others and not usage.unreadable:
            # the count rotate-keys ends with, said the same way
            out.print(
                f"          no value is under {', '.join(others)}: once no instance seals "
                "under them, they can be removed from TENXSTORE_KEYS"
            )
        if usage.plaintext and not keys.require_sealed:
            out.print(
                f"          {usage.plaintext:,} value(s) in clear: `tenxstore rotate-keys` "
                "seals them"
            )
        if keys.envelope != "tx2":  # an upgrade under way (TENXSTORE_ENVELOPE=tx1)
            out.print(
                f"          sealing in the {keys.envelope} envelope (TENXSTORE_ENVELOPE): what "
                "is written now is not bound to its thread's life; unset it once every "
                "instance runs this release, then `tenxstore rotate-keys`"
            )
        if usage.previous_format:
            # not a problem (they open as before), but not bound to the thread's life
            out.print(
                f"          {usage.previous_format:,} value(s) sealed in the previous envelope "
                "(tx1: not bound to the thread's life, so a copy of one opens in a later "
                "life of its thread): `tenxstore rotate-keys` seals them again as tx2"
            )
    if clear:
        out.print(f"          in clear by table: {clear}")
    marked = usage.sealed_since
    if marked is not None:
        out.print(f"sealed    since {_when(marked)}: writes without TENXSTORE_KEYS are refused")
    elif keys is not None:
        out.print("sealed    not marked yet: the first write with a key ring marks the store")
    problems = []
    late = usage.plaintext_since_sealed
    if late:
        where = ", ".join(f"{table} {n:,}" for table, n in late.items())
        problems.append(
            f"encryption: {sum(late.values()):,} value(s) are in clear in rows made after the "
            f"store was marked as holding sealed values ({where}): an instance without "
            "TENXSTORE_KEYS wrote them (one running since before the mark): restart it with "
            "the key ring; `tenxstore rotate-keys` then seals them"
        )
    if keys is None and marked is not None and usage.plaintext:
        problems.append(
            f"encryption: {usage.plaintext:,} value(s) are in clear in a store that holds "
            f"sealed values ({clear}): written before encryption was turned on, or by an "
            "instance without TENXSTORE_KEYS; `tenxstore rotate-keys` with the key ring "
            "seals them"
        )
    if usage.unknown:
        named = ", ".join(repr(key) for key in usage.unknown)
        where = "no key ring is configured" if keys is None else "the key ring lacks them"
        problems.append(
            f"encryption: {sum(usage.unknown.values()):,} value(s) are sealed under "
            f"{named} and {where} (TENXSTORE_KEYS): reading them fails with DecryptionError"
        )
    if usage.unnamed:
        problems.append(
            f"encryption: {usage.unnamed:,} value(s) look sealed but name no key "
            "(damaged envelopes, or keys past the first "
            f"{MAX_NAMED} missing ones named): reading them fails with DecryptionError"
        )
    for key, failed in usage.unopened.items():
        if failed:
            why = (
                "is not the key that sealed them (another key under the same id?)"
                if failed == usage.tried[key]
                else "opens some but not these (tampered, or moved from another row?)"
            )
            problems.append(
                f"encryption: {failed} of {usage.tried[key]} value(s) sealed under "
                f"{key!r} that were tried do not open: the ring's key {key!r} {why}"
            )
    if keys is not None and keys.require_sealed and usage.plaintext:
        problems.append(
            f"encryption: {usage.plaintext:,} value(s) are in clear and the key ring requires "
            "sealed values: reading them fails. Rows written before encryption was on are "
            "sealed by `tenxstore rotate-keys` run without TENXSTORE_REQUIRE_SEALED; any "
            "other plaintext was put there by someone else"
        )
    return problems


@app.command()
@command
async def threads(
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    user: User = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
) -> None:
    """List threads, most recently updated first (a LangGraph checkpoint updates one)."""

    async def read(repo: CheckpointRepository) -> Any:
        found = await repo.alist_threads(_scope(user), limit=limit)
        return found, await repo.langgraph.counts([t.thread_id for t in found])

    found, graphs = await _with(url, schema, read)
    if not found:
        out.print("no threads" + (f" of user {user!r}" if user else ""))
        return
    table = Table("thread", "owner", "name", "version", "checkpoints", "updated")
    for t in found:
        table.add_row(
            str(t.thread_id),
            str(t.user_id),
            t.name or "",
            str(t.version),
            str(graphs.get(t.thread_id, 0)),
            _when(t.updated_at),
        )
    _print_table(table)


_NEEDS_LANGGRAPH = "pip install 'tenxstore[langgraph]' to read them"


async def _checkpoints(
    repo: CheckpointRepository, thread: str, user: str | None, **narrow: Any
) -> list[tuple[views.CheckpointView, dict[str, Any]]] | None:
    """The thread's LangGraph checkpoints (newest first), or None without the
    ``langgraph`` extra; [] when LangGraph never wrote it (no query then)."""
    if not await repo.langgraph.counts([thread]):
        return []
    try:
        return await views.checkpoints(repo, thread, user, **narrow)
    except ImportError:
        return None


def _written(ts: str | None) -> str:
    """A checkpoint's ``ts`` in the command's one time format."""
    try:
        return _when(datetime.fromisoformat(ts)) if ts else ""
    except ValueError:
        return ts or ""


def _print_checkpoint(view: views.CheckpointView, values: dict[str, Any]) -> None:
    """A checkpoint's conversation channels one message a line, then the other channels
    and the metadata as JSON."""
    conversations = {ch: v for ch, v in values.items() if views.is_conversation(v)}
    for channel, messages in conversations.items():
        out.print(f"messages (channel {channel!r}):")
        for message in messages:
            out.print("  " + views.message_line(message))
    others = {ch: v for ch, v in view.values.items() if ch not in conversations}
    if others:
        out.print("channels:")
        out.print_json(encode(others))
    out.print("metadata:")
    out.print_json(encode(view.metadata))


@app.command()
@command
async def show(
    thread: str, url: Url = DEFAULT_URL, schema: Schema = None, user: User = None
) -> None:
    """The latest state of a thread (and its latest LangGraph checkpoint), its version,
    message count and tool calls."""

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
            await repo.langgraph.counts([info.thread_id]),
            await _checkpoints(repo, thread, user, namespace="", limit=1),
        )

    info, state, messages, calls, counts, graph = await _with(url, schema, read)
    count = counts.get(info.thread_id, 0)
    out.print(
        f"thread {info.thread_id}  owner {info.user_id}  version {info.version}  "
        f"messages {messages}  tool calls {len(calls)}  LangGraph checkpoints {count}  "
        f"updated {_when(info.updated_at)}"
    )
    if not count or state is not None or messages:
        if count:
            out.print(f"state (core API), version {info.version}:")
        out.print_json(encode(state) if state is not None else "null")
    if graph is None:
        out.print(f"LangGraph: {count} checkpoint(s); {_NEEDS_LANGGRAPH}")
    elif graph:
        view, values = graph[0]
        out.print(
            f"LangGraph checkpoint {view.checkpoint_id}  step {view.step}  "
            f"source {view.source}  written {_written(view.written)}"
        )
        _print_checkpoint(view, values)
    elif count:  # only in subgraph namespaces
        out.print(f"LangGraph: {count} checkpoint(s) of subgraphs; see `tenxstore history`")
    if calls:
        table = Table("tool call", "tool", "status", "attempts", "started")
        for c in calls:
            table.add_row(
                c.tool_call_id, c.tool_name, c.status, str(c.attempts), _when(c.started_at)
            )
        _print_table(table)


@app.command()
@command
async def history(
    thread: str,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    user: User = None,
    version: Annotated[int | None, typer.Option(help="Print this version's state.")] = None,
    checkpoint: Annotated[
        str | None, typer.Option(help="Print this LangGraph checkpoint's values.")
    ] = None,
) -> None:
    """The retained versions of a thread and its LangGraph checkpoints, newest first,
    or one of them (--version N, --checkpoint ID)."""

    async def read(repo: CheckpointRepository) -> Any:
        config = _config(thread, user)
        return await repo.alist_states(config), await _checkpoints(repo, thread, user)

    snapshots, graph = await _with(url, schema, read)
    if not snapshots and not graph:
        if graph is None:
            _fail(f"thread {thread!r} has LangGraph checkpoints: {_NEEDS_LANGGRAPH}")
        _fail(f"no retained versions or LangGraph checkpoints of thread {thread!r}")
    if version is not None:
        match = [s for s in snapshots if s.version == version]
        if not match:
            retained = f"{snapshots[-1].version}..{snapshots[0].version}" if snapshots else "none"
            _fail(f"version {version} of {thread!r} is not retained (retained: {retained})")
        out.print_json(encode(match[0].state))
        return
    if checkpoint is not None:
        chosen = [(v, values) for v, values in graph or () if v.checkpoint_id == checkpoint]
        if not chosen:
            _fail(f"thread {thread!r} has no LangGraph checkpoint {checkpoint!r}")
        view, values = chosen[0]
        out.print(
            f"LangGraph checkpoint {view.checkpoint_id}  namespace {view.namespace!r}  "
            f"step {view.step}  source {view.source}  written {_written(view.written)}"
        )
        _print_checkpoint(view, values)
        if view.writes:
            out.print("pending writes:")
            out.print_json(encode([list(w) for w in view.writes]))
        return
    if snapshots:
        table = Table("version", "created", "bytes", title="states (core API)" if graph else None)
        for s in snapshots:
            table.add_row(str(s.version), _when(s.created_at), str(len(encode(s.state))))
        _print_table(table)
    if graph is None:
        out.print(f"LangGraph checkpoints: {_NEEDS_LANGGRAPH}")
    elif graph:
        subgraphs = any(view.namespace for view, _ in graph)
        table = Table(
            Column("checkpoint", no_wrap=True),  # whole: it is what --checkpoint takes
            *(["namespace"] if subgraphs else []),
            "step",
            "source",
            "writes",
            Column("written", no_wrap=True),
            title="LangGraph checkpoints",
        )
        for view, _ in graph:
            table.add_row(
                view.checkpoint_id,
                *([view.namespace] if subgraphs else []),
                str(view.step),
                str(view.source),
                ", ".join(sorted({channel for _, channel, _ in view.writes})),
                _written(view.written),
            )
        _print_table(table)


@app.command("export")
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
    if sum((bool(thread_ids), all_threads, user is not None)) != 1:
        _fail("name threads to export, or pass --user USER, or --all")
    chosen = thread_ids or None
    if output == "-":
        count = await _with(
            url,
            schema,
            lambda repo: archive.write_exports(
                repo, sys.stdout, chosen, sealed=sealed, user_id=user
            ),
        )
        err.print(f"exported {count} line(s)")
        return
    path = Path(output)
    count = await _with(
        url,
        schema,
        lambda repo: archive.export_threads(repo, path, chosen, sealed=sealed, user_id=user),
    )
    out.print(f"exported {count} line(s) to {path}")


@app.command("import")
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
    allowed = _allowed(allow_type)
    if not path.is_file():
        _fail(f"no such file: {path}")

    async def run(repo: CheckpointRepository) -> Any:
        await repo.asetup()
        async with _cached(repo, redis_url, key_prefix) as cp:
            return await archive.import_file(cp, path, on_conflict.value, allowed_types=allowed)

    outcomes = await _with(url, schema, run, reads_only=False)
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
    on_conflict: Conflict = OnConflict.fail,
    redis_url: RedisUrl = None,
    key_prefix: KeyPrefix = None,
    allow_type: AllowType = None,
) -> None:
    """Copy every thread and every memory to another database, verifying each;
    resumable. With --redis-url, the destination's cache entries of every copied
    thread are fenced."""
    allowed = _allowed(allow_type)
    async_url(destination)  # a bad destination fails before the source is read
    src_repo = _repo(source, source_schema, reads_only=True)
    async with (
        src_repo as src,
        _repo(destination, destination_schema) as dst_repo,
        _cached(dst_repo, redis_url, key_prefix) as dst,
    ):
        await src.astore_id()  # the source is set up: fail before touching the destination
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


@app.command()
@command
async def demo(
    path: Annotated[str, typer.Option(help="SQLite file to use.")] = "tenxstore-demo.db",
    url: Annotated[
        str | None, typer.Option(help="A database URL instead of the SQLite file.")
    ] = None,
    schema: Schema = None,
) -> None:
    """Run a small simulated agent loop on an embedded SQLite file (or --url)."""
    from .demo import run_demo

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


# The data-lifecycle commands (delete-user, prune, stats) live in their own module,
# which uses the helpers above. Under `python -m tenxstore.cli` this file runs as
# __main__ and hands over to the package's own module (below) instead.
if __name__ != "__main__":
    from . import cli_langgraph as _cli_langgraph
    from . import cli_memories as _cli_memories
    from . import cli_ops as _cli_ops

    _cli_ops.register(app)
    _cli_memories.register(app)
    _cli_langgraph.register(app)


def main() -> None:
    """Entry point of the ``tenxstore`` console script."""
    app()


if __name__ == "__main__":
    from tenxstore.cli import main as _main  # one copy of the app, with every command

    _main()
