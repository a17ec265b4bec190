"""The sync twins: from threads, from a plain program and from inside a running loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from tenxstore import MemoryStore, StaleStateError


async def test_sync_twins_from_threads(memories: MemoryStore) -> None:
    made = await asyncio.to_thread(memories.store, "alice", "sync tea", key="k")
    assert await asyncio.to_thread(memories.get, "alice", "k") == made
    updates = await asyncio.gather(
        *(
            asyncio.to_thread(memories.update, "alice", "k", content=f"t{n}", expected_version=1)
            for n in range(3)
        ),
        return_exceptions=True,
    )
    assert sum(isinstance(u, StaleStateError) for u in updates) == 2
    assert [
        h.memory.key for h in await asyncio.to_thread(memories.search, "alice", "t0 t1 t2")
    ] == ["k"]
    assert len(await asyncio.to_thread(memories.history, "alice", "k")) == 2
    assert len(await asyncio.to_thread(memories.list, "alice")) == 1
    assert await asyncio.to_thread(memories.list_namespaces, "alice") == [("memories",)]
    assert await asyncio.to_thread(memories.delete, "alice", "k") is True
    assert await asyncio.to_thread(memories.sweep_expired) == 0


async def test_a_sync_twin_inside_a_running_loop_works(memories: MemoryStore) -> None:
    made = memories.store("alice", "from the loop's thread", key="k")
    assert memories.get("alice", "k") == made
    assert (await memories.aget("alice", "k")) == made


def test_sync_in_a_plain_program(tmp_path: Path) -> None:
    script = """
import tenxstore
store = tenxstore.MemoryStore("sqlite:///plain.db")
store.setup()
store.store("alice", "plain program", key="k")
print(store.get("alice", "k").content, store.search("alice", "plain")[0].score)
store.close()
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plain", "program", "1.0"]
