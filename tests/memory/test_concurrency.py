"""Writers of one memory take turns, and every update compares and swaps its version:
proven with concurrent tasks (``gather``) and with OS processes, never with sleeps."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tenxstore import CheckpointRepository, MemoryStore, StaleStateError
from tests import procs
from tests.conftest import SQL_BACKENDS, Backend, backend_for


async def test_two_writers_from_one_version_one_stale(memories: MemoryStore) -> None:
    await memories.astore("alice", "v1", key="k")
    outcomes = await asyncio.gather(
        memories.aupdate("alice", "k", content="from a", expected_version=1),
        memories.aupdate("alice", "k", content="from b", expected_version=1),
        return_exceptions=True,
    )
    stale = [o for o in outcomes if isinstance(o, StaleStateError)]
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(stale) == 1 and len(won) == 1, outcomes
    assert (stale[0].expected_version, stale[0].actual_version) == (1, 2)
    found = await memories.aget("alice", "k")
    assert found is not None and (found.version, found.content) == (2, won[0].content)


async def test_writers_without_a_version_lose_nothing(memories: MemoryStore) -> None:
    await memories.astore("alice", "v0", key="k")
    await asyncio.gather(*(memories.aupdate("alice", "k", content=f"w{n}") for n in range(8)))
    versions = await memories.ahistory("alice", "k")
    assert [m.version for m in versions] == list(range(9, 0, -1))
    assert {m.content for m in versions} == {"v0", *(f"w{n}" for n in range(8))}


async def test_two_upserts_of_a_new_key_make_one_memory(memories: MemoryStore) -> None:
    made = await asyncio.gather(*(memories.astore("alice", f"c{n}", key="new") for n in range(4)))
    assert sorted(m.version for m in made) == [1, 2, 3, 4]
    assert len(await memories.alist("alice")) == 1
    assert len(await memories.ahistory("alice", "new")) == 4


def _update_in_process(
    url: str, schema: str | None, options: dict[str, Any], barrier: Any, results: Any
) -> None:
    async def run() -> str:
        async with MemoryStore(CheckpointRepository(url, schema=schema, **options)) as store:
            barrier.wait(timeout=60)
            try:
                await store.aupdate("alice", "k", content="p", expected_version=1)
            except StaleStateError as exc:
                return f"stale {exc.expected_version} {exc.actual_version}"
            finally:
                await store.repository.aclose()
            return "won"

    results.put(asyncio.run(run()))


@pytest.mark.slow
@pytest.mark.parametrize("name", SQL_BACKENDS)  # in clear: sealing takes no lock of its own
async def test_processes_race_on_one_memory(name: str, tmp_path: Path) -> None:
    async with backend_for(name, tmp_path) as backend:
        store = MemoryStore(await backend.make())
        await store.astore("alice", "v1", key="k")
        ctx = procs.context()
        barrier, results = ctx.Barrier(3), ctx.Queue()
        args = (backend.url, backend.schema, backend.options, barrier, results)
        workers = [ctx.Process(target=_update_in_process, args=args) for _ in range(3)]
        for w in workers:
            w.start()
        outcomes = sorted([await asyncio.to_thread(results.get, True, 120) for _ in workers])
        await asyncio.to_thread(lambda: [w.join(60) for w in workers])
        assert outcomes == ["stale 1 2", "stale 1 2", "won"]
        found = await store.aget("alice", "k")
        assert found is not None and found.version == 2


async def test_two_stores_on_one_database_take_turns(sql_backend: Backend) -> None:
    """A store from a URL and one from a checkpointer: their own engines, one database."""
    shared = MemoryStore(await sql_backend.make())
    assert sql_backend.url is not None
    own = MemoryStore(
        sql_backend.url, schema=sql_backend.schema, keys=sql_backend.keys, **sql_backend.options
    )
    try:
        await own.astore("alice", "v1", key="k")
        outcomes = await asyncio.gather(
            own.aupdate("alice", "k", content="own", expected_version=1),
            shared.aupdate("alice", "k", content="shared", expected_version=1),
            return_exceptions=True,
        )
        assert sum(isinstance(o, StaleStateError) for o in outcomes) == 1, outcomes
        assert [m.version for m in await shared.ahistory("alice", "k")] == [2, 1]
    finally:
        await own.aclose()


async def test_cancelled_writes_leave_whole_versions(memories: MemoryStore) -> None:
    """Writers cancelled at every point of their call: each version is written whole
    or not at all, and the history is the versions that were."""
    await memories.astore("alice", "v0", key="k")

    async def write(n: int) -> None:
        await memories.aupdate("alice", "k", content=f"w{n}", metadata={"n": n})

    for turn, delay in enumerate((0, 0.001, 0.003, 0.01)):
        tasks = [asyncio.ensure_future(write(turn * 10 + n)) for n in range(6)]
        await asyncio.sleep(delay)
        for task in tasks[::2]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    head = await memories.aget("alice", "k")
    assert head is not None
    versions = await memories.ahistory("alice", "k")
    assert [m.version for m in versions] == list(range(head.version, 0, -1))[:20]
    assert versions[0] == head
    contents = [m.content for m in versions]
    assert len(set(contents)) == len(contents)  # each write once
    assert all(m.metadata == {"n": int(m.content[1:])} for m in versions if m.version > 1)
    again = await memories.aupdate("alice", "k", content="after", expected_version=head.version)
    assert again.version == head.version + 1  # no lock was left behind


@pytest.mark.parametrize("one_step", [True, False], ids=["one-step", "locked"])
async def test_stores_and_deletes_of_one_key_at_once_never_fail(
    memories: MemoryStore, one_step: bool
) -> None:
    """A store whose insert found the memory, deleted before its lock took it, makes
    it again (it failed with DatabaseError: a row expected, none found)."""
    if not one_step:
        memories.fast = None  # the locked path, as under contention
    for _ in range(6):
        outcomes = await asyncio.gather(
            *(
                memories.astore("alice", f"c{n}", key="k")
                if n % 2
                else memories.adelete("alice", "k")
                for n in range(8)
            ),
            memories.astore_many("alice", ["x", {"content": "y", "key": "k"}]),
            return_exceptions=True,
        )
        assert [o for o in outcomes if isinstance(o, BaseException)] == []
