"""``tenxstore threads``, ``show`` and ``history``: what the store holds, for operators."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Column, Table

from ..extras import install_hint
from ..types import StateSnapshot
from .common import (
    DEFAULT_URL,
    Schema,
    Url,
    User,
    command,
    fail,
    out,
    print_table,
    scope,
    thread_config,
    when,
    with_repository,
)

if TYPE_CHECKING:  # views and serde are imported by the command that runs (not by --help)
    from ..repository import CheckpointRepository
    from ..views import CheckpointView

    _Graph = list[tuple[CheckpointView, dict[str, Any]]]  # checkpoints, with their values


@command
async def threads(
    url: Url = DEFAULT_URL,
    schema: Schema = None,
    user: User = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
) -> None:
    """List threads, most recently updated first (a LangGraph checkpoint updates one)."""

    async def read(repo: CheckpointRepository) -> Any:
        found = await repo.alist_threads(scope(user), limit=limit)
        return found, await repo.langgraph.counts([t.thread_id for t in found])

    found, graphs = await with_repository(url, schema, read)
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
            when(t.updated_at),
        )
    print_table(table)


_NEEDS_LANGGRAPH = f"{install_hint('langgraph')} to read them"


async def _checkpoints(
    repo: CheckpointRepository, thread: str, user: str | None, **narrow: Any
) -> _Graph | None:
    """The thread's LangGraph checkpoints (newest first), or None without the
    ``langgraph`` extra; [] when LangGraph never wrote it (no query then)."""
    from .. import views

    if not await repo.langgraph.counts([thread]):
        return []
    try:
        return await views.checkpoints(repo, thread, user, **narrow)
    except ImportError:
        return None


def _written(ts: str | None) -> str:
    """A checkpoint's ``ts`` in the command's one time format."""
    try:
        return when(datetime.fromisoformat(ts)) if ts else ""
    except ValueError:
        return ts or ""


def _print_checkpoint(view: CheckpointView, values: dict[str, Any]) -> None:
    """A checkpoint's conversation channels one message a line, then the other channels
    and the metadata as JSON."""
    from .. import views
    from ..serde import encode

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


@command
async def show(
    thread: str, url: Url = DEFAULT_URL, schema: Schema = None, user: User = None
) -> None:
    """The latest state of a thread (and its latest LangGraph checkpoint), its version,
    message count and tool calls."""
    from ..serde import encode

    async def read(repo: CheckpointRepository) -> Any:
        config = thread_config(thread, user)
        info = await repo.aget_thread(config)
        if info is None:
            fail(f"no thread {thread!r}" + (f" of user {user!r}" if user else ""))
        state = await repo.aget_state(config)
        return (
            info,
            state,
            len(await repo.aget_messages(config)),
            await repo.alist_tool_executions(config),
            await repo.langgraph.counts([info.thread_id]),
            await _checkpoints(repo, thread, user, namespace="", limit=1),
        )

    info, state, messages, calls, counts, graph = await with_repository(url, schema, read)
    count = counts.get(info.thread_id, 0)
    out.print(
        f"thread {info.thread_id}  owner {info.user_id}  version {info.version}  "
        f"messages {messages}  tool calls {len(calls)}  LangGraph checkpoints {count}  "
        f"updated {when(info.updated_at)}"
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
                c.tool_call_id, c.tool_name, c.status, str(c.attempts), when(c.started_at)
            )
        print_table(table)


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
        config = thread_config(thread, user)
        return await repo.alist_states(config), await _checkpoints(repo, thread, user)

    snapshots, graph = await with_repository(url, schema, read)
    if not snapshots and not graph:
        if graph is None:
            fail(f"thread {thread!r} has LangGraph checkpoints: {_NEEDS_LANGGRAPH}")
        fail(f"no retained versions or LangGraph checkpoints of thread {thread!r}")
    if version is not None:
        _print_version(snapshots, thread, version)
    elif checkpoint is not None:
        _print_one_checkpoint(graph, thread, checkpoint)
    else:
        _print_history(snapshots, graph)


def _print_version(snapshots: list[StateSnapshot], thread: str, version: int) -> None:
    """One retained version's state as JSON (``history --version N``)."""
    from ..serde import encode

    match = [s for s in snapshots if s.version == version]
    if not match:
        retained = f"{snapshots[-1].version}..{snapshots[0].version}" if snapshots else "none"
        fail(f"version {version} of {thread!r} is not retained (retained: {retained})")
    out.print_json(encode(match[0].state))


def _print_one_checkpoint(graph: _Graph | None, thread: str, checkpoint: str) -> None:
    """One LangGraph checkpoint with its values and pending writes (``--checkpoint``)."""
    from ..serde import encode

    chosen = [(v, values) for v, values in graph or () if v.checkpoint_id == checkpoint]
    if not chosen:
        fail(f"thread {thread!r} has no LangGraph checkpoint {checkpoint!r}")
    view, values = chosen[0]
    out.print(
        f"LangGraph checkpoint {view.checkpoint_id}  namespace {view.namespace!r}  "
        f"step {view.step}  source {view.source}  written {_written(view.written)}"
    )
    _print_checkpoint(view, values)
    if view.writes:
        out.print("pending writes:")
        out.print_json(encode([list(w) for w in view.writes]))


def _print_history(snapshots: list[StateSnapshot], graph: _Graph | None) -> None:
    """The retained versions, then the LangGraph checkpoints, newest first."""
    from ..serde import encode

    if snapshots:
        table = Table("version", "created", "bytes", title="states (core API)" if graph else None)
        for s in snapshots:
            table.add_row(str(s.version), when(s.created_at), str(len(encode(s.state))))
        print_table(table)
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
        print_table(table)


def register(app: typer.Typer) -> None:
    """Add ``threads``, ``show``, ``history`` to the ``tenxstore`` command."""
    app.command()(threads)
    app.command()(show)
    app.command()(history)
