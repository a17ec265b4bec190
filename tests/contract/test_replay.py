"""A sealed value replayed across a thread's lives, or under another owner, never opens.

Someone who can write to the database (or holds a backup, a WAL, a replica) copies
alice's old ciphertext into the row of a thread that is no longer hers: her thread
``ta`` was erased and eve created ``ta`` again, or alice created it again herself (a
new life: what was erased stays erased), or the thread row was given to another user.
Every value is bound to the thread's incarnation and owner as well as to its thread id
and column, so each read raises ``DecryptionError`` — and once eve's own value is put
back, the same read gives eve's data (the failure is the replay's, nothing else's).
"""

from __future__ import annotations

import asyncio
import base64
import collections
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from redis.asyncio import Redis
from sqlalchemy import text

import tenxstore
from tenxstore import AuthPolicy, DecryptionError, KeyRing
from tenxstore.keyusage import akey_usage
from tenxstore.langgraph import TenxCheckpointSaver
from tenxstore.rotation import arotate_keys, astale_rows
from tests import services
from tests.conftest import Backend, backend_for, cfg, drop_schema, new_schema

BACKENDS = ["memory", "sqlite", "postgresql", "pgbouncer", "mariadb"]
LIVES = ["erased", "recreated", "reowned"]
NS = ""
FIRST, SECOND = "1f0a0000-0000-6000-8000-000000000001", "1f0a0000-0000-6000-8000-000000000002"
VERSION = "00000000000000000000000000000001.0.5"


def repository(cp: Any) -> Any:
    return getattr(cp, "inner", cp)


def table(backend: Backend, name: str) -> str:
    return f'"{backend.schema}".{name}' if backend.schema else name


def column(backend: Backend, name: str) -> str:
    """A column name quoted (``blob`` is a reserved word of MariaDB's)."""
    return f"`{name}`" if backend.name == "mariadb" else f'"{name}"'


