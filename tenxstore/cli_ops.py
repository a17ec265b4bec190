"""The operator's data-lifecycle commands of ``tenxstore``: ``delete-user``, ``prune``,
``stats`` and ``rotate-keys`` (:func:`register` adds them to :data:`tenxstore.cli.app`).

``delete-user`` and ``prune`` take ``--redis-url`` (or ``TENXSTORE_REDIS_URL``) so the
application's cache entries of what they delete are fenced too; when Redis cannot be
reached they say so and exit 1 (run them again once it answers).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from .cli import (
    DEFAULT_URL,
    KeyPrefix,
    RedisUrl,
    Schema,
    Url,
    _cached,
    _fail,
    _repo,
    _when,
    command,
    err,
    out,
)
from .lifecycle import DEFAULT_BATCH_SIZE, DeleteResult, parse_duration
from .rotation import DEFAULT_ROTATION_BATCH, arotate_keys, astale_rows
from .stats import StoreStats

__all__ = ["delete_user", "prune", "register", "rotate_keys", "stats"]

BatchSize = Annotated[
    int, typer.Option(help="Threads deleted per transaction (1 to 5000).", min=1, max=5000)
]
_KINDS = (
    ("threads", "threads"),
    ("states", "states"),
    ("messages", "messages"),
    ("tool executions", "tool_executions"),
    ("LangGraph checkpoints", "checkpoints"),
    ("LangGraph writes", "checkpoint_writes"),
    ("LangGraph values", "checkpoint_blobs"),
    ("cache keys fenced", "cache_keys"),
)


def _counts(result: DeleteResult, title: str) -> Table:
    table = Table("rows", "count", title=title)
    for label, field in _KINDS:
        if field == "cache_keys" and result.dry_run:
            continue
        table.add_row(label, str(getattr(result, field)))
    return table


def _sample(result: DeleteResult) -> Table:
    table = Table("thread", "owner", "version", "updated", title="for example")
    for t in result.sample:
        table.add_row(str(t.thread_id), str(t.user_id), str(t.version), _when(t.updated_at))
    return table


def _bar(what: str) -> Progress:
    return Progress(TextColumn(what, markup=False), BarColumn(), MofNCompleteColumn(), console=err)


@command
async def delete_user(
    user: Annotated[str, typer.Argument(help="The user whose threads are erased.")],
    yes: Annotated[bool, typer.Option("--yes", help="Erase: nothing can bring it back.")] = False,
    batch_size: BatchSize = DEFAULT_BATCH_SIZE,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    redis_url: RedisUrl = None,
    key_prefix: KeyPrefix = None,
) -> None:
    """Erase every thread USER owns (states, messages, tool calls, LangGraph
    checkpoints) in batches, and fence their cache entries; run it again after a
    failure to finish."""
    if not yes:
        _fail(f"this erases every thread of user {user!r} for good: add --yes")
    async with (
        _repo(url, schema, reads_only=True) as repo,
        _cached(repo, redis_url, key_prefix) as cp,
    ):
        planned = await cp.adelete_user(user, dry_run=True, sample=0)
        with _bar(f"erasing {user}") as bar:
            task = bar.add_task("erase", total=planned.threads)
            done = await cp.adelete_user(
                user,
                batch_size=batch_size,
                on_batch=lambda so_far: bar.update(task, completed=so_far.threads),
            )
    out.print(_counts(done, f"erased user {user!r} ({done.batches} batch(es))"))


@command
async def prune(
    idle_for: Annotated[
        str,
        typer.Option(
            "--idle-for", help="Delete threads not used for this long: 90d, 12h, 30m, 2w, 1d12h."
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only count and show what would go.")
    ] = False,
    sample: Annotated[int, typer.Option(help="Threads shown by --dry-run.", min=0)] = 10,
    batch_size: BatchSize = DEFAULT_BATCH_SIZE,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    redis_url: RedisUrl = None,
    key_prefix: KeyPrefix = None,
) -> None:
    """Delete the threads of every user not used for --idle-for (no state written,
    no LangGraph checkpoint, no tool call), in batches; a thread used meanwhile is
    kept."""
    older_than = parse_duration(idle_for)
    async with (
        _repo(url, schema, reads_only=True) as repo,
        _cached(repo, redis_url, key_prefix) as cp,
    ):
        planned = await cp.aprune_idle(older_than, dry_run=True, sample=sample if dry_run else 0)
        if dry_run:
            out.print(f"{planned.threads} thread(s) idle for {idle_for} would be deleted")
            if planned.threads:
                out.print(_counts(planned, "would delete"))
                out.print(_sample(planned))
            return
        with _bar(f"pruning threads idle for {idle_for}") as bar:
            task = bar.add_task("prune", total=planned.threads)
            done = await cp.aprune_idle(
                older_than,
                batch_size=batch_size,
                on_batch=lambda so_far: bar.update(task, completed=so_far.threads),
            )
    out.print(_counts(done, f"pruned threads idle for {idle_for} ({done.batches} batch(es))"))
    if done.skipped:
        out.print(f"{done.skipped} thread(s) were used while the prune ran and were kept")


def _size(value: int | None) -> str:
    if value is None:
        return "n/a"
    size = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _print_stats(found: StoreStats, top: int) -> None:
    out.print(f"backend   {found.backend}")
    out.print(f"threads   {found.threads} of {found.users} user(s)")
    line = f"database  {_size(found.database_bytes)}"
    if found.free_bytes is not None:
        line += f" ({_size(found.free_bytes)} free pages)"
    out.print(line)
    if found.cache_error is not None:
        out.print(f"cache     keys not counted: {found.cache_error}", highlight=False)
    elif found.cache_keys is not None:
        out.print(f"cache     {found.cache_keys} key(s) under the store's prefix")
    if found.top_users:
        users = Table(
            "user",
            "threads",
            "states",
            "messages",
            "tool calls",
            "checkpoints",
            title=f"top {top} users by threads",
        )
        for u in found.top_users:
            users.add_row(
                "(none)" if u.user_id is None else str(u.user_id),
                str(u.threads),
                str(u.states),
                str(u.messages),
                str(u.tool_executions),
                str(u.checkpoints),
            )
        out.print(users)
    tables = Table("table", "rows", "table", "indexes", "total", "dead rows", "dead %")
    for t in found.tables:
        ratio = t.dead_ratio
        tables.add_row(
            t.name,
            "n/a" if t.rows is None else str(t.rows),
            _size(t.table_bytes),
            _size(t.index_bytes),
            _size(t.total_bytes),
            "n/a" if t.dead_rows is None else str(t.dead_rows),
            "n/a" if ratio is None else f"{ratio:.1%}",
        )
    out.print(tables)


@command
async def stats(
    top: Annotated[int, typer.Option(help="Users listed, by threads held.", min=0)] = 10,
    exact: Annotated[
        bool, typer.Option("--exact", help="Count rows (PostgreSQL: instead of estimates).")
    ] = False,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    redis_url: RedisUrl = None,
    key_prefix: KeyPrefix = None,
) -> None:
    """What the store holds: threads per user (top N), table and index sizes, dead
    rows (PostgreSQL), and the cache's key count (with --redis-url)."""
    async with (
        _repo(url, schema, reads_only=True) as repo,
        _cached(repo, redis_url, key_prefix) as cp,
    ):
        found = await cp.astats(top=top, exact=exact)
    _print_stats(found, top)


