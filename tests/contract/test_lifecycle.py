"""Erasing a user and retiring idle threads (every backend, bare and cached): whole
threads in bounded batches, nothing of another user, nothing left in the cache, a crash
between or inside batches leaves every thread whole or gone and a re-run finishes,
and a thread used while a prune runs is kept."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from redis.asyncio import Redis
from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from tenxstore import (
    AuthPolicy,
    CachedCheckpointer,
    CacheUnreachable,
    CheckpointRepository,
    ConfigError,
    DeleteResult,
    StaleStateError,
    parse_duration,
)
from tenxstore.cache import cache_key
from tenxstore.langgraph import TenxCheckpointSaver
from tests import services
from tests.conftest import Backend, backend_for, cfg

TABLES = (
    "states",
    "messages",
    "tool_executions",
    "lg_checkpoints",
    "lg_writes",
    "lg_blobs",
    "lg_heads",  # a namespace's head mark: erased with the rest, not counted
    "threads",
)
FIELDS = {
    "states": "states",
    "messages": "messages",
    "tool_executions": "tool_executions",
    "lg_checkpoints": "checkpoints",
    "lg_writes": "checkpoint_writes",
    "lg_blobs": "checkpoint_blobs",
    "threads": "threads",
}
FENCE = b'{"__checkpoint_fence__":'
LONG_AGO = datetime(2020, 1, 1, tzinfo=timezone.utc)


def repository(cp: Any) -> Any:
    return getattr(cp, "inner", cp)


def table(backend: Backend, name: str) -> str:
    return f'"{backend.schema}".{name}' if backend.schema else name


async def raw_counts(backend: Backend, cp: Any, thread: str) -> dict[str, int]:
    """Rows of one thread in each table, read with plain SQL."""
    counts = {}
    async with repository(cp).engine.connect() as conn:
        for name in TABLES:
            sql = f"SELECT count(*) FROM {table(backend, name)} WHERE thread_id = :t"
            counts[name] = (await conn.execute(text(sql), {"t": thread})).scalar_one()
    return counts


async def execute(backend: Backend, cp: Any, sql: str, **params: Any) -> None:
    async with repository(cp).engine.begin() as conn:
        await conn.execute(text(sql.format(**{n: table(backend, n) for n in TABLES})), params)


async def lg_put(saver: Any, thread: str, step: int, parent: dict[str, Any] | None = None) -> Any:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"step": step}
    checkpoint["channel_versions"] = {"step": saver.get_next_version(None, None)}
    config = parent or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return await saver.aput(config, checkpoint, {"source": "loop", "step": step}, {})


async def fill(cp: Any, user: str, threads: int, *, langgraph: bool = True) -> list[str]:
    """Threads of ``user``, each with a record, 2 states, 4 messages, a tool call and
    (with ``langgraph``) 2 LangGraph checkpoints with their values and a pending write."""
    saver = TenxCheckpointSaver(cp).for_user(user)
    names = []
    for i in range(threads):
        thread = f"{user}-{i:03d}"
        names.append(thread)
        config = cfg(thread, user)
        await cp.aput_thread(config, name=f"chat {i}")
        for turn in range(2):
            messages = [{"id": f"{turn}-{k}", "role": "user", "content": thread} for k in (0, 1)]
            await cp.aput_checkpoint(config, {"turn": turn, "of": thread}, messages)
        await cp.arun_tool_once(config, "call-1", "lookup", {"q": i}, lambda q: q + 1)
        if langgraph:
            head = await lg_put(saver, thread, 0)
            head = await lg_put(saver, thread, 1, head)
            await saver.aput_writes(head, [("step", 2)], "task-1")
    return names


def whole(counts: dict[str, int], *, langgraph: bool = True) -> bool:
    lg = 1 if langgraph else 0
    expected = {
        "states": 2,
        "messages": 4,
        "tool_executions": 1,
        "threads": 1,
        "lg_checkpoints": 2 * lg,
        "lg_writes": lg,
        "lg_heads": lg,
    }
    return all(counts[k] == v for k, v in expected.items()) and counts["lg_blobs"] >= lg


def gone(counts: dict[str, int]) -> bool:
    return not any(counts.values())


async def snapshot(cp: Any, thread: str, user: str) -> tuple[Any, ...]:
    """Everything a user reads back of one thread, through every API."""
    config = cfg(thread, user)
    saver = TenxCheckpointSaver(cp).for_user(user)
    lg = await saver.aget_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
    return (
        await cp.aget_thread(config),
        await cp.aget_state(cfg(thread, user)),
        await cp.aget_state_cache(cfg(thread, user)),
        await cp.alist_states(config),
        await cp.aget_messages(config),
        await cp.alist_tool_executions(config),
        None if lg is None else lg.checkpoint["channel_values"],
    )


async def cache_values(cp: Any, threads: list[str], user: str) -> list[bytes | None]:
    """What Redis holds under each thread's keys (the owner's and the unscoped one)."""
    async with Redis.from_url(services.redis_url()) as client:
        keys = [cache_key(cp.key_prefix, t, user, True) for t in threads]
        keys += [cache_key(cp.key_prefix, t, None, False) for t in threads]
        values: list[bytes | None] = await client.mget(keys)
        return values


async def warm(cp: Any, threads: list[str], user: str) -> None:
    """Fill the cache's entries of both modes for each thread."""
    for thread in threads:
        assert await cp.aget_state_cache(cfg(thread, user)) is not None
        operator = cfg(thread, user, auth_policy=AuthPolicy(enforce_user_isolation=False))
        assert await cp.aget_state_cache(operator) is not None


