"""Versioned state: compare-and-swap, pruning, messages (every backend)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from tenxstore import CheckpointRepository, ConfigError, StaleStateError
from tests.conftest import Backend, cfg


async def test_a_new_thread_reads_as_none_at_version_zero(cp: CheckpointRepository) -> None:
    config = cfg()
    assert await cp.aget_state(config) is None
    assert config["_checkpoint_version"] == 0
    assert await cp.aget_state_cache(config) is None


async def test_write_then_read(cp: CheckpointRepository) -> None:
    config = cfg()
    assert await cp.aput_checkpoint(config, {"step": 1}) == 1
    assert config["_checkpoint_version"] == 1
    reader = cfg()
    assert await cp.aget_state(reader) == {"step": 1}
    assert reader["_checkpoint_version"] == 1
    assert await cp.aput_state(config, {"step": 2}) == 2
    assert await cp.aget_state(reader) == {"step": 2}
    # Cached: version 2 is cached, so version 1 is refused. Bare: there is no cache.
    assert await cp.aput_state_cache(cfg(), {"step": 1}, 1) is False


async def test_the_three_runs_of_the_seed_document(cp: CheckpointRepository) -> None:
    a, b, c = cfg(), cfg(), cfg()
    for run in (a, b, c):
        assert await cp.aget_state_cache(run) is None
        assert run["_checkpoint_version"] == 0
    assert await cp.aput_checkpoint(a, {"by": "A"}) == 1
    for loser in (b, c):
        with pytest.raises(StaleStateError) as err:
            await cp.aput_checkpoint(loser, {"by": "loser"}, [{"id": "m", "content": "x"}])
        assert (err.value.thread_id, err.value.expected_version, err.value.actual_version) == (
            "t1",
            0,
            1,
        )
    assert await cp.aget_messages(cfg()) == []  # nothing of the losers was written
    assert await cp.aget_state_cache(b) == {"by": "A"}
    assert await cp.aput_checkpoint(b, {"by": "B"}) == 2
    assert await cp.aget_state_cache(cfg()) == {"by": "B"}
    assert await cp.aget_state(cfg()) == {"by": "B"}


async def test_a_config_that_never_read_writes_on_top(cp: CheckpointRepository) -> None:
    await cp.aput_state(cfg(), {"n": 1})
    await cp.aput_state(cfg(), {"n": 2})
    assert await cp.aput_state(cfg(), {"n": 3}) == 3


async def test_configurable_keys_langgraph_style(cp: CheckpointRepository) -> None:
    config: dict[str, Any] = {"configurable": {"thread_id": "t", "user_id": "u"}}
    assert await cp.aput_state(config, {"x": 1}) == 1
    assert config["configurable"]["_checkpoint_version"] == 1
    assert "_checkpoint_version" not in config
    stale: dict[str, Any] = {"configurable": {"thread_id": "t", "user_id": "u"}}
    await cp.aget_state(stale)
    await cp.aput_state(config, {"x": 2})
    with pytest.raises(StaleStateError):
        await cp.aput_state(stale, {"x": 3})


async def test_pruning_keeps_exactly_the_newest_versions(backend: Backend) -> None:
    cp = await backend.make(state_history_limit=3)
    config = cfg()
    for step in range(1, 8):
        await cp.aput_checkpoint(config, {"step": step}, [{"id": f"m{step}", "step": step}])
    snapshots = await cp.alist_states(cfg())
    assert [s.version for s in snapshots] == [7, 6, 5]
    assert [s.state for s in snapshots] == [{"step": 7}, {"step": 6}, {"step": 5}]
    assert [s.version for s in await cp.alist_states(cfg(), limit=2)] == [7, 6]
    assert len(await cp.aget_messages(cfg())) == 7  # messages are never pruned


async def test_snapshot_meta_and_times(cp: CheckpointRepository) -> None:
    await cp.aput_state(cfg(), {"a": 1}, meta={"node": "plan"})
    await cp.aput_state(cfg(), {"a": 2})
    new, old = await cp.alist_states(cfg())
    assert (old.meta, new.meta) == ({"node": "plan"}, {})
    assert old.created_at.tzinfo is not None and old.created_at <= new.created_at


async def test_messages_deduplicated_ordered_and_ids_assigned(cp: CheckpointRepository) -> None:
    config = cfg()
    first = [{"role": "user", "content": "hi"}, {"id": "a1", "role": "assistant", "content": "yo"}]
    await cp.aput_checkpoint(config, {"s": 1}, first)
    assert isinstance(first[0]["id"], str) and first[0]["id"]
    again = [
        {"id": "a1", "role": "assistant", "content": "CHANGED"},
        {"id": "u2", "role": "user", "content": "more"},
        {"id": "u2", "role": "user", "content": "dup in batch"},
    ]
    await cp.aput_checkpoint(config, {"s": 2}, again)
    stored = await cp.aget_messages(cfg())
    assert [m["id"] for m in stored] == [first[0]["id"], "a1", "u2"]
    assert stored[1]["content"] == "yo"  # an id already stored keeps its first content
    assert stored[2]["content"] == "more"
    assert stored[0] == first[0]
    assert [m["id"] for m in await cp.aget_messages(cfg(), after_id="a1")] == ["u2"]
    assert [m["id"] for m in await cp.aget_messages(cfg(), limit=2)] == [first[0]["id"], "a1"]
    assert [m["id"] for m in await cp.aget_messages(cfg(), after_id=first[0]["id"], limit=1)] == [
        "a1"
    ]
    assert await cp.aget_messages(cfg(), after_id="nope") == []
    assert await cp.aget_messages(cfg(), limit=0) == []


async def test_message_order_survives_many_writes(cp: CheckpointRepository) -> None:
    config = cfg()
    for i in range(30):
        await cp.aput_checkpoint(config, {"i": i}, [{"id": f"z{29 - i:02d}", "i": i}])
    assert [m["i"] for m in await cp.aget_messages(cfg())] == list(range(30))


async def test_ten_first_writers_race_on_a_new_thread(cp: CheckpointRepository) -> None:
    configs = [cfg("fresh") for _ in range(10)]
    for config in configs:
        await cp.aget_state_cache(config)

    async def write(i: int, config: dict[str, Any]) -> int | StaleStateError:
        try:
            return await cp.aput_state(config, {"writer": i})
        except StaleStateError as exc:
            return exc

    results = await asyncio.gather(*(write(i, c) for i, c in enumerate(configs)))
    assert sorted(r for r in results if isinstance(r, int)) == [1]
    stale = [r for r in results if isinstance(r, StaleStateError)]
    assert len(stale) == 9
    assert all((e.expected_version, e.actual_version) == (0, 1) for e in stale)


async def test_contention_read_increment_write(cp: CheckpointRepository) -> None:
    tasks, cycles = 8, 10  # 80 increments, each read-modify-write racing 7 others
    conflicts = 0

    async def worker() -> None:
        nonlocal conflicts
        for _ in range(cycles):
            while True:
                config = cfg("counter")
                state = await cp.aget_state_cache(config) or {"n": 0}
                await asyncio.sleep(0)  # let the others read the same version
                try:
                    await cp.aput_state(config, {"n": state["n"] + 1})
                    break
                except StaleStateError:
                    conflicts += 1

    await asyncio.gather(*(worker() for _ in range(tasks)))
    total = tasks * cycles
    config = cfg("counter")
    assert await cp.aget_state(config) == {"n": total}
    assert config["_checkpoint_version"] == total
    thread = await cp.aget_thread(cfg("counter"))
    assert thread is not None and thread.version == total
    versions = [s.version for s in await cp.alist_states(cfg("counter"))]
    assert versions == list(range(total, total - cp.state_history_limit, -1))
    assert conflicts > 0


async def test_in_memory_needs_no_setup() -> None:
    from tenxstore import InMemoryCheckpointer

    async with InMemoryCheckpointer() as cp:
        assert await cp.aget_state(cfg()) is None
        assert await cp.aput_state(cfg(), {"x": 1}) == 1


@pytest.mark.parametrize("read", ["aget_state", "aget_state_cache"])
async def test_a_read_from_before_a_delete_never_writes(
    cp: CheckpointRepository, read: str
) -> None:
    for n in (1, 2, 3):
        await cp.aput_state(cfg(), {"life": 1, "n": n})
    old_run = cfg()
    assert await getattr(cp, read)(old_run) == {"life": 1, "n": 3}
    assert old_run["_checkpoint_version"] == 3
    assert await cp.aclean_thread(cfg()) is True
    fresh = cfg()
    assert await cp.aget_state(fresh) is None and fresh["_checkpoint_version"] == 0
    for n in (1, 2, 3):  # a new life of the same id reaches the same version
        assert await cp.aput_state(cfg(), {"life": 2, "n": n}) == n
    with pytest.raises(StaleStateError) as err:
        await cp.aput_state(old_run, {"life": 1, "n": 4})
    assert err.value.replaced and (err.value.expected_version, err.value.actual_version) == (3, 3)
    assert "deleted or replaced" in str(err.value)
    assert await cp.aget_state(cfg()) == {"life": 2, "n": 3}
    assert await getattr(cp, read)(old_run) == {"life": 2, "n": 3}  # re-read, then it works
    assert await cp.aput_state(old_run, {"life": 2, "n": 4}) == 4


async def test_a_read_from_before_an_import_replace_never_writes(cp: CheckpointRepository) -> None:
    for n in (1, 2, 3):
        await cp.aput_state(cfg(), {"n": n})
    backup = await cp.aexport_thread(cfg())
    assert backup is not None
    old_run = cfg()
    await cp.aget_state_cache(old_run)  # read at version 3
    await cp.aput_state(cfg(), {"n": 4})
    assert await cp.aimport_thread(backup, on_conflict="replace") == "replaced"  # at 3 again
    with pytest.raises(StaleStateError) as err:
        await cp.aput_state(old_run, {"n": "overwrites the restore"})
    assert err.value.replaced
    assert await cp.aget_state_cache(cfg()) == {"n": 3}


async def test_the_incarnation_is_recorded_beside_the_version(cp: CheckpointRepository) -> None:
    config: dict[str, Any] = {"configurable": {"thread_id": "t", "user_id": "u"}}
    await cp.aput_state(config, {"x": 1})
    life = config["configurable"]["_checkpoint_incarnation"]
    assert isinstance(life, int) and isinstance(config["configurable"]["_checkpoint_version"], int)
    reader = {"thread_id": "t", "user_id": "u"}
    await cp.aget_state_cache(reader)
    assert reader["_checkpoint_incarnation"] == life
    await cp.aclean_thread(reader)
    await cp.aget_state(reader)  # no thread: nothing to record beside version 0
    assert reader["_checkpoint_version"] == 0 and "_checkpoint_incarnation" not in reader
    await cp.aput_state(reader, {"x": "again"})
    assert reader["_checkpoint_incarnation"] > life  # every new life is a larger number


async def test_an_import_refuses_counts_its_columns_cannot_hold(cp: CheckpointRepository) -> None:
    """Checked before any I/O, on every backend alike (SQLite would store them; a
    version at the column's limit would make every later write fail)."""
    await cp.aput_state(cfg(), {"a": 1})
    await cp.abegin_tool_execution(cfg(), "c", "tool", {})
    export = await cp.aexport_thread(cfg())
    assert export is not None
    call = dataclasses.replace(export.tool_executions[0], attempts=3_000_000_000)
    top = 2**63 - 1
    at_the_top = dataclasses.replace(
        export,
        thread=dataclasses.replace(export.thread, version=top),
        states=(dataclasses.replace(export.states[0], version=top),),
    )
    for bad, what in (
        (dataclasses.replace(export, tool_executions=(call,)), "attempts"),
        (at_the_top, "version"),
    ):
        with pytest.raises(ConfigError, match=what):
            await cp.aimport_thread(bad, on_conflict="replace")
    assert await cp.aexport_thread(cfg()) == export  # nothing was written
