"""``tenxstore upgrade``, ``downgrade``, ``current`` and ``doctor``: the schema and the
store's health."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from .common import (
    DEFAULT_URL,
    KeyPrefix,
    RedisUrl,
    Schema,
    Url,
    cached,
    command,
    fail,
    out,
    repository,
    when,
    with_repository,
)
from .memories import memory_counts, pgvector_line

if TYPE_CHECKING:  # the rest is imported by the command that runs (not by --help)
    from ..crypto import KeyRing
    from ..keyusage import KeyUsage
    from ..repository import CheckpointRepository


@command
async def upgrade(url: Url = DEFAULT_URL, schema: Schema = None) -> None:
    """Migrate the database to the newest schema (creating it when absent)."""
    from .. import migrate

    await with_repository(url, schema, lambda repo: repo.asetup(), reads_only=False)
    out.print(Text.assemble(("at head", "green"), f" ({migrate.head_revision()})"))


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
        fail(f"downgrading to {revision} drops tables and columns with their data: add --yes")

    async def run(repo: CheckpointRepository) -> None:
        from .. import migrate

        await migrate.downgrade(repo.backend, schema=schema, revision=revision)

    await with_repository(url, schema, run)
    out.print(f"at {revision}")


@command
async def current(url: Url = DEFAULT_URL, schema: Schema = None) -> None:
    """Show the database's schema revision and the newest one; exit 1 when behind."""
    from .. import migrate

    revision = await with_repository(
        url, schema, lambda repo: migrate.current_revision(repo.engine, schema)
    )
    head = migrate.head_revision()
    out.print(f"current: {revision or '(none)'}\nhead:    {head}")
    if revision != head:
        out.print("behind: run `tenxstore upgrade`", style="yellow")
        raise typer.Exit(1)
    out.print("up to date", style="green")


@command
async def doctor(
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    redis_url: RedisUrl = None,
    key_prefix: KeyPrefix = None,
) -> None:
    """Check the database, its schema, what its values are sealed under (against
    TENXSTORE_KEYS) and the Redis cache; exit 1 if something is wrong."""
    from ..keyusage import akey_usage

    async with (
        repository(url, schema, reads_only=True) as repo,
        cached(repo, redis_url, key_prefix) as cp,
    ):
        health = await cp.acheck()
        usage = memories = vectors = None
        if health.database_error is None and health.revision == health.head:
            usage = await akey_usage(repo)
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
        _print_ring(keys, usage, elsewhere)
    if clear:
        out.print(f"          in clear by table: {clear}")
    marked = usage.sealed_since
    if marked is not None:
        out.print(f"sealed    since {when(marked)}: writes without TENXSTORE_KEYS are refused")
    elif keys is not None:
        out.print("sealed    not marked yet: the first write with a key ring marks the store")
    return _encryption_problems(keys, usage, clear, marked)


def _print_ring(keys: KeyRing, usage: KeyUsage, elsewhere: str) -> None:
    """Print the key ring, what the values are sealed under, and what to do next."""
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
            f"          {usage.plaintext:,} value(s) in clear: `tenxstore rotate-keys` seals them"
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


def _encryption_problems(
    keys: KeyRing | None, usage: KeyUsage, clear: str, marked: datetime | None
) -> list[str]:
    """The problems of what the values are sealed under (``clear``: the plaintext by
    table, in words; ``marked``: when the store was marked as holding sealed values)."""
    from ..keyusage import MAX_NAMED

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


def register(app: typer.Typer) -> None:
    """Add ``upgrade``, ``downgrade``, ``current``, ``doctor`` to the ``tenxstore`` command."""
    app.command()(upgrade)
    app.command()(downgrade)
    app.command()(current)
    app.command()(doctor)