# -- erase -------------------------------------------------------------------------------


async def test_erase_removes_every_row_of_the_user_and_nothing_of_another(
    backend: Backend,
) -> None:
    cp = await backend.make()
    alice = await fill(cp, "alice", 5)
    bob = await fill(cp, "bob", 2)
    bob_before = [await snapshot(cp, t, "bob") for t in bob]
    raw = {t: await raw_counts(backend, cp, t) for t in alice}
    assert all(whole(c) for c in raw.values())
    expected = {FIELDS[n]: sum(c[n] for c in raw.values()) for n in TABLES if n in FIELDS}
    if backend.redis_url:
        await warm(cp, alice, "alice")

    planned = await cp.adelete_user("alice", dry_run=True, sample=3)
    assert {k: getattr(planned, k) for k in expected} == expected
    assert [t.thread_id for t in planned.sample] == alice[:3]  # least recently updated
    assert planned.batches == 0 and await raw_counts(backend, cp, alice[0]) == raw[alice[0]]

    done = await cp.adelete_user("alice", batch_size=2)
    assert {k: getattr(done, k) for k in expected} == expected
    assert (done.batches, done.skipped, done.dry_run) == (3, 0, False)
    assert done.rows == sum(expected.values())
    assert done.cache_keys == (2 * len(alice) if backend.redis_url else 0)

    for thread in alice:
        assert gone(await raw_counts(backend, cp, thread))
        assert await snapshot(cp, thread, "alice") == (None, None, None, [], [], [], None)
    assert await cp.alist_threads({"user_id": "alice"}) == []
    assert [await snapshot(cp, t, "bob") for t in bob] == bob_before
    if backend.redis_url:
        assert all(v is None or v.startswith(FENCE) for v in await cache_values(cp, alice, "alice"))
    again = await cp.adelete_user("alice")
    assert again == DeleteResult()


async def test_a_run_that_read_before_the_erase_never_writes_into_it(backend: Backend) -> None:
    cp = await backend.make()
    await fill(cp, "alice", 1, langgraph=False)
    run = cfg("alice-000")
    await cp.aget_state_cache(run)
    await cp.adelete_user("alice")
    with pytest.raises(StaleStateError):
        await cp.aput_state(run, {"written": "after the erase"})
    assert not await cp.aput_state_cache(run, {"cached": "after the erase"}, 3)
    assert await cp.aget_state_cache(cfg("alice-000")) is None
    # A new conversation is a new thread, owned by whoever writes it.
    assert await cp.aput_state(cfg("alice-000"), {"new": True}) == 1


async def test_a_thread_created_while_the_erase_runs_is_erased_too(backend: Backend) -> None:
    """The erase ends only when a pass finds no thread of the user: one the application
    creates between two batches (a session not yet stopped) goes as well."""
    cp = await backend.make()
    alice = await fill(cp, "alice", 4, langgraph=False)
    created: list[str] = []

    async def meanwhile(totals: DeleteResult) -> None:
        if totals.batches == 1:
            await cp.aput_checkpoint(cfg("alice-late"), {"late": True}, [{"id": "m"}])
            created.append("alice-late")

    done = await cp.adelete_user("alice", batch_size=2, on_batch=meanwhile)
    assert created == ["alice-late"]
    assert (done.threads, done.messages) == (5, 4 * 4 + 1)
    for thread in [*alice, "alice-late"]:
        assert gone(await raw_counts(backend, cp, thread))
    assert await cp.alist_threads({"user_id": "alice"}) == []


