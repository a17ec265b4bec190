"""What every ``tenxstore`` command shares: the app, its consoles and options, and
the helpers that open a database, fence the cache and print."""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from .. import __version__
from ..errors import ConfigError, TenxStoreError
from ..types import AuthPolicy

# What only a running command needs (SQLAlchemy, the repository, the cache with Redis)
# is imported where it is used: `tenxstore --help` imports none of it.
if TYPE_CHECKING:
    from rich.table import Table

    from ..protocol import Checkpointer
    from ..repository import CheckpointRepository

__all__ = [
    "DEFAULT_URL",
    "AllowType",
    "App",
    "CacheNotInvalidated",
    "Conflict",
    "KeyPrefix",
    "OnConflict",
    "RedisUrl",
    "Schema",
    "Url",
    "User",
    "allowed_types",
    "app",
    "cached",
    "command",
    "err",
    "existing_database",
    "fail",
    "out",
    "print_table",
    "repository",
    "scope",
    "thread_config",
    "when",
    "with_repository",
]

T = TypeVar("T")
_F = TypeVar("_F", bound=Callable[..., Any])
DEFAULT_URL = "sqlite:///tenxstore.db"


def _sentences(text: str | None) -> str | None:
    """A docstring as help: each paragraph one line, for rich to wrap. (Typer keeps a
    docstring's line breaks in rich mode, which cut sentences mid-line at any width.)"""
    if not text:
        return text
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _without_flag_types(params: list[Any]) -> list[Any]:
    """A flag (``--yes``, ``--help``) takes no value: no ``<bool>`` beside it in help.
    (Typer 0.2x prints a type for every option; its click is its own, not importable.)"""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class _Command(TyperCommand):
    """A command whose help reads as sentences and whose flags show no type."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = _sentences(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))


class _Group(TyperGroup):
    """The same, for a group of commands (the app, ``memories``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = _sentences(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))


class App(typer.Typer):
    """``typer.Typer`` whose commands and groups are :class:`_Command` and :class:`_Group`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=_Group, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Callable[[_F], _F]:
        """``Typer.command``, the command a :class:`_Command`."""
        return super().command(*args, cls=_Command, **kwargs)


app = App(
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


def allowed_types(types: list[str] | None) -> list[tuple[str, str]]:
    """``--allow-type module:Name`` values as (module, name) pairs."""
    pairs = []
    for given in types or ():
        module, sep, name = given.partition(":")
        if not sep or not module or not name:
            raise ConfigError(f"--allow-type takes module:Name, not {given!r}")
        pairs.append((module, name))
    return pairs


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)  # one plain line: rich would wrap it
    raise typer.Exit(1)


def command(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async command; expected failures become one line on stderr."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        import asyncio  # imported by a command that runs: --help needs no event loop

        try:
            asyncio.run(fn(*args, **kwargs))
        except typer.Exit:
            raise
        except (TenxStoreError, ValueError, OSError) as exc:
            fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except Exception as exc:
            database_error = _database_error(exc)
            if database_error is None:
                raise
            fail(database_error)

    return run


def _database_error(exc: Exception) -> str | None:
    """The line a SQLAlchemy error is told in (None: ``exc`` is none)."""
    from sqlalchemy.exc import DBAPIError, SQLAlchemyError

    if isinstance(exc, DBAPIError):
        return f"database error: {str(exc.orig).splitlines()[0] if exc.orig else exc}"
    if isinstance(exc, SQLAlchemyError):
        return f"database error: {str(exc).splitlines()[0]}"
    return None


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


def existing_database(url: str) -> None:
    """A command that only reads must not create a SQLite file that is not there."""
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number (h1,h2)
        return  # CheckpointRepository reads several hosts, or reports a malformed URL
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    if not Path(parsed.database).exists():
        fail(
            f"there is no SQLite database at {parsed.database}: "
            f"run `tenxstore upgrade --url {url}` to create one"
        )


def repository(url: str, schema: str | None, *, reads_only: bool = False) -> CheckpointRepository:
    """The repository a command works on: every read on the primary (an operator reads
    what is there now; the URL's ``replica=`` options are left out)."""
    from ..backends import async_url
    from ..backends.standbys import replicas_of_url
    from ..repository import CheckpointRepository

    if reads_only:
        existing_database(url)
    primary, _, _ = replicas_of_url(async_url(url))
    return CheckpointRepository(primary, schema=schema, enforce_user_isolation=False)


@asynccontextmanager
async def cached(
    repo: CheckpointRepository, redis_url: str | None, key_prefix: str | None
) -> AsyncIterator[Checkpointer]:
    """The repository behind the application's cache (when given), so what a command
    changes is fenced there too."""
    from ..cache import DEFAULT_KEY_PREFIX, CachedCheckpointer

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


def scope(user: str | None) -> dict[str, Any]:
    """Every user's threads, or only ``user``'s (isolation applies to that call)."""
    from ..archive import OPERATOR

    if user is None:
        return dict(OPERATOR)
    return {"user_id": user, "auth_policy": AuthPolicy(enforce_user_isolation=True)}


def thread_config(thread: str, user: str | None) -> dict[str, Any]:
    return {"thread_id": thread, **scope(user)}


def print_table(table: Table) -> None:
    """A table on stdout: as wide as the terminal, or as its rows when piped (a pipe
    has no width: rich would cut every line at 80 columns)."""
    if out.is_terminal:
        out.print(table)
    else:
        Console(file=out.file, width=_PIPED_WIDTH, markup=False).print(table)


_PIPED_WIDTH = 200


def when(value: datetime | None) -> str:
    """Every time the command prints, in one format, in UTC."""
    if value is None:
        return ""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


async def with_repository(
    url: str,
    schema: str | None,
    work: Callable[[CheckpointRepository], Awaitable[T]],
    *,
    reads_only: bool = True,
) -> T:
    async with repository(url, schema, reads_only=reads_only) as repo:
        return await work(repo)
