"""Thread records: create, update, list, clean (every backend)."""

from __future__ import annotations

import asyncio

from tenxstore import CheckpointRepository
from tests.conftest import Backend, cfg


async def test_put_thread_creates_and_updates_without_touching_the_version(
    cp: CheckpointRepository,
) -> None:
    created = await cp.aput_thread(cfg(), name="first", metadata={"tag": 1})
    assert (created.thread_id, created.user_id, created.name, created.metadata) == (
        "t1",
        "alice",
        "first",
        {"tag": 1},
    )
    assert created.version == 0
    assert created.created_at is not None and created.created_at.tzinfo is not None
    await cp.aput_state(cfg(), {"s": 1})
    renamed = await cp.aput_thread(cfg(), name="second")
    assert (renamed.name, renamed.metadata, renamed.version) == ("second", {"tag": 1}, 1)
    retagged = await cp.aput_thread(cfg(), metadata={"tag": 2})
    assert (retagged.name, retagged.metadata, retagged.version) == ("second", {"tag": 2}, 1)
    assert retagged.created_at == created.created_at
    assert retagged.updated_at is not None and created.updated_at is not None
    assert retagged.updated_at >= created.updated_at
    config = cfg()
    assert await cp.aget_state(config) == {"s": 1}
    assert config["_checkpoint_version"] == 1
    assert await cp.aget_thread(cfg()) == retagged


async def test_a_thread_without_state_reads_as_none(cp: CheckpointRepository) -> None:
    await cp.aput_thread(cfg(), name="empty")
    config = cfg()
    assert await cp.aget_state(config) is None
    assert config["_checkpoint_version"] == 0
    assert await cp.aput_state(config, {"s": 1}) == 1


async def test_list_threads_newest_updated_first_with_paging(cp: CheckpointRepository) -> None:
    for name in ("a", "b", "c", "d"):
        await cp.aput_state(cfg(name), {"n": name})
    await cp.aput_state(cfg("other", "bob"), {"n": "bob's"})
    await cp.aput_state(cfg("b"), {"n": "b again"})
    listed = [t.thread_id for t in await cp.alist_threads({"user_id": "alice"})]
    assert listed == ["b", "d", "c", "a"]
    page = await cp.alist_threads({"user_id": "alice"}, limit=2, offset=1)
    assert [t.thread_id for t in page] == ["d", "c"]
    assert await cp.alist_threads({"user_id": "alice"}, limit=0) == []
    assert [t.version for t in await cp.alist_threads({"user_id": "alice"})] == [2, 1, 1, 1]


async def test_clean_thread_removes_everything(cp: CheckpointRepository) -> None:
    await cp.aput_checkpoint(cfg(), {"s": 1}, [{"id": "m1"}, {"id": "m2"}])
    await cp.aput_checkpoint(cfg("keep"), {"s": 1}, [{"id": "m1"}])
    assert await cp.aclean_thread(cfg()) is True
    assert await cp.aclean_thread(cfg()) is False
    assert await cp.aget_thread(cfg()) is None
    assert await cp.alist_states(cfg()) == []
    assert await cp.aget_messages(cfg()) == []
    config = cfg()
    assert await cp.aget_state(config) is None
    assert await cp.aput_state(config, {"again": True}) == 1  # a new life starts at 1
    assert await cp.aget_messages(cfg("keep")) == [{"id": "m1"}]


async def test_writes_racing_deletes_raise_only_tenxstores_errors(sql_backend: Backend) -> None:
    """Writers that create a thread (a state, a LangGraph checkpoint) while another
    process's checkpointer deletes it again and again: each write commits or raises a
    tenxstore error (a delete may take away the row a writer found before its lock is
    granted — that writer creates the thread again), never a driver's or SQLAlchemy's."""
    from langgraph.checkpoint.base import empty_checkpoint

    from tenxstore import TenxStoreError
    from tenxstore.langgraph import TenxCheckpointSaver

    writer, deleter = await sql_backend.make(), await sql_backend.make()
    saver = TenxCheckpointSaver(writer).for_user("alice")
    foreign: list[BaseException] = []
    deletes = 0

    async def delete() -> None:
        nonlocal deletes
        while deletes < 40:
            await deleter.aclean_thread(cfg())
            deletes += 1
            await asyncio.sleep(0)

    async def write(kind: str) -> int:
        done = 0
        while deletes < 40:
            try:
                if kind == "state":
                    await writer.aput_checkpoint(cfg(), {"n": done}, [])
                else:
                    config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
                    await saver.aput(config, empty_checkpoint(), {"source": "input"}, {})
                done += 1
            except TenxStoreError:
                pass
            except Exception as err:  # what the test looks for
                foreign.append(err)
            await asyncio.sleep(0)
        return done

    _, states, checkpoints = await asyncio.gather(delete(), write("state"), write("langgraph"))
    assert not foreign, foreign
    assert states and checkpoints