async def test_batches_are_bounded(backend: Backend) -> None:
    cp = await backend.make()
    threads = await fill(cp, "alice", 23, langgraph=False)
    seen: list[int] = []
    sizes: list[int] = []

    async def before_commit(batch: Any) -> None:
        sizes.append(len(batch))
        assert {c.user_id for c in batch} == {"alice"}

    done = await cp.adelete_user(
        "alice",
        batch_size=4,
        on_batch=lambda t: seen.append(t.threads),
        before_commit=before_commit,
    )
    assert done.threads == len(threads) and done.batches == 6
    assert sizes == [4, 4, 4, 4, 4, 3]
    assert seen == [4, 8, 12, 16, 20, 23]


async def test_a_failure_at_a_batch_boundary_stops_and_a_rerun_finishes(backend: Backend) -> None:
    cp = await backend.make()
    alice = await fill(cp, "alice", 7)
    await fill(cp, "bob", 1)

    class Crash(Exception):
        pass

    def crash_after_second(totals: DeleteResult) -> None:
        if totals.batches == 2:
            raise Crash

    with pytest.raises(Crash):
        await cp.adelete_user("alice", batch_size=2, on_batch=crash_after_second)
    states = [await raw_counts(backend, cp, t) for t in alice]
    assert sum(gone(c) for c in states) == 4
    assert sum(whole(c) for c in states) == 3
    for thread, counts in zip(alice, states, strict=True):
        read = await snapshot(cp, thread, "alice")
        assert (read[0] is None) == gone(counts)

    # A failure inside a batch, before its commit: that batch's threads are all whole.
    async def fail_inside(batch: Any) -> None:
        raise Crash

    with pytest.raises(Crash):
        await cp.adelete_user("alice", batch_size=2, before_commit=fail_inside)
    assert sum([whole(await raw_counts(backend, cp, t)) for t in alice]) == 3

    rest = await cp.adelete_user("alice", batch_size=2)
    assert (rest.threads, rest.batches, rest.checkpoints) == (3, 2, 6)
    assert all([gone(await raw_counts(backend, cp, t)) for t in alice])
    assert whole(await raw_counts(backend, cp, "bob-000"))


