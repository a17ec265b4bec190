"""The operator's data-lifecycle commands of ``tenxstore``: ``delete-user``, ``prune``,
``stats``, ``rotate-keys`` and ``mark-sealed`` (:func:`register` adds them to
:data:`tenxstore.cli.app`).

``delete-user`` and ``prune`` delete alike: ``--dry-run`` shows what would go; else
they ask on the terminal first, or do not with ``--yes`` (which a script without a
terminal needs, or nothing is deleted). They take ``--redis-url`` (or
``TENXSTORE_REDIS_URL``) so the application's cache entries of what they delete are
fenced too; when Redis cannot be reached they say so and exit 1 (run them again once
it answers).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from .common import (
    DEFAULT_URL,
    KeyPrefix,
    RedisUrl,
    Schema,
    Url,
    cached,
    command,
    err,
    fail,
    out,
    repository,
    when,
)

if TYPE_CHECKING:  # the library's modules are imported by the command that runs
    from .. import rotation
    from ..crypto import KeyRing
    from ..lifecycle import DeleteResult
    from ..repository import CheckpointRepository
    from ..rotation import RotationResult
    from ..stats import StoreStats

__all__ = ["delete_user", "mark_sealed", "prune", "register", "rotate_keys", "stats"]

# Option defaults, which --help shows: the library's, copied here because their modules
# import SQLAlchemy (tests/unit/test_cli_imports.py checks that they are the same).
DEFAULT_BATCH_SIZE = 200  # tenxstore.lifecycle.DEFAULT_BATCH_SIZE
DEFAULT_ROTATION_BATCH = 500  # tenxstore.rotation.DEFAULT_ROTATION_BATCH

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
    ("memories", "memories"),
    ("memory versions", "memory_versions"),
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
        table.add_row(str(t.thread_id), str(t.user_id), str(t.version), when(t.updated_at))
    return table


def _bar(what: str) -> Progress:
    return Progress(TextColumn(what, markup=False), BarColumn(), MofNCompleteColumn(), console=err)


Yes = Annotated[
    bool,
    typer.Option("--yes", help="Delete without asking (needed where there is no terminal)."),
]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Only count and show what would go; delete nothing.")
]
Sample = Annotated[int, typer.Option(help="Threads shown by --dry-run.", min=0)]


def _interactive() -> bool:
    """Whether there is someone to ask: standard input is a terminal."""
    return sys.stdin.isatty()


def _may_ask(yes: bool, dry_run: bool, what: str) -> None:
    """Before anything is opened: a delete that --yes did not confirm needs a terminal
    to ask on (a cron job or a script says --yes, or it deletes nothing)."""
    if not (yes or dry_run or _interactive()):
        fail(f"{what} for good, and there is no terminal to ask on: add --yes (or --dry-run)")


def _confirm(yes: bool, question: str) -> None:
    """Ask on the terminal, unless --yes; no is the default, and deletes nothing."""
    if not yes and not typer.confirm(question, default=False, err=True):
        fail("nothing was deleted")


def _planned(planned: DeleteResult, title: str) -> None:
    """What a dry run found: the counts and a sample of the threads."""
    if planned.threads or planned.memories:
        out.print(_counts(planned, title))
        out.print(_sample(planned))


@command
async def delete_user(
    user: Annotated[str, typer.Argument(help="The user whose threads are erased.")],
    yes: Yes = False,
    dry_run: DryRun = False,
    sample: Sample = 10,
    batch_size: BatchSize = DEFAULT_BATCH_SIZE,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    redis_url: RedisUrl = None,
    key_prefix: KeyPrefix = None,
) -> None:
    """Erase every thread USER owns (states, messages, tool calls, LangGraph
    checkpoints) and every memory (with its history) in batches, and fence the
    threads' cache entries; run it again after a failure to finish. Asks first,
    unless --yes."""
    _may_ask(yes, dry_run, f"this erases every thread of user {user!r}")
    async with (
        repository(url, schema, reads_only=True) as repo,
        cached(repo, redis_url, key_prefix) as cp,
    ):
        planned = await cp.adelete_user(user, dry_run=True, sample=sample if dry_run else 0)
        if dry_run:
            out.print(
                f"{planned.threads} thread(s) and {planned.memories} memor(ies) of user "
                f"{user!r} would be erased"
            )
            _planned(planned, "would erase")
            return
        _confirm(
            yes,
            f"erase {planned.threads} thread(s) and {planned.memories} memor(ies) of user "
            f"{user!r} for good?",
        )
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
    yes: Yes = False,
    dry_run: DryRun = False,
    sample: Sample = 10,
    batch_size: BatchSize = DEFAULT_BATCH_SIZE,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    redis_url: RedisUrl = None,
    key_prefix: KeyPrefix = None,
    include_memories: Annotated[
        bool,
        typer.Option(
            "--include-memories",
            help="Also delete the long-term memories not written for --idle-for "
            "(without it, memories are left alone).",
        ),
    ] = False,
) -> None:
    """Delete the threads of every user not used for --idle-for (no state written,
    no LangGraph checkpoint, no tool call), in batches; a thread used meanwhile is
    kept. Memories are left alone unless --include-memories. Asks first, unless
    --yes."""
    from ..lifecycle import parse_duration

    older_than = parse_duration(idle_for)
    _may_ask(yes, dry_run, f"this deletes the threads idle for {idle_for}")
    async with (
        repository(url, schema, reads_only=True) as repo,
        cached(repo, redis_url, key_prefix) as cp,
    ):
        planned = await cp.aprune_idle(
            older_than,
            dry_run=True,
            sample=sample if dry_run else 0,
            include_memories=include_memories,
        )
        if dry_run:
            _would_prune(planned, idle_for, include_memories)
            return
        memories = f" and {planned.memories} memor(ies)" if include_memories else ""
        _confirm(yes, f"delete {planned.threads} thread(s){memories} idle for {idle_for}?")
        with _bar(f"pruning threads idle for {idle_for}") as bar:
            task = bar.add_task("prune", total=planned.threads)
            done = await cp.aprune_idle(
                older_than,
                batch_size=batch_size,
                on_batch=lambda so_far: bar.update(task, completed=so_far.threads),
                include_memories=include_memories,
            )
    out.print(_counts(done, f"pruned threads idle for {idle_for} ({done.batches} batch(es))"))
    if done.skipped:
        out.print(f"{done.skipped} thread(s) were used while the prune ran and were kept")


def _would_prune(planned: DeleteResult, idle_for: str, include_memories: bool) -> None:
    """What a dry run of prune found."""
    out.print(f"{planned.threads} thread(s) idle for {idle_for} would be deleted")
    if include_memories:
        out.print(f"{planned.memories} memor(ies) not written for {idle_for} too")
    _planned(planned, "would delete")


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
    expired = f", {found.expired_memories} expired (sweep them)" if found.expired_memories else ""
    out.print(f"memories  {found.memories} of {found.memory_users} user(s){expired}")
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
            "memories",
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
                str(u.memories),
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
        repository(url, schema, reads_only=True) as repo,
        cached(repo, redis_url, key_prefix) as cp,
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
    """Seal every stored payload again under the sealing key of TENXSTORE_KEYS
    (TENXSTORE_SEALING_KEY, or the first key; the others must include every key values
    are sealed under now), in short batches while the application runs. Plaintext rows
    written before encryption was turned on are sealed too, and the store is marked as
    holding sealed values. It ends with a count in SQL of the rows not under the
    sealing key: only when that is 0 can the other keys be removed from
    TENXSTORE_KEYS. Run it again to resume."""
    async with repository(url, schema, reads_only=True) as repo:
        keys = repo.keys
        if keys is None:
            fail(
                "set TENXSTORE_KEYS (key_id:base64key,...) and TENXSTORE_SEALING_KEY (the "
                "new key's id) as every instance of the application has them"
            )
        sealing = keys.current
        result = await _rotate_with_bar(repo, sealing, batch_size)
    _print_rotation(result, keys, sealing)


async def arotate_keys(
    repo: CheckpointRepository,
    *,
    batch_size: int,
    progress: rotation.Progress,
    counted: rotation.Counted,
) -> RotationResult:
    """:func:`tenxstore.rotation.arotate_keys`, imported when a rotation runs."""
    from ..rotation import arotate_keys as rotate

    return await rotate(repo, batch_size=batch_size, progress=progress, counted=counted)


async def _rotate_with_bar(
    repo: CheckpointRepository, sealing: str, batch_size: int
) -> RotationResult:
    """:func:`arotate_keys`, its progress shown on a bar."""
    done: dict[str, int] = {}
    with _bar(f"sealing under key {sealing}") as bar:
        # The total is the rows sealed so far plus the last count of those left;
        # unknown (the bar pulses, "?") before the first count, and again when rows
        # written after a count (an instance still sealing under another key) take
        # the rows sealed past it, until the next count.
        task = bar.add_task("rotate", total=None)
        total: list[int | None] = [None]

        def show() -> None:
            sealed = sum(done.values())
            if total[0] is not None and sealed > total[0]:
                total[0] = None
            for shown in bar.tasks:  # update() cannot unset a total: None is "unchanged"
                if shown.id == task:
                    shown.total = total[0]
            bar.update(task, completed=sealed)

        def advance(table: str, so_far: int) -> None:
            done[table] = so_far
            show()

        def recount(left: int) -> None:
            total[0] = sum(done.values()) + left
            show()

        return await arotate_keys(repo, batch_size=batch_size, progress=advance, counted=recount)


def _print_rotation(result: RotationResult, keys: KeyRing, sealing: str) -> None:
    """Print what a rotation did; exit 1 when rows are still not under ``sealing``."""
    table = Table("table", "rows sealed again", title=f"rotated to key {result.key_id}")
    for name, count in result.rotated.items():
        table.add_row(name, str(count))
    out.print(table)
    if result.raced:
        out.print(f"{result.raced} row(s) were written meanwhile and were looked at again")
    others = ", ".join(k for k in keys.key_ids if k != sealing)
    if not result.done:
        keep = f"Keep the old keys ({others}); make" if others else "Make"
        fail(
            f"{result.remaining:,} row(s) were still not under key {sealing} at the final count, "
            f"after {result.passes} pass(es): rows are being written under another key or in "
            f"clear (an instance not yet sealing under {sealing}, or without TENXSTORE_KEYS). "
            f"{keep} {sealing} the sealing key of every instance, then run it again"
        )
    verdict = f"final count: 0 rows not under {sealing}, every value is sealed under it"
    if others:
        verdict += (
            f"; the old keys ({others}) can be removed from TENXSTORE_KEYS once no "
            "instance seals under them"
        )
    out.print(verdict)


@command
async def mark_sealed(
    clear: Annotated[
        bool,
        typer.Option("--clear", help="Take the mark back (refused while any value is sealed)."),
    ] = False,
    url: Url = DEFAULT_URL,
    schema: Schema = None,
) -> None:
    """Record in the database that the store holds sealed values: from then on a
    checkpointer without TENXSTORE_KEYS refuses to write (it would store plaintext),
    and `tenxstore doctor` without keys fails. Writes with a key ring, and
    rotate-keys, mark it by themselves; this says so before they have. Needs no
    key."""
    from ..keyusage import aclear_sealed, amark_sealed

    async with repository(url, schema, reads_only=True) as repo:
        if clear:
            await aclear_sealed(repo)
            out.print("the store is no longer marked as holding sealed values")
            return
        since = await amark_sealed(repo)
    out.print(
        f"the store holds sealed values (marked {when(since)}): writes without "
        "TENXSTORE_KEYS are refused"
    )


def register(app: typer.Typer) -> None:
    """Add ``delete-user``, ``prune``, ``stats``, ``rotate-keys`` and ``mark-sealed`` to
    the ``tenxstore`` command."""
    app.command("delete-user")(delete_user)
    app.command()(prune)
    app.command()(stats)
    app.command("rotate-keys")(rotate_keys)
    app.command("mark-sealed")(mark_sealed)
