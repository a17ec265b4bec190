"""The hot path behind a transaction-pooling PgBouncer: the head read in ONE simple
Query, the steady write in TWO (``BEGIN; ... COPY (<write>)``, then ``COMMIT``), values
written as literals (``tenxstore.backends.simple_query``).

Counted on the wire by a proxy between the client and PgBouncer; values that would
break a naive quoting come back byte-exact; a lock held by another transaction gives
LockTimeout within ``lock_timeout``; a link cut mid-write or while COMMIT is in flight
raises ConnectionLost with a ``committed`` that the database bears out, and nothing
commits afterwards; a cancelled write is rolled back before the call ends.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import orjson
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select
from sqlalchemy.dialects.postgresql import asyncpg as pg_asyncpg

from tenxstore import CheckpointRepository, ConnectionLost, LockTimeout
from tenxstore.backends import simple_query
from tenxstore.backends.driver import DriverStatement
from tenxstore.backends.simple_query import LiteralStatement, Unrenderable, literal
from tests import services
from tests.conftest import backend_for, cfg, quoted
from tests.servers import PgWire, TcpProxy


@asynccontextmanager
async def through(
    tmp_path: Path, proxy: Callable[[int], TcpProxy] | None = None, **options: Any
) -> AsyncIterator[tuple[CheckpointRepository, TcpProxy, str]]:
    """A repository on a migrated schema, through a proxy in front of PgBouncer; the
    proxy; the schema."""
    async with backend_for("pgbouncer", tmp_path) as backend:
        bouncer = urlsplit(services.pgbouncer_url())
        port = bouncer.port
        assert port is not None and backend.schema is not None
        link = await (proxy(port) if proxy else TcpProxy(port)).start()
        repo = CheckpointRepository(
            # the database of this test worker's own (pytest-xdist), through the proxy
            f"postgresql://postgres@127.0.0.1:{link.port}{bouncer.path}",
            schema=backend.schema,
            pool_mode="transaction",
            **options,
        )
        try:
            await repo.asetup()
            yield repo, link, backend.schema
        finally:
            await repo.aclose()
            await link.close()


@pytest.fixture
async def admin() -> AsyncIterator[Any]:
    """A connection to PostgreSQL itself (not through PgBouncer)."""
    conn = await asyncpg.connect(services.pg_url())
    yield conn
    await conn.close()


async def lock_row(admin: Any, schema: str, thread: str) -> None:
    """The thread's row lock, taken in the admin connection's transaction."""
    await admin.execute(
        f"SELECT 1 FROM {quoted(schema)}.threads WHERE thread_id = $1 FOR UPDATE", thread
    )


async def version_of(admin: Any, schema: str, thread: str) -> int:
    version: int = await admin.fetchval(
        f"SELECT version FROM {quoted(schema)}.threads WHERE thread_id = $1", thread
    )
    return version


async def until(check: Callable[[], Any], what: str) -> None:
    """Wait (polling the database, at most 10 s) until ``check()`` is true."""
    deadline = time.monotonic() + 10
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def running(admin: Any, marker: str, waiting: bool = False) -> int:
    """Server backends running a statement that carries ``marker`` (waiting for a lock)."""
    count: int = await admin.fetchval(
        "SELECT count(*) FROM pg_stat_activity, pg_stat_clear_snapshot()"
        " WHERE pid <> pg_backend_pid() AND position($1 in query) > 0"
        " AND state <> 'idle' AND ($2 = false OR wait_event_type = 'Lock')",
        marker,
        waiting,
    )
    return count


async def test_round_trips_on_the_wire_behind_pgbouncer(tmp_path: Path) -> None:
    wire = PgWire()
    with_wire = lambda port: TcpProxy(port, parser=wire.reader())  # noqa: E731
    async with through(tmp_path, with_wire, state_history_limit=2) as (repo, _, _schema):
        config = cfg("t", "u")
        await repo.aput_checkpoint(config, {"n": 0}, [{"id": "m0"}])  # the locked path
        for n in (1, 2, 3):  # the last two prune
            wire.reset()
            await repo.aput_checkpoint(config, {"n": n}, [{"id": f"m{n}a"}, {"id": f"m{n}b"}])
            # BEGIN; SET LOCAL; COPY (<write>) in one Query, then COMMIT
            assert (wire.queries, wire.round_trips) == (2, 2), vars(wire)
            wire.reset()
            assert await repo.aget_state(config) == {"n": n}
            assert (wire.queries, wire.round_trips) == (1, 1), vars(wire)
        assert [m["id"] for m in await repo.aget_messages(config)][-2:] == ["m3a", "m3b"]
        wire.reset()
        stale = cfg("t", "u", _checkpoint_version=1)
        with pytest.raises(Exception, match="version"):
            await repo.aput_state(stale, {"n": "late"})
        assert wire.queries >= 2  # the one step and its ROLLBACK, then the locked path
        assert await repo.aget_state(config) == {"n": 3}


ADVERSARIAL = [
    "it's",
    "''; DROP TABLE threads; --",
    "$$",
    "$$ || pg_sleep(1) || $$",
    "$t$",
    "back\\slash \\' \\\\ E'\\x41'",
    "tab\tnew\nline\rcarriage",
    "\x01\x1f\x7f",
    "ünïcødé \U0001d518\U0001d52b 🧪 \u202e rtl \u2028 sep \ufeff",
    "ends with a dollar$",
    "x" * 1_000_000,
]


async def test_adversarial_values_round_trip_byte_exact(
    tmp_path: Path, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The random tag made predictable: the first one drawn is inside the values, and
    # one value ends with "$<tag>" (it would close the quote early if only "$tag$" were
    # checked).
    tags = itertools.chain(["0" * 16] * 4, itertools.repeat("1" * 16))
    monkeypatch.setattr(simple_query.secrets, "token_hex", lambda _n: next(tags))
    tag = "t" + "0" * 16
    values = [*ADVERSARIAL, tag, f"${tag}$ injected", f"ends with ${tag}"]
    async with through(tmp_path) as (repo, _, schema):
        for thread in ("it's $$ a \\ thread", f"${tag}$"):
            config = cfg(thread, "o'brien $$")
            await repo.aput_state(config, {"v": "first"})  # the locked path
            for n, value in enumerate(values):
                messages = [{"id": f"{value[:50]}-{n}", "text": value}]
                await repo.aput_checkpoint(config, {"v": value, "n": n}, messages)
                assert await repo.aget_state(config) == {"v": value, "n": n}
                stored = await admin.fetchval(
                    f"SELECT s.state_data FROM {quoted(schema)}.states s JOIN "
                    f"{quoted(schema)}.threads t USING (thread_id) "
                    "WHERE thread_id = $1 AND s.version = t.version",
                    thread,
                )
                assert orjson.loads(stored) == {"v": value, "n": n}  # as stored
            assert await version_of(admin, schema, thread) == 1 + len(values)
            texts = [m["text"] for m in await repo.aget_messages(config) if "text" in m]
            assert texts[-len(values) :] == values


def test_literals_refuse_what_they_cannot_write_safely() -> None:
    for bad in ("nul \x00 inside", "lone \ud800 surrogate", 1.5, b"bytes", ["a", 1]):
        with pytest.raises(Unrenderable):
            literal(bad)
    assert literal(-1) == "(-1)"  # never "- -1": a comment
    assert literal(True) == "TRUE"
    assert literal([]) == "'{}'::text[]"
    # a name with "$1" in it (legal unquoted, and quoted) is not a placeholder
    table = Table("t", MetaData(schema="my$1sch"), Column("a$1", String), Column("n", Integer))
    compiled = DriverStatement(
        select(table.c["a$1"]).where(table.c.n == 5, table.c["a$1"] == "x'$1"),
        pg_asyncpg.dialect(),
    )
    rendered = LiteralStatement(compiled).render(compiled.args({}))
    assert rendered is not None and "my$1sch" in rendered and "$" in rendered
    assert "(5)" in rendered and "x'$1" in rendered
    assert LiteralStatement(compiled).render(("nul \x00", 5)) is None


async def test_a_held_lock_gives_lock_timeout_within_lock_timeout(
    tmp_path: Path, admin: Any
) -> None:
    async with through(tmp_path, lock_timeout=0.3) as (repo, _, schema):
        config = cfg("locked", "u")
        await repo.aput_state(config, {"n": 0})
        async with admin.transaction():
            await lock_row(admin, schema, "locked")
            started = time.monotonic()
            with pytest.raises(LockTimeout):
                await repo.aput_state(config, {"n": 1})
            waited = time.monotonic() - started
        assert 0.3 <= waited < 2.0, waited
        assert await version_of(admin, schema, "locked") == 1
        await repo.aput_state(config, {"n": 1})  # the connection is fine afterwards
        assert await repo.aget_state(config) == {"n": 1}


async def test_a_link_cut_before_commit_commits_nothing_ever(tmp_path: Path, admin: Any) -> None:
    async with through(tmp_path) as (repo, link, schema):
        marker = uuid.uuid4().hex  # in the thread id: early in the statement's text
        thread = f"cut-{marker}"
        config = cfg(thread, "u")
        await repo.aput_state(config, {"n": 0})
        async with admin.transaction():  # the row lock: the write waits, mid-statement
            await lock_row(admin, schema, thread)
            write = asyncio.ensure_future(repo.aput_state(config, {"n": marker}))
            await until(lambda: running(admin, marker, waiting=True), "the write never waited")
            link.cut()
            with pytest.raises(ConnectionLost) as lost:
                await write
            assert lost.value.committed is False
        # the lock is free: the orphaned transaction runs on, and never commits
        await until(
            lambda: _none(running(admin, marker)), "the orphaned write still runs after 10 s"
        )
        assert await version_of(admin, schema, thread) == 1
        link.restore()
        assert await repo.aget_state(config) == {"n": 0}


async def _none(count: Any) -> bool:
    return await count == 0


class CommitCutter:
    """A proxy hook that cuts the link as the client sends ``COMMIT``: before it reaches
    PgBouncer (``forward=False``), or just after (``forward=True``)."""

    def __init__(self, forward: bool) -> None:
        self.forward = forward
        self.armed = False
        self.link: TcpProxy | None = None

    def make(self) -> Callable[[bytes], bool]:
        def feed(chunk: bytes) -> bool:
            if not (self.armed and chunk.startswith(b"Q") and b"COMMIT" in chunk[:20]):
                return False
            self.armed = False
            if not self.forward:
                return True
            assert self.link is not None
            link = self.link  # connections cut just after it is written on, not refused
            asyncio.get_running_loop().call_soon(lambda: (link.cut(), link.restore()))
            return False

        return feed


@pytest.mark.parametrize("forward", [False, True], ids=["commit-unsent", "commit-sent"])
async def test_a_link_cut_at_commit_is_settled_truthfully(
    tmp_path: Path, admin: Any, forward: bool
) -> None:
    cutter = CommitCutter(forward)

    def proxy(port: int) -> TcpProxy:
        cutter.link = TcpProxy(port, parser=cutter.make)
        return cutter.link

    async with through(tmp_path, proxy) as (repo, link, schema):
        marker = uuid.uuid4().hex
        thread = f"commit-{marker}"
        config = cfg(thread, "u")
        await repo.aput_state(config, {"n": 0})
        cutter.armed = True
        try:
            await repo.aput_state(config, {"n": marker})
            committed: bool | None = True
        except ConnectionLost as exc:
            committed = exc.committed
        assert not cutter.armed, "the cut never happened"
        link.restore()
        version = await version_of(admin, schema, thread)
        if not forward:
            assert committed is False
        assert committed is not None  # the look settled it
        assert version == (2 if committed else 1)
        await until(lambda: _none(running(admin, marker)), "the write still runs after 10 s")
        assert await version_of(admin, schema, thread) == version  # and nothing after
        assert await repo.aget_state(config) == ({"n": marker} if committed else {"n": 0})


async def test_a_cancelled_write_is_rolled_back_before_the_call_ends(
    tmp_path: Path, admin: Any
) -> None:
    async with through(tmp_path) as (repo, _, schema):
        marker = uuid.uuid4().hex
        thread = f"cancelled-{marker}"
        config = cfg(thread, "u")
        await repo.aput_state(config, {"n": 0})
        async with admin.transaction():
            await lock_row(admin, schema, thread)
            write = asyncio.ensure_future(repo.aput_state(config, {"n": marker}))
            await until(lambda: running(admin, marker, waiting=True), "the write never waited")
            write.cancel()
            with pytest.raises(asyncio.CancelledError):
                await write
            assert await running(admin, marker) == 0  # ended with the call
        assert await version_of(admin, schema, thread) == 1
        await repo.aput_state(config, {"n": 1})
        assert await repo.aget_state(config) == {"n": 1}