@command
async def rotate_keys(
    batch_size: Annotated[
        int, typer.Option(help="Rows sealed again per transaction (1 to 10000).", min=1, max=10000)
    ] = DEFAULT_ROTATION_BATCH,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
) -> None:
    """Seal every stored payload again under the current key of TENXSTORE_KEYS (the
    first key; the others must include every key values are sealed under now), in
    short batches while the application runs. Plaintext rows written before
    encryption was turned on are sealed too. Run it again to resume; once it reports
    nothing left, the old keys can be removed from TENXSTORE_KEYS."""
    async with _repo(url, schema, reads_only=True) as repo:
        if repo.keys is None:
            _fail("set TENXSTORE_KEYS (key_id:base64key,...; the first is the new key)")
        total = await astale_rows(repo)
        done: dict[str, int] = {}
        with _bar(f"sealing under key {repo.keys.current if repo.keys else ''}") as bar:
            task = bar.add_task("rotate", total=total)

            def advance(table: str, so_far: int) -> None:
                done[table] = so_far
                bar.update(task, completed=sum(done.values()))

            result = await arotate_keys(repo, batch_size=batch_size, progress=advance)
    table = Table("table", "rows sealed again", title=f"rotated to key {result.key_id}")
    for name, count in result.rotated.items():
        table.add_row(name, str(count))
    out.print(table)
    if result.raced:
        out.print(f"{result.raced} row(s) were written meanwhile and were looked at again")
    if not result.done:
        _fail(f"{result.remaining} row(s) are still under another key: run it again")
    out.print("every value is under the current key: the old keys can be removed")


def register(app: typer.Typer) -> None:
    """Add the commands to ``app`` (the app of the running ``tenxstore.cli``, which is
    ``__main__`` under ``python -m tenxstore.cli``)."""
    app.command("delete-user")(delete_user)
    app.command()(prune)
    app.command()(stats)
    app.command("rotate-keys")(rotate_keys)