def lg_config(checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": "ta", "checkpoint_ns": NS}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


async def write_life(cp: Any, user: str, thread: str = "ta") -> None:
    """Thread ``ta`` of ``user``: every payload tenxstore seals holds ``user``'s words.

    Fixed ids everywhere (message, tool call, checkpoints, channel version), so two
    lives of the thread have their values at the same primary keys."""
    config = cfg(thread, user)
    secret = f"{user}'s secret"
    await cp.aput_checkpoint(
        config, {"note": secret}, [{"id": "m1", "content": secret}], meta={"why": secret}
    )
    await cp.aput_thread(config, name=f"{user}'s chat", metadata={"topic": secret})
    await cp.abegin_tool_execution(config, "c1", "search", {"q": secret})
    await cp.acomplete_tool_execution(config, "c1", {"hits": [secret]})
    saver = TenxCheckpointSaver(cp).for_user(user)
    parent = None
    for checkpoint_id in (FIRST, SECOND):
        checkpoint = {**empty_checkpoint(), "id": checkpoint_id}
        checkpoint["channel_values"] = {"notes": [secret, checkpoint_id]}
        checkpoint["channel_versions"] = {"notes": VERSION if parent is None else VERSION + "1"}
        versions = checkpoint["channel_versions"]
        start = {"configurable": {"thread_id": thread, "checkpoint_ns": NS}}
        stored = await saver.aput(parent or start, checkpoint, {"step": 0}, versions)
        await saver.aput_writes(stored, [("notes", secret)], "task-1")
        parent = stored


# (table, columns copied, the row's key, a read of it by the thread's owner now)
Read = Callable[[Any, str], Awaitable[Any]]


async def _state(cp: Any, user: str) -> Any:
    return await cp.aget_state(cfg("ta", user))


async def _meta(cp: Any, user: str) -> Any:
    return (await cp.alist_states(cfg("ta", user)))[0].meta


async def _messages(cp: Any, user: str) -> Any:
    return await cp.aget_messages(cfg("ta", user))


async def _thread(cp: Any, user: str) -> Any:
    info = await cp.aget_thread(cfg("ta", user))
    return info.name, info.metadata


async def _listed(cp: Any, user: str) -> Any:
    return [(i.name, i.metadata) for i in await cp.alist_threads({"user_id": user})]


async def _call(cp: Any, user: str) -> Any:
    call = await cp.aget_tool_execution(cfg("ta", user), "c1")
    return call.args, call.result


async def _tuple(cp: Any, user: str, checkpoint_id: str) -> Any:
    saver = TenxCheckpointSaver(cp).for_user(user)
    found = await saver.aget_tuple(lg_config(checkpoint_id))
    assert found is not None
    return found.checkpoint["channel_values"], found.pending_writes


async def _checkpoint(cp: Any, user: str) -> Any:
    return await _tuple(cp, user, SECOND)


async def _writes(cp: Any, user: str) -> Any:
    return await _tuple(cp, user, FIRST)


CELLS: list[tuple[str, tuple[str, ...], str, list[Read]]] = [
    ("states", ("state_data",), "version = 1", [_state]),
    ("states", ("meta",), "version = 1", [_meta]),
    ("messages", ("payload",), "message_id = 'm1'", [_messages]),
    ("threads", ("name",), "1 = 1", [_thread, _listed]),
    ("threads", ("metadata",), "1 = 1", [_thread, _listed]),
    ("tool_executions", ("args",), "tool_call_id = 'c1'", [_call]),
    ("tool_executions", ("result",), "tool_call_id = 'c1'", [_call]),
    ("lg_checkpoints", ("type", "checkpoint"), f"checkpoint_id = '{SECOND}'", [_checkpoint]),
    ("lg_writes", ("type", "value"), f"checkpoint_id = '{FIRST}'", [_writes]),
    ("lg_blobs", ("type", "blob"), f"version = '{VERSION}1'", [_checkpoint]),
]


async def cells(backend: Backend, cp: Any, name: str, columns: tuple[str, ...], where: str) -> Any:
    names = ", ".join(column(backend, c) for c in columns)
    sql = f"SELECT {names} FROM {table(backend, name)} WHERE thread_id = 'ta' AND "
    async with repository(cp).engine.connect() as conn:
        [row] = (await conn.execute(text(sql + where))).all()
    return tuple(row)


async def put_cells(
    backend: Backend, cp: Any, name: str, columns: tuple[str, ...], where: str, values: Any
) -> None:
    sets = ", ".join(f"{column(backend, c)} = :v{i}" for i, c in enumerate(columns))
    sql = f"UPDATE {table(backend, name)} SET {sets} WHERE thread_id = 'ta' AND {where}"
    params = {f"v{i}": value for i, value in enumerate(values)}
    async with repository(cp).engine.begin() as conn:
        assert (await conn.execute(text(sql), params)).rowcount == 1


async def sql(backend: Backend, cp: Any, statement: str) -> None:
    async with repository(cp).engine.begin() as conn:
        await conn.execute(text(statement.format(threads=table(backend, "threads"))))


async def alices_values(backend: Backend, cp: Any) -> list[Any]:
    return [await cells(backend, cp, name, cols, where) for name, cols, where, _ in CELLS]


async def replays_opened(
    backend: Backend, cp: Any, old: list[Any], reader: str, *, restore: bool = True
) -> list[str]:
    """Each of ``old`` (alice's values, by :data:`CELLS`) put in place of the reader's
    and read by the reader: the reads that did not raise ``DecryptionError``, named
    with what they gave. ``restore``: the reader's own value is put back after each,
    and must read as it did (else ``old`` is in the row already)."""
    opened: list[str] = []
    for (table_name, columns, where, reads), alices in zip(CELLS, old, strict=True):
        theirs = await cells(backend, cp, table_name, columns, where)
        expected = [await read(cp, reader) for read in reads] if restore else None
        if restore:
            await put_cells(backend, cp, table_name, columns, where, alices)
        for read in reads:
            try:
                leaked = await read(cp, reader)
            except DecryptionError as exc:
                assert exc.thread_id == "ta" and "authentication failed" in str(exc)
            else:  # every replay that opened is named
                opened.append(f"{table_name}.{columns[-1]} by {read.__name__}: {leaked!r}")
        if restore:  # the reader's own value back: it reads again
            await put_cells(backend, cp, table_name, columns, where, theirs)
            assert [await read(cp, reader) for read in reads] == expected
    return opened


@pytest.mark.parametrize("life", LIVES)
@pytest.mark.parametrize("name", BACKENDS)
async def test_a_sealed_value_replayed_into_another_life_or_owner_does_not_open(
    name: str, life: str, tmp_path: Path
) -> None:
    async with backend_for(f"{name}+encrypted", tmp_path) as backend:
        cp = await backend.make()
        await write_life(cp, "alice")
        old = await alices_values(backend, cp)
        if life == "reowned":  # the same life, given to eve by a write to the database
            reader = "eve"
            await sql(backend, cp, "UPDATE {threads} SET user_id = 'eve' WHERE thread_id = 'ta'")
        else:
            if life == "erased":  # alice erased; eve creates the thread id again
                reader = "eve"
                assert (await cp.adelete_user("alice")).threads == 1
            else:  # alice deletes her thread and starts it again: a new life
                reader = "alice"
                assert await cp.aclean_thread(cfg("ta", "alice"))
            await write_life(cp, reader)
        assert await replays_opened(backend, cp, old, reader, restore=life != "reowned") == []
        if life == "reowned":  # the owner put back: alice reads every value of hers
            await sql(backend, cp, "UPDATE {threads} SET user_id = 'alice' WHERE thread_id = 'ta'")
            for _, _, _, reads in CELLS:
                for read in reads:
                    assert "alice's" in repr(await read(cp, "alice"))


@pytest.mark.parametrize("name", ["sqlite+redis", "postgresql+redis"])
async def test_the_cache_never_serves_a_replayed_life(name: str, tmp_path: Path) -> None:
    """A cache entry is bound to its key (the thread and the user it is served to), the
    version and the incarnation it carries: another user's entry replayed under eve's
    key does not open; an entry of an older life replayed under its own key is not
    served to a run that recorded the thread's current life; and alice's ciphertext
    replayed into eve's row is never read into eve's cache entry."""
    async with backend_for(f"{name}+encrypted", tmp_path) as backend:
        cp = await backend.make()
        shared = {"auth_policy": AuthPolicy(enforce_user_isolation=False)}
        await cp.aput_checkpoint(cfg("ta", "alice"), {"note": "alice's secret"})
        assert await cp.aget_state_cache(cfg("ta", "alice", **shared)) == {"note": "alice's secret"}
        client = Redis.from_url(backend.redis_url)
        try:
            keys = {k async for k in client.scan_iter(match=f"{backend.key_prefix}:*")}
            [mine] = [k for k in keys if k.endswith(b":ta:alice")]
            [unscoped] = [k for k in keys if k.endswith(b":ta:*")]
            alices, alices_shared = await client.get(mine), await client.get(unscoped)
            old = await cells(backend, cp, "states", ("state_data",), "version = 1")
            assert (await cp.adelete_user("alice")).threads == 1
            eve = cfg("ta", "eve")
            await cp.aput_checkpoint(eve, {"note": "eve's"})
            assert await cp.aget_state_cache(cfg("ta", "eve")) == {"note": "eve's"}
            [evekey] = [
                k
                async for k in client.scan_iter(match=f"{backend.key_prefix}:*")
                if k.endswith(b":ta:eve")
            ]
            # alice's entry under eve's key: bound to its key, it does not open (a miss)
            await client.set(evekey, alices)
            assert await cp.aget_state_cache(cfg("ta", "eve")) == {"note": "eve's"}
            # the unscoped entry of alice's life under its own key: a run that wrote
            # (or read) eve's life is not served it
            await client.set(unscoped, alices_shared)
            assert await cp.aget_state_cache({**eve, **shared}) == {"note": "eve's"}
            # alice's ciphertext in eve's row, eve's entry gone: the database read
            # refuses it, and nothing of it reaches the cache
            await put_cells(backend, cp, "states", ("state_data",), "version = 1", old)
            await client.delete(evekey)
            with pytest.raises(DecryptionError):
                await cp.aget_state_cache(cfg("ta", "eve"))
            assert await client.get(evekey) is None  # nothing of it was cached
            with pytest.raises(DecryptionError):
                await cp.aget_state_cache(cfg("ta", "eve"))
        finally:
            await client.aclose()


KEY = bytes(range(32))  # TEST_KEYS's "test-k1"


# -- a store of both formats, a shared thread, a copy ----------------------------------

PAYLOADS = [
    ("threads", "name"), ("threads", "metadata"), ("states", "state_data"), ("states", "meta"),
    ("messages", "payload"), ("tool_executions", "args"), ("tool_executions", "result"),
    ("tool_executions", "error"), ("lg_checkpoints", "checkpoint"), ("lg_writes", "value"),
    ("lg_blobs", "blob"),
]  # fmt: skip


def envelope_format(value: Any, kind: str | None) -> str:
    """``tx1``, ``tx2`` or ``plain``: a text by its mark, a LangGraph value by its type's."""
    if kind is None:
        return value[1:4] if value[:1] == "!" else "plain"
    return bytes(value)[:3].decode() if kind[:1] == "!" else "plain"


async def formats(backend: Backend, cp: Any) -> collections.Counter[str]:
    """Every payload value of the store by its envelope format (``plain``: in clear)."""
    found: collections.Counter[str] = collections.Counter()
    async with repository(cp).engine.connect() as conn:
        for name, col in PAYLOADS:
            typed = name.startswith("lg_")
            kind = "type" if typed else "NULL"
            sql = f"SELECT {column(backend, col)}, {kind} FROM {table(backend, name)}"
            for value, of in await conn.execute(text(sql)):
                if value is not None:
                    found[envelope_format(value, of if typed else None)] += 1
    return found


@pytest.mark.parametrize("name", ["sqlite", "postgresql", "pgbouncer", "mariadb"])
async def test_a_store_of_both_envelopes_reads_counts_and_rotates_into_the_binding(
    name: str, tmp_path: Path
) -> None:
    """Values an instance still sealing tx1 wrote (an upgrade under way) beside tx2 ones:
    every one reads (a strict ring too), the key counts hold both (``previous_format``
    the tx1 ones), a rotation seals the tx1 ones again as tx2 — after which a copy of
    one into a later life of its thread no longer opens."""
    async with backend_for(f"{name}+encrypted", tmp_path) as backend:
        upgrading = KeyRing([("test-k1", KEY)], envelope="tx1")
        await write_life(await backend.make(keys=upgrading), "alice")  # ta: tx1
        cp = await backend.make()
        await write_life(cp, "bob", "tb")  # tb: tx2
        before = await formats(backend, cp)
        assert before["tx1"] > 0 and before["tx2"] == before["tx1"] and before["plain"] == 0
        usage = await akey_usage(cp)
        assert usage.previous_format == before["tx1"]
        assert dict(usage.by_key) == {"test-k1": before["tx1"] + before["tx2"]}
        assert usage.unopened == {"test-k1": 0} and usage.tried["test-k1"] > 0
        assert await astale_rows(cp) > 0  # tx1 is not the ring's format: to be rotated
        strict = await backend.make(keys=KeyRing([("test-k1", KEY)], require_sealed=True))
        for reader in (cp, strict):
            for _, _, _, reads in CELLS:
                for read in reads:
                    assert "alice's" in repr(await read(reader, "alice"))
        result = await arotate_keys(cp, batch_size=4)
        assert result.done and sum(result.rotated.values()) > 0
        after = await formats(backend, cp)
        assert after == {"tx2": before["tx1"] + before["tx2"]}
        assert (await akey_usage(cp)).previous_format == 0
        for _, _, _, reads in CELLS:
            for read in reads:
                assert "alice's" in repr(await read(cp, "alice"))
        old = await alices_values(backend, cp)  # rotated: bound to ta's life now
        assert (await cp.adelete_user("alice")).threads == 1
        await write_life(cp, "eve")
        assert await replays_opened(backend, cp, old, "eve") == []


@pytest.mark.parametrize("name", BACKENDS)
async def test_a_shared_thread_is_sealed_for_its_owner_whoever_writes(
    name: str, tmp_path: Path
) -> None:
    """Isolation off: the owner a value is bound to is the thread row's ``user_id`` (a
    user, or none), not the caller's. A write by another user that read the thread —
    whose one-step write presumed itself the owner — is sealed for the row's owner, and
    everyone reads it; the owner stays as it was."""
    async with backend_for(f"{name}+encrypted", tmp_path) as backend:
        cp = await backend.make(enforce_user_isolation=False)
        await cp.aput_checkpoint(cfg("s", "alice"), {"n": 0})  # owned by alice
        await cp.aput_checkpoint({"thread_id": "n"}, {"n": 0})  # owned by no user
        saver = TenxCheckpointSaver(cp)
        for thread in ("s", "n"):
            owner = {"s": "alice", "n": None}[thread]
            bob = cfg(thread, "bob")
            assert await cp.aget_state(bob) == {"n": 0}  # read: the life recorded
            await cp.aput_checkpoint(bob, {"n": 1}, [{"id": "b1", "content": "bob's"}])
            await cp.aput_checkpoint(bob, {"n": 2}, meta={"by": "bob"})
            await cp.aput_thread(bob, name="named by bob", metadata={"k": "v"})
            await cp.arun_tool_once(bob, "c1", "t", {"q": 1}, lambda q: q + 1)
            run = {"configurable": {"thread_id": thread, "checkpoint_ns": "", "user_id": "bob"}}
            parent = None
            for step, checkpoint_id in enumerate((FIRST, SECOND)):
                checkpoint = {**empty_checkpoint(), "id": checkpoint_id}
                checkpoint["channel_values"] = {"notes": [f"bob {step}"]}
                checkpoint["channel_versions"] = {"notes": VERSION + str(step)}
                versions = checkpoint["channel_versions"]
                parent = await saver.aput(parent or run, checkpoint, {"step": step}, versions)
                await saver.aput_writes(parent, [("notes", f"bob {step}")], "task-1")
            for reader in ("alice", "bob", None):
                config = {"thread_id": thread} if reader is None else cfg(thread, reader)
                assert await cp.aget_state(config) == {"n": 2}
                assert (await cp.alist_states(config))[0].meta == {"by": "bob"}
                assert (await cp.aget_messages(config))[0]["content"] == "bob's"
                info = await cp.aget_thread(config)
                assert (info.user_id, info.name) == (owner, "named by bob")
                assert (await cp.aget_tool_execution(config, "c1")).result == 2
                found = await saver.aget_tuple(
                    {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
                )
                assert found is not None
                assert found.checkpoint["channel_values"] == {"notes": ["bob 1"]}
                assert found.pending_writes == [("task-1", "notes", "bob 1")]


def test_a_sealed_store_copied_or_exported_elsewhere_is_sealed_for_its_lives_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tenxstore copy`` of a sealed SQLite store to PostgreSQL, and ``export --sealed``
    then ``import``: the target gives each thread a life of its own (another
    incarnation), and every value is opened and sealed again for it — everything reads
    back, and a value copied as it is from the source does not open there."""
    from tests.test_cli import export_all, invoke

    monkeypatch.setenv("TENXSTORE_KEYS", f"test-k1:{base64.b64encode(KEY).decode()}")
    source = f"sqlite:///{tmp_path / 'source.db'}"
    schemas = [new_schema(), new_schema()]

    async def fill() -> None:
        async with tenxstore.CheckpointRepository(source) as repo:
            await repo.asetup()
            await write_life(repo, "alice")
            await write_life(repo, "bob", "tb")
        for schema in schemas:  # the targets' incarnations run ahead of the source's
            async with tenxstore.CheckpointRepository(services.pg_url(), schema=schema) as repo:
                await repo.asetup()
                for n in range(7):
                    await repo.aput_thread(cfg(f"x{n}", "z"), name="x")
                    await repo.aclean_thread(cfg(f"x{n}", "z"))

    async def lives(url: str, schema: str | None) -> dict[str, tuple[int, str]]:
        async with (
            tenxstore.CheckpointRepository(url, schema=schema) as repo,
            repo.engine.connect() as conn,
        ):
            where = f'"{schema}".threads' if schema else "threads"
            rows = await conn.execute(text(f"SELECT thread_id, incarnation, user_id FROM {where}"))
            return {r.thread_id: (r.incarnation, r.user_id) for r in rows}

    async def replay_refused(schema: str) -> None:
        async with tenxstore.CheckpointRepository(source) as src, src.engine.connect() as conn:
            stored = (
                await conn.execute(text("SELECT state_data FROM states WHERE thread_id = 'ta'"))
            ).scalar()
        async with tenxstore.CheckpointRepository(services.pg_url(), schema=schema) as dst:
            async with dst.engine.begin() as conn:
                await conn.execute(
                    text(f"UPDATE \"{schema}\".states SET state_data = :v WHERE thread_id = 'ta'"),
                    {"v": stored},
                )
            with pytest.raises(DecryptionError, match="authentication failed"):
                await dst.aget_state(cfg("ta", "alice"))

    try:
        asyncio.run(fill())
        copied = invoke("copy", source, services.pg_url(), "--destination-schema", schemas[0])
        assert copied.exit_code == 0 and "2 created" in copied.output, copied.output
        exported = tmp_path / "sealed.jsonl"
        done = invoke("export", "--all", "--url", source, "--sealed", "-o", str(exported))
        assert done.exit_code == 0, done.output
        assert b"alice's" not in exported.read_bytes()
        done = invoke("import", str(exported), "--url", services.pg_url(), "--schema", schemas[1])
        assert done.exit_code == 0 and "2 created" in done.output, done.output
        expected = export_all(["--url", source])
        source_lives = asyncio.run(lives(source, None))
        for schema in schemas:
            assert export_all(["--url", services.pg_url(), "--schema", schema]) == expected
            target_lives = asyncio.run(lives(services.pg_url(), schema))
            assert {t: owner for t, (_, owner) in target_lives.items()} == {
                "ta": "alice",
                "tb": "bob",
            }
            assert all(target_lives[t][0] != source_lives[t][0] for t in ("ta", "tb"))
            asyncio.run(replay_refused(schema))
    finally:
        for schema in schemas:
            asyncio.run(drop_schema(services.pg_url(), schema))


@pytest.mark.parametrize("name", ["sqlite", "postgresql", "mariadb"])
async def test_int_ids_are_bound_as_they_are_stored(name: str, tmp_path: Path) -> None:
    """``id_type`` / ``user_id_type`` ``"int"``: the owner a value is bound to is the
    row's int (the one-statement DeltaChannel history carries it as text on
    PostgreSQL: the same bytes); every payload reads back, and a replay into the
    thread's next life, another user's, does not open."""
    async with backend_for(f"{name}+encrypted", tmp_path, fresh=True) as backend:
        cp = await backend.make(id_type="int", user_id_type="int")
        config = {"thread_id": 7, "user_id": 42}
        await cp.aput_checkpoint(config, {"n": 1}, [{"id": "m1", "content": "42's"}])
        await cp.aput_thread(config, name="42's chat", metadata={"k": 1})
        assert await cp.arun_tool_once(config, "c1", "t", {"q": 1}, lambda q: q + 1) == 2
        saver = TenxCheckpointSaver(cp).for_user(42)  # (LangGraph's loop gives str ids)
        parent: Any = {"configurable": {"thread_id": 7, "checkpoint_ns": NS}}
        for step, checkpoint_id in enumerate((FIRST, SECOND)):
            checkpoint = {**empty_checkpoint(), "id": checkpoint_id}
            checkpoint["channel_values"] = {"notes": [f"42's {step}"]}
            checkpoint["channel_versions"] = {"notes": VERSION + str(step)}
            versions = checkpoint["channel_versions"]
            parent = await saver.aput(parent, checkpoint, {"step": step}, versions)
            await saver.aput_writes(parent, [("notes", f"note {step}")], "task-1")
        found = await saver.aget_tuple(parent)
        assert found is not None and found.checkpoint["channel_values"] == {"notes": ["42's 1"]}
        walked = await saver.aget_delta_channel_history(config=parent, channels=["notes"])
        assert walked["notes"]["seed"] == ["42's 0"]  # the one-statement walk, owner as text
        assert [w[2] for w in walked["notes"]["writes"]] == ["note 0"]
        assert (await cp.aget_thread(config)).name == "42's chat"
        assert (await cp.aget_messages(config))[0]["content"] == "42's"
        assert (await cp.aget_tool_execution(config, "c1")).args == {"q": 1}
        threads, states = table(backend, "threads"), table(backend, "states")
        async with repository(cp).engine.connect() as conn:
            old = (await conn.execute(text(f"SELECT state_data FROM {states}"))).scalar()
            assert (await conn.execute(text(f"SELECT user_id FROM {threads}"))).scalar() == 42
        assert (await cp.adelete_user(42)).threads == 1
        theirs = {"thread_id": 7, "user_id": 43}
        await cp.aput_checkpoint(theirs, {"n": "43's"})
        async with repository(cp).engine.begin() as conn:
            await conn.execute(text(f"UPDATE {states} SET state_data = :v"), {"v": old})
        with pytest.raises(DecryptionError, match="authentication failed"):
            await cp.aget_state(theirs)