CHILD = """
import asyncio, sys, tenxstore

async def main(url, schema, redis_url, prefix, point):
    cp = tenxstore.CheckpointRepository(url, schema=schema or None)
    if redis_url:
        cp = tenxstore.CachedCheckpointer(cp, redis_url=redis_url, key_prefix=prefix)

    def between(totals):
        print("batch", totals.batches, flush=True)
        sys.stdin.readline()  # killed here, between two batches

    async def inside(batch):
        print("inside", len(batch), flush=True)
        sys.stdin.readline()  # killed here, with the batch's transaction open

    hooks = {"between": {"on_batch": between}, "inside": {"before_commit": inside}}
    await cp.adelete_user("alice", batch_size=2, **hooks[point])

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.parametrize("point", ["between", "inside"])
@pytest.mark.parametrize("name", ["sqlite", "postgresql", "sqlite+redis", "postgresql+redis"])
async def test_a_killed_erase_leaves_whole_threads_and_a_rerun_finishes(
    name: str, point: str, tmp_path: Path
) -> None:
    async with backend_for(name, tmp_path) as backend:
        cp = await backend.make()
        alice = await fill(cp, "alice", 5)
        await fill(cp, "bob", 1)
        if backend.redis_url:
            await warm(cp, alice, "alice")
        args = [backend.url, backend.schema or "", backend.redis_url or "", backend.key_prefix]
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            *args,  # type: ignore[arg-type]  # a SQL backend has a url
            point,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            line = (await child.stdout.readline()).decode()
            assert line.split()[0] == point.replace("between", "batch")
        finally:
            child.send_signal(signal.SIGKILL)  # a crash: no clean-up of any kind
            await child.wait()
        states = [await raw_counts(backend, cp, t) for t in alice]
        assert all(whole(c) or gone(c) for c in states)
        assert sum(gone(c) for c in states) == (2 if point == "between" else 0)
        if backend.redis_url:
            values = await cache_values(cp, alice, "alice")
            deleted = [gone(c) for c in states] * 2
            assert all(
                v is None or v.startswith(FENCE) for v, d in zip(values, deleted, strict=True) if d
            )

        rest = await cp.adelete_user("alice", batch_size=2)
        assert rest.threads == (3 if point == "between" else 5)
        assert all([gone(await raw_counts(backend, cp, t)) for t in alice])
        assert whole(await raw_counts(backend, cp, "bob-000"))
        for thread in alice:
            assert await snapshot(cp, thread, "alice") == (None, None, None, [], [], [], None)


async def test_bad_arguments_are_config_errors_before_any_write(backend: Backend) -> None:
    cp = await backend.make()
    await fill(cp, "alice", 1, langgraph=False)
    for bad in ({"user_id": ""}, {"user_id": None}, {"user_id": "a\x00"}):
        with pytest.raises(ConfigError):
            await cp.adelete_user(bad["user_id"])
    for size in (0, -1, 5001, 2.0, True):
        with pytest.raises(ConfigError):
            await cp.adelete_user("alice", batch_size=size)
        with pytest.raises(ConfigError):
            await cp.aprune_idle(timedelta(days=1), batch_size=size)
    for age in (timedelta(0), timedelta(seconds=-1), 90, "90d", timedelta.max):
        with pytest.raises(ConfigError):
            await cp.aprune_idle(age)
    assert (await cp.adelete_user("alice", dry_run=True)).threads == 1


def test_durations_are_parsed_or_refused() -> None:
    assert parse_duration("90d") == timedelta(days=90)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("30m") == timedelta(minutes=30)
    assert parse_duration(" 1d12h ") == timedelta(days=1, hours=12)
    assert parse_duration("2w") == timedelta(weeks=2)
    assert parse_duration("45s") == timedelta(seconds=45)
    for bad in ("", "90", "d", "90 days", "1.5h", "-1d", "0d", "90D5", "9" * 30 + "d"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


# -- retention ---------------------------------------------------------------------------


async def age(backend: Backend, cp: Any, threads: list[str], when: datetime = LONG_AGO) -> None:
    """Make threads look untouched since ``when`` (every time stamp of theirs)."""
    for thread in threads:
        for sql in (
            "UPDATE {threads} SET updated_at = :w, created_at = :w WHERE thread_id = :t",
            "UPDATE {lg_checkpoints} SET created_at = :w WHERE thread_id = :t",
            "UPDATE {tool_executions} SET started_at = :w, finished_at = :w WHERE thread_id = :t",
        ):
            await execute(backend, cp, sql, w=when, t=thread)


async def test_prune_deletes_only_idle_threads_and_dry_run_deletes_nothing(
    backend: Backend,
) -> None:
    cp = await backend.make()
    idle = await fill(cp, "alice", 3) + await fill(cp, "bob", 2)
    active = await fill(cp, "carol", 2)
    await age(backend, cp, idle)
    # Old records, but a LangGraph checkpoint or a tool call since: in use.
    lg_active, tool_active = await fill(cp, "dave", 1), await fill(cp, "erin", 1)
    await age(backend, cp, lg_active + tool_active)
    await lg_put(TenxCheckpointSaver(cp).for_user("dave"), lg_active[0], 5)
    await cp.arun_tool_once(cfg(tool_active[0], "erin"), "call-2", "t", {}, lambda: 1)
    await age(backend, cp, [idle[0]], LONG_AGO - timedelta(days=1))
    if backend.redis_url:
        await warm(cp, idle[:3], "alice")
    raw = {t: await raw_counts(backend, cp, t) for t in idle}
    expected = {FIELDS[n]: sum(c[n] for c in raw.values()) for n in TABLES if n in FIELDS}

    planned = await cp.aprune_idle(timedelta(days=90), dry_run=True, sample=2)
    assert {k: getattr(planned, k) for k in expected} == expected
    assert [t.thread_id for t in planned.sample] == [idle[0], idle[1]]
    assert all([whole(await raw_counts(backend, cp, t)) for t in idle])

    done = await cp.aprune_idle(timedelta(days=90), batch_size=2)
    assert {k: getattr(done, k) for k in expected} == expected
    assert (done.batches, done.skipped) == (3, 0)
    assert all([gone(await raw_counts(backend, cp, t)) for t in idle])
    for thread in active + lg_active + tool_active:
        assert (await raw_counts(backend, cp, thread))["threads"] == 1
    if backend.redis_url:
        values = await cache_values(cp, idle[:3], "alice")
        assert all(v is None or v.startswith(FENCE) for v in values)
    assert (await cp.aprune_idle(timedelta(days=90))).threads == 0


class Picked:
    """Sets an event when a statement matching ``needle`` has run (in any engine)."""

    def __init__(self, needle: str) -> None:
        self.needle = needle
        self.event = asyncio.Event()
        self.loop = asyncio.get_running_loop()

    def __call__(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self.needle in statement and "FOR UPDATE" not in statement:
            self.loop.call_soon_threadsafe(self.event.set)

    def __enter__(self) -> Picked:
        event.listen(Engine, "after_cursor_execute", self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        event.remove(Engine, "after_cursor_execute", self)


@pytest.mark.parametrize("touch", ["state", "tool call"])
@pytest.mark.parametrize("name", ["sqlite", "postgresql", "postgresql+redis", "pgbouncer"])
async def test_a_thread_used_while_the_prune_runs_is_kept(
    name: str, touch: str, tmp_path: Path
) -> None:
    """A writer holds its transaction open (its lock) while the prune picks the thread
    as idle; it commits once the pick has run; the prune's batch must ask again under
    its lock, see the use, and keep the thread."""
    async with backend_for(name, tmp_path) as backend:
        cp = await backend.make()
        threads = await fill(cp, "alice", 2, langgraph=False)
        await age(backend, cp, threads)
        used = threads[1]
        now = datetime.now(timezone.utc)
        if touch == "state":
            sql = "UPDATE {threads} SET updated_at = :now WHERE thread_id = :t"
        else:  # a new row that references the thread: a foreign key's share lock only
            sql = (
                "INSERT INTO {tool_executions} (thread_id, tool_call_id, tool_name, args,"
                " status, attempts, started_at) VALUES (:t, 'late', 'x', '{{}}', 'started', 1,"
                " :now)"
            )
        sql = sql.format(**{n: table(backend, n) for n in TABLES})
        if backend.name.startswith("sqlite"):  # a writer in another connection of its own
            assert backend.url is not None
            writer = sqlite3.connect(backend.url.removeprefix("sqlite:///"), isolation_level=None)
            writer.execute("BEGIN IMMEDIATE")
            stamp = now.strftime("%Y-%m-%d %H:%M:%S.%f")  # as SQLAlchemy stores it
            assert writer.execute(sql, {"t": used, "now": stamp}).rowcount == 1
            with Picked("updated_at <") as picked:
                prune = asyncio.create_task(cp.aprune_idle(timedelta(days=90)))
                await picked.event.wait()  # the prune has read both threads as idle
            writer.execute("COMMIT")
            writer.close()
            done = await prune
        else:
            async with repository(cp).engine.connect() as conn:
                await conn.begin()
                await conn.execute(text(sql), {"t": used, "now": now})
                with Picked("updated_at <") as picked:
                    prune = asyncio.create_task(cp.aprune_idle(timedelta(days=90)))
                    await picked.event.wait()  # the prune has read both threads as idle
                await conn.commit()
                done = await prune
        assert (done.threads, done.skipped) == (1, 1)
        assert gone(await raw_counts(backend, cp, threads[0]))
        assert (await raw_counts(backend, cp, used))["threads"] == 1
        assert await cp.aget_state(cfg(used)) == {"turn": 1, "of": used}


# -- stats -------------------------------------------------------------------------------


async def test_stats_count_users_rows_sizes_and_cache_keys(backend: Backend) -> None:
    cp = await backend.make()
    await fill(cp, "alice", 3)
    await fill(cp, "bob", 2, langgraph=False)
    await cp.aput_state(cfg("loose", "x", auth_policy=AuthPolicy(False)), {"n": 1})
    if backend.redis_url:
        await warm(cp, ["alice-000", "alice-001"], "alice")
    found = await cp.astats(top=2, exact=True)
    assert (found.threads, found.users) == (6, 3)
    assert [(u.user_id, u.threads) for u in found.top_users] == [("alice", 3), ("bob", 2)]
    alice = found.top_users[0]
    assert (alice.states, alice.messages, alice.tool_executions, alice.checkpoints) == (
        6,
        12,
        3,
        6,
    )
    by_name = {t.name: t for t in found.tables}
    assert set(by_name) >= {"threads", "states", "messages", "lg_checkpoints", "lg_blobs"}
    assert by_name["threads"].rows == 6 and by_name["messages"].rows == 20
    for t in found.tables:
        assert t.table_bytes is not None and t.table_bytes > 0
        assert t.index_bytes is not None
        # InnoDB's primary key is the table itself (clustered): its index bytes are the
        # secondary indexes', none for a table that has only its primary key.
        assert t.index_bytes > 0 or (backend.name == "mariadb" and t.index_bytes == 0)
        assert t.total_bytes == t.table_bytes + t.index_bytes
    assert found.database_bytes is not None
    assert found.database_bytes >= sum(t.total_bytes or 0 for t in found.tables)
    # SQLite lists deleted pages as free; InnoDB purges old row versions itself and
    # reports DATA_FREE: neither counts dead rows.
    if backend.name.startswith(("sqlite", "memory", "mariadb")):
        assert all(t.dead_rows is None and t.dead_ratio is None for t in found.tables)
        assert found.free_bytes is not None and found.free_bytes >= 0
    else:
        for t in found.tables:
            assert t.dead_rows is not None and t.dead_ratio is not None
            assert 0.0 <= t.dead_ratio <= 1.0
    if backend.redis_url:
        async with Redis.from_url(services.redis_url()) as client:
            keys = [k async for k in client.scan_iter(match=f"{backend.key_prefix}:*")]
        assert found.cache_keys == len(keys) and found.cache_error is None
        assert len(keys) >= 4  # two threads warmed in each mode
    else:
        assert found.cache_keys is None
    assert (await cp.astats(top=0)).top_users == ()
    with pytest.raises(ConfigError):
        await cp.astats(top=-1)


@pytest.mark.parametrize("name", ["sqlite+redis", "postgresql+redis"])
async def test_a_batch_whose_fences_redis_did_not_confirm_is_rolled_back(
    name: str, tmp_path: Path
) -> None:
    async with backend_for(name, tmp_path) as backend:
        cp = await backend.make()
        alice = await fill(cp, "alice", 3)
        await warm(cp, alice, "alice")
        down = CachedCheckpointer(
            CheckpointRepository(backend.url, schema=backend.schema),  # type: ignore[arg-type]
            redis_url="redis://127.0.0.1:1/0",
            key_prefix=backend.key_prefix,
        )
        try:
            with pytest.raises(CacheUnreachable, match="rolled back"):
                await down.adelete_user("alice", batch_size=2)
            await age(backend, cp, alice)
            with pytest.raises(CacheUnreachable):
                await down.aprune_idle(timedelta(days=90))
        finally:
            await down.aclose()
        assert all([whole(await raw_counts(backend, cp, t)) for t in alice])
        assert await cp.aget_state_cache(cfg(alice[0])) == {"turn": 1, "of": alice[0]}
        done = await cp.adelete_user("alice", batch_size=2)  # once Redis answers
        assert (done.threads, done.cache_keys) == (3, 6)
        assert all(v is None or v.startswith(FENCE) for v in await cache_values(cp, alice, "alice"))


@pytest.mark.parametrize("name", ["sqlite+redis", "postgresql+redis"])
async def test_a_batch_larger_than_one_redis_pipeline_fences_every_key(
    name: str, tmp_path: Path
) -> None:
    async with backend_for(name, tmp_path) as backend:
        cp = await backend.make()
        threads = [f"t{n:04d}" for n in range(300)]  # 600 keys: two pipelines of 500
        for thread in threads:
            await cp.aput_state(cfg(thread), {"n": thread})  # caches the owner's entry
        assert all(v is not None for v in (await cache_values(cp, threads, "alice"))[:300])
        done = await cp.adelete_user("alice", batch_size=300)
        assert (done.threads, done.batches, done.cache_keys) == (300, 1, 600)
        values = await cache_values(cp, threads, "alice")
        assert all(v is not None and v.startswith(FENCE) for v in values)
