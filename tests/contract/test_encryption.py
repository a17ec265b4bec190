"""Encryption at rest: what the database and Redis hold, and what a reader refuses."""

from __future__ import annotations

import base64
import json
import os
import pickle
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from redis.asyncio import Redis
from sqlalchemy import text

import tenxstore
from tenxstore import ConfigError, DecryptionError, KeyRing, Life, SerializationError
from tenxstore.crypto import BLOB, EXPORT, STATE, is_sealed
from tenxstore.langgraph import TenxCheckpointSaver
from tenxstore.rotation import arotate_keys
from tenxstore.serde import encode
from tests.conftest import TEST_KEYS, Backend, backend_for, cfg

MARKER = "Zebra7Quokka"  # nothing tenxstore writes of its own holds it
OTHER_KEYS = KeyRing([("test-k2", bytes(range(1, 33)))])
PAYLOAD_TABLES = ("threads", "states", "messages", "tool_executions", "lg_writes", "lg_blobs")


def chat(saver: Any) -> Any:
    def reply(state: MessagesState) -> dict[str, Any]:
        return {
            "messages": [AIMessage(content=f"echo {MARKER}", id=f"ai-{len(state['messages'])}")]
        }

    graph = StateGraph(MessagesState).add_node("reply", reply)
    return graph.add_edge(START, "reply").add_edge("reply", END).compile(checkpointer=saver)


async def write_everything(cp: Any, thread: str = "t1") -> None:
    """The marker in every payload tenxstore stores: a state, its meta, a message, a
    tool call's arguments, result and error, the thread's name and metadata, and a
    LangGraph checkpoint's values and writes."""
    config = cfg(thread)
    await cp.aput_checkpoint(
        config,
        {"note": MARKER},
        [{"id": "m1", "role": "user", "content": MARKER}],
        meta={"why": MARKER},
    )
    await cp.aput_thread(config, name=f"name {MARKER}", metadata={"topic": MARKER})
    await cp.abegin_tool_execution(config, "c1", "search", {"q": MARKER})
    await cp.acomplete_tool_execution(config, "c1", {"hits": [MARKER]})
    await cp.abegin_tool_execution(config, "c2", "search", {"q": "x"})
    await cp.afail_tool_execution(config, "c2", f"failed on {MARKER}")
    assert await cp.aget_state_cache(cfg(thread)) == {"note": MARKER}  # cached
    saver = TenxCheckpointSaver(cp).for_user("alice")
    graph = chat(saver)
    run = {"configurable": {"thread_id": thread}}
    for n in range(3):
        await graph.ainvoke({"messages": [HumanMessage(f"{MARKER} {n}", id=f"h{n}")]}, run)


async def raw_cells(backend: Backend, cp: Any) -> dict[str, list[bytes]]:
    """Every cell of every table of the store, as bytes, by table."""
    cells: dict[str, list[bytes]] = {}
    prefix = "" if backend.schema is None else f'"{backend.schema}".'
    async with cp.engine.connect() as conn:
        for table in tenxstore.models.Base.metadata.sorted_tables:
            rows = await conn.execute(text(f"SELECT * FROM {prefix}{table.name}"))
            cells[table.name] = [
                bytes(v) if isinstance(v, (bytes, memoryview)) else str(v).encode()
                for row in rows
                for v in row
            ]
    return cells


async def raw_redis(backend: Backend) -> list[bytes]:
    assert backend.redis_url is not None
    client = Redis.from_url(backend.redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{backend.key_prefix}:*")]
        return [v for v in await client.mget(keys) if v is not None] if keys else []
    finally:
        await client.aclose()


def holds(cells: list[bytes]) -> bool:
    return any(MARKER.encode() in cell for cell in cells)


@pytest.mark.parametrize("name", ["sqlite+redis", "postgresql+redis"])
@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "encrypted"])
async def test_no_table_nor_cache_entry_holds_the_plaintext(
    name: str, sealed: bool, tmp_path: Path
) -> None:
    """Plain, the marker is in every payload table and in Redis (the scan sees them);
    encrypted, in no cell of any table and no Redis value, and every read gives it back."""
    async with backend_for(name, tmp_path) as backend:
        cp = await backend.make(**({"keys": TEST_KEYS} if sealed else {}))
        await write_everything(cp)
        cells, cached = await raw_cells(backend, cp), await raw_redis(backend)
        assert cached
        if not sealed:
            assert all(holds(cells[table]) for table in PAYLOAD_TABLES)
            assert holds(cached)
            return
        assert [table for table, found in cells.items() if holds(found)] == []
        assert not holds(cached)
        config = cfg("t1")
        assert await cp.aget_state_cache(config) == {"note": MARKER}  # from Redis
        assert await cp.aget_state(config) == {"note": MARKER}
        assert (await cp.aget_messages(config))[0]["content"] == MARKER
        assert (await cp.alist_states(config))[0].meta == {"why": MARKER}
        info = await cp.aget_thread(config)
        assert info.name == f"name {MARKER}" and info.metadata == {"topic": MARKER}
        calls = await cp.alist_tool_executions(config)
        assert [c.result for c in calls] == [{"hits": [MARKER]}, None]
        assert calls[0].args == {"q": MARKER} and MARKER in calls[1].error
        saver = TenxCheckpointSaver(cp).for_user("alice")
        values = (await chat(saver).aget_state({"configurable": {"thread_id": "t1"}})).values
        assert [m.content for m in values["messages"]][-2:] == [f"{MARKER} 2", f"echo {MARKER}"]


async def tamper(cp: Any, sql: str) -> None:
    async with cp.engine.begin() as conn:
        await conn.execute(text(sql))


async def test_a_tampered_value_is_refused(tmp_path: Path) -> None:
    async with backend_for("sqlite+encrypted", tmp_path) as backend:
        cp = await backend.make()
        await cp.aput_checkpoint(cfg(), {"note": MARKER}, [{"id": "m1", "content": MARKER}])
        # one base64 character of the ciphertext changed (the last: the tag)
        await tamper(
            cp,
            "UPDATE states SET state_data = substr(state_data, 1, length(state_data) - 2) || "
            "CASE WHEN substr(state_data, -2, 1) = 'A' THEN 'B' ELSE 'A' END || "
            "substr(state_data, -1)",
        )
        with pytest.raises(DecryptionError) as caught:
            await cp.aget_state(cfg())
        assert caught.value.thread_id == "t1" and caught.value.key_id == "test-k1"
        assert "'t1'" in str(caught.value) and "test-k1" in str(caught.value)
        assert (await cp.aget_messages(cfg()))[0]["content"] == MARKER  # the rest reads


async def test_a_wrong_or_missing_key_is_refused(tmp_path: Path) -> None:
    async with backend_for("sqlite+encrypted", tmp_path) as backend:
        await (await backend.make()).aput_checkpoint(cfg(), {"note": MARKER})
        same_id = KeyRing([("test-k1", bytes(32))])  # the id, another key
        for keys, why in ((same_id, "authentication"), (OTHER_KEYS, "not in the key ring")):
            with pytest.raises(DecryptionError, match=why) as caught:
                await (await backend.make(keys=keys)).aget_state(cfg())
            assert caught.value.key_id == "test-k1" and caught.value.column == "states.state_data"
        backend.keys = None
        with pytest.raises(DecryptionError, match="no key ring"):
            await (await backend.make()).aget_state(cfg())
        # the old key still in the ring (second): read
        both = KeyRing([("test-k2", bytes(range(1, 33))), ("test-k1", bytes(range(32)))])
        assert await (await backend.make(keys=both)).aget_state(cfg()) == {"note": MARKER}


async def test_a_value_moved_to_another_thread_or_column_is_refused(tmp_path: Path) -> None:
    async with backend_for("sqlite+encrypted", tmp_path) as backend:
        cp = await backend.make()
        for thread in ("t1", "t2"):
            await cp.aput_checkpoint(cfg(thread), {"note": thread}, meta={"m": thread})
        await tamper(
            cp,
            "UPDATE states SET state_data = "
            "(SELECT state_data FROM states WHERE thread_id = 't1') WHERE thread_id = 't2'",
        )
        with pytest.raises(DecryptionError, match="t2"):
            await cp.aget_state(cfg("t2"))
        await tamper(cp, "UPDATE states SET state_data = meta WHERE thread_id = 't1'")
        with pytest.raises(DecryptionError, match=r"states\.state_data"):
            await cp.aget_state(cfg("t1"))


async def test_plaintext_rows_stay_readable_once_encryption_is_on(tmp_path: Path) -> None:
    async with backend_for("sqlite", tmp_path) as backend:
        await write_everything(await backend.make())
        cp = await backend.make(keys=TEST_KEYS)
        config = cfg("t1")
        assert await cp.aget_state(config) == {"note": MARKER}
        assert (await cp.aget_thread(config)).metadata == {"topic": MARKER}
        saver = TenxCheckpointSaver(cp).for_user("alice")
        graph = chat(saver)
        run = {"configurable": {"thread_id": "t1"}}
        await graph.ainvoke({"messages": [HumanMessage("sealed now", id="h9")]}, run)
        contents = [m.content for m in (await graph.aget_state(run)).values["messages"]]
        assert contents[:2] == [f"{MARKER} 0", f"echo {MARKER}"] and "sealed now" in contents
        await cp.aput_checkpoint(config, {"note": "sealed"})
        async with cp.engine.connect() as conn:
            newest = (
                await conn.execute(text("SELECT state_data FROM states ORDER BY version DESC"))
            ).scalar()
        assert is_sealed(newest)


async def test_a_cache_entry_that_does_not_open_is_a_miss(tmp_path: Path) -> None:
    """Redis is best effort: an entry tampered with, or sealed under a key since
    removed, is dropped and the database answers (never its ciphertext, never garbage)."""
    async with backend_for("sqlite+redis+encrypted", tmp_path) as backend:
        cp = await backend.make()
        await cp.aput_checkpoint(cfg(), {"note": MARKER})
        client = Redis.from_url(backend.redis_url)
        try:
            keys = [k async for k in client.scan_iter(match=f"{backend.key_prefix}:*")]
            [(key, entry)] = [  # the entry (the other key holds a fence)
                (k, v) for k, v in zip(keys, await client.mget(keys), strict=True) if b"!tx2" in v
            ]
            at = entry.index(b"!tx2:test-k1:") + 30  # a base64 character of the ciphertext
            flipped = b"B" if entry[at : at + 1] == b"A" else b"A"
            await client.set(key, entry[:at] + flipped + entry[at + 1 :])
            assert await cp.aget_state_cache(cfg()) == {"note": MARKER}
            refilled = await client.get(key)
            assert refilled is not None and refilled != entry and MARKER.encode() not in refilled
            rotated = await backend.make(keys=OTHER_KEYS)  # the database is read with...
            assert rotated.keys is OTHER_KEYS
            with pytest.raises(DecryptionError):  # ...a ring without the state's key
                await rotated.aget_state_cache(cfg())
        finally:
            await client.aclose()


def test_key_ring_configuration_errors() -> None:
    key = KeyRing.generate_key()
    assert KeyRing.parse(f"a:{key}, b:{KeyRing.generate_key()}").key_ids == ("a", "b")
    assert KeyRing.from_env({"TENXSTORE_KEYS": f"k:{key}"}).current == "k"  # type: ignore[union-attr]
    assert KeyRing.from_env({}) is None
    for bad in ("", "k", f"k:{key},k:{key}", "k:abc", f"bad id:{key}", "k:!!!!"):
        with pytest.raises(ConfigError):
            KeyRing.parse(bad)
    with pytest.raises(ConfigError):
        KeyRing([])
    with pytest.raises(ConfigError):
        tenxstore.CheckpointRepository("sqlite+aiosqlite://", keys="k:abc")  # type: ignore[arg-type]
    ring = pickle.loads(pickle.dumps(TEST_KEYS))
    assert ring.open(TEST_KEYS.seal("x", 1, "c"), 1, "c") == "x"
    assert "key_ids" in repr(TEST_KEYS) and key not in repr(KeyRing.parse(f"k:{key}"))
    assert KeyRing([["k", key]]).current == "k"  # a pair as JSON gives it: a list


def test_a_key_in_the_wrong_place_is_never_in_the_error() -> None:
    """A bare key, a key and its id swapped, a key whose base64 has no '+' or '/' (it
    fits the key id grammar's length, not its place), a pair of three: the error says
    which entry and what is wrong, and shows nothing of the key (it said the first 8
    characters of a bare key, and the whole key given where its id belongs)."""
    key = KeyRing.generate_key()
    raw = base64.b64decode(key)
    url_safe = base64.urlsafe_b64encode(raw).decode().rstrip("=")  # 43: fits the id grammar
    plain = "A1b2" * 11  # 44 characters of base64 with no '+' or '/'
    cases: list[tuple[Any, str]] = [
        (lambda: KeyRing.parse(key), "entry 1 of 1 is not key_id:base64key"),
        (lambda: KeyRing.parse(f"good:{KeyRing.generate_key()},{key}"), "entry 2 of 2"),
        (lambda: KeyRing.parse(f"{key}:k1"), "entry 1 of 1: the key id must be"),
        (lambda: KeyRing.from_env({"TENXSTORE_KEYS": f"{plain}=:k1"}), "not 45 characters"),
        (lambda: KeyRing.parse(f"{url_safe}:k1"), r"entry 1 of 1: a key must be 32 bytes"),
        (lambda: KeyRing.parse(f"{url_safe}:{key},{url_safe}:{key}"), "entry 2 of 2: its key"),
        (lambda: KeyRing([("k1", key, "x")]), "pair, not a tuple of 3"),
        (lambda: KeyRing([key]), "pair, not a str"),  # type: ignore[list-item]
        (lambda: KeyRing([(raw, "k1")]), "not bytes"),  # type: ignore[list-item]
    ]
    for make, says in cases:
        with pytest.raises(ConfigError, match=says) as caught:
            make()
        message = str(caught.value)
        for secret in (key, key[:8], url_safe[:8], plain[:8], repr(raw)[2:10]):
            assert secret not in message, (message, secret)
    with pytest.raises(ConfigError, match=r"entry 2 of 2 \('k1'\): its key id appears twice"):
        KeyRing.parse(f"k1:{key},k1:{key}")  # a short id is a name: said
    with pytest.raises(ConfigError, match=r"entry 1 of 1 \('k1'\): the key is not base64"):
        KeyRing.parse("k1:!!!!")


async def test_the_environment_turns_encryption_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENXSTORE_KEYS", f"envkey:{KeyRing.generate_key()}")
    cp = tenxstore.CheckpointRepository(f"sqlite+aiosqlite:///{tmp_path / 'e.db'}")
    try:
        await cp.asetup()
        assert cp.keys is not None and cp.keys.current == "envkey"
        await cp.aput_state(cfg(), {"note": MARKER})
        async with cp.engine.connect() as conn:
            stored = (await conn.execute(text("SELECT state_data FROM states"))).scalar()
        assert stored.startswith("!tx2:envkey:")
        monkeypatch.setenv("TENXSTORE_KEYS", "broken")
        with pytest.raises(ConfigError):
            tenxstore.CheckpointRepository(f"sqlite+aiosqlite:///{tmp_path / 'e.db'}")
    finally:
        await cp.aclose()


def test_a_serializer_type_may_not_look_sealed() -> None:
    from tenxstore.crypto import check_type

    assert check_type("msgpack") == "msgpack"
    with pytest.raises(SerializationError):
        check_type("!msgpack")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(json_values)
def test_no_plaintext_encoding_looks_like_an_envelope(value: Any) -> None:
    """Every text tenxstore stores is serde.encode output: orjson's JSON or the
    stdlib's after a space; never one that begins with the envelope's '!'."""
    stored = encode(value)
    assert not is_sealed(stored)
    assert TEST_KEYS.open(stored, "t", "c") == stored  # plaintext passes as it is
    sealed = TEST_KEYS.seal(stored, "t", "c")
    assert is_sealed(sealed) and TEST_KEYS.open(sealed, "t", "c") == stored


def test_envelopes_differ_and_carry_no_plaintext() -> None:
    one, two = (TEST_KEYS.seal(MARKER, uuid.uuid4(), "c") for _ in range(2))
    assert one != two and MARKER not in one


def test_a_damaged_envelope_repeats_none_of_its_text() -> None:
    """What stands where a key id should is repeated in an error only when it is a key
    id: otherwise it may be a stored value's text (a secret, megabytes of it)."""
    ring = KeyRing([("k1", bytes(32))])
    for stored in ("!tx1:password=hunter2 card:rest", "!tx1:" + "s" * 65 + ":x", "!tx1::x"):
        with pytest.raises(DecryptionError, match="not a tenxstore envelope") as caught:
            ring.open(stored, "t", "c")
        assert caught.value.key_id is None and "hunter2" not in str(caught.value)
    assert tenxstore.crypto.sealed_key_id("!tx1:" + "s" * 64 + ":x") == "s" * 64


def test_a_rings_memory_does_not_grow_with_what_it_opens() -> None:
    """The associated data's prefix is kept for tenxstore's columns only: a cache entry
    is bound to a column of its own (its version and key), one per entry."""
    ring = KeyRing([("k1", bytes(32))])
    for n in range(50):
        column = f"cache:1:{n}:state_cache:store:t:u"
        assert ring.open(ring.seal(MARKER, "t", column), "t", column) == MARKER
        assert ring.open(ring.seal(MARKER, "t", "states.state_data"), "t", "states.state_data")
    assert len(ring._prefixes) == 1  # states.state_data's
    with pytest.raises(AttributeError):
        ring.current = "other"  # type: ignore[misc]  # fixed when the ring is made


def test_a_text_envelope_opens_whole_under_its_own_key_only() -> None:
    """The current key's envelopes open by a shortcut, the others' by their key id: a
    key id that begins another's ("k1", "k10") never takes the other's way; a header
    changed to name another key, a damaged, truncated or unknown envelope is refused."""
    a, b = bytes(range(32)), bytes(range(32, 64))
    ring, other = KeyRing([("k1", a), ("k10", b)]), KeyRing([("k10", b), ("k1", a)])
    for sealer, opener in ((ring, other), (other, ring), (ring, ring), (other, other)):
        assert opener.open(sealer.seal(MARKER, "t", "c"), "t", "c") == MARKER
    by_k10 = other.seal(MARKER, "t", "c")
    assert by_k10.startswith("!tx2:k10:")
    relabeled = "!tx2:k1:" + by_k10.removeprefix("!tx2:k10:")
    body = ring.seal(MARKER, "t", "c").removeprefix("!tx2:k1:")
    for stored, why in (
        (relabeled, "authentication failed"),  # the header is bound too
        ("!tx2:k1", "not a tenxstore envelope"),
        ("!tx3:k1:" + body, "not a tenxstore envelope"),
        ("!tx1:k1:" + body, "authentication failed"),  # its format too: no way to a life-free tx1
        ("!tx2:k1:" + body[:-4] + "%%%%", "damaged envelope"),
        ("!tx2:k1:AAAAAAAA", "truncated envelope"),
        ("!tx2:k2:" + body, "not in the key ring"),
    ):
        with pytest.raises(DecryptionError, match=why):
            ring.open(stored, "t", "c")


async def test_copy_and_export_import_across_plain_and_encrypted_stores(tmp_path: Path) -> None:
    """A LangGraph copy seals the values again for the target thread; an export is
    plaintext, and an import seals under the importing store's key (or none)."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    async with backend_for("sqlite+encrypted", tmp_path / "a") as sealed_store:
        cp = await sealed_store.make()
        await write_everything(cp)
        saver = TenxCheckpointSaver(cp).for_user("alice")
        await saver.acopy_thread("t1", "t2")
        values = (await chat(saver).aget_state({"configurable": {"thread_id": "t2"}})).values
        assert values["messages"][-1].content == f"echo {MARKER}"
        export = await cp.aexport_thread(cfg("t1"))
        assert export is not None and export.states[0].state == {"note": MARKER}
        async with backend_for("sqlite", tmp_path / "b") as plain_store:
            plain = await plain_store.make()
            assert await plain.aimport_thread(export) == "created"
            assert holds((await raw_cells(plain_store, plain))["states"])
            back = await plain.aexport_thread(cfg("t1"))
            assert back is not None
        await cp.aclean_thread(cfg("t1"))
        assert await cp.aimport_thread(back) == "created"
        assert await cp.aget_state(cfg("t1")) == {"note": MARKER}
        cells = await raw_cells(sealed_store, cp)
        assert [table for table, found in cells.items() if holds(found)] == []


def test_a_langgraph_value_opens_only_where_and_as_it_was_sealed() -> None:
    from tenxstore.crypto import BLOB, WRITE, open_typed

    kind, data = TEST_KEYS.seal_typed("msgpack", MARKER.encode(), "t1", BLOB)
    assert kind == "!msgpack" and MARKER.encode() not in data
    assert open_typed(TEST_KEYS, kind, data, "t1", BLOB) == ("msgpack", MARKER.encode())
    assert open_typed(None, "bytes", b"!raw", "t1", BLOB) == ("bytes", b"!raw")  # plain
    flipped = data[:-1] + bytes([data[-1] ^ 1])
    for args in (
        (kind, data, "t2", BLOB),  # another thread
        (kind, data, "t1", WRITE),  # another column
        ("!json", data, "t1", BLOB),  # another type
        (kind, flipped, "t1", BLOB),  # tampered
        (kind, b"junk", "t1", BLOB),  # not an envelope
    ):
        with pytest.raises(DecryptionError):
            open_typed(TEST_KEYS, *args)
    with pytest.raises(DecryptionError, match="no key ring"):
        open_typed(None, kind, data, "t1", BLOB)
    with pytest.raises(DecryptionError, match="not in the key ring"):
        open_typed(OTHER_KEYS, kind, data, "t1", BLOB)


async def test_a_sealed_export_file_holds_no_plaintext_and_opens_with_its_key(
    tmp_path: Path,
) -> None:
    """``export --sealed`` keeps the file encrypted (each line sealed, bound to its
    thread id); importing it needs the key ring it was sealed under, refuses a line
    moved to another thread id or tampered, and writes nothing then."""
    import io
    import json

    from tenxstore import archive

    async with backend_for("sqlite+encrypted", tmp_path) as backend:
        cp = await backend.make()
        await write_everything(cp, "t1")
        await write_everything(cp, "t2")
        path = tmp_path / "sealed.jsonl"  # (exported before the threads are cleaned)
        assert await archive.export_threads(cp, path, ["t1", "t2"], sealed=True) == 2
        content = path.read_bytes()
        assert MARKER.encode() not in content
        lines = [json.loads(line) for line in content.decode().splitlines()]
        assert [line["thread_id"] for line in lines] == ["t1", "t2"]
        assert all(is_sealed(line["sealed"]) for line in lines)
        clear = io.StringIO()  # a whole plaintext export where the envelope should be
        await archive.write_exports(cp, clear, ["t1"])
        await cp.aclean_thread(cfg("t1"))
        await cp.aclean_thread(cfg("t2"))
        # Refused, and nothing written: another key ring, none, a line moved, tampered.
        moved = tmp_path / "moved.jsonl"
        moved.write_text(json.dumps({**lines[0], "thread_id": "t2"}) + "\n")
        tampered = tmp_path / "tampered.jsonl"
        envelope = lines[0]["sealed"]
        # a character mid-envelope, every bit of it data (near the end, base64's
        # padding bits would let a flip of the low bit decode to the same bytes)
        at = len(envelope) // 2
        flipped = envelope[:at] + ("Q" if envelope[at] != "Q" else "A") + envelope[at + 1 :]
        tampered.write_text(json.dumps({**lines[0], "sealed": flipped}) + "\n")
        plain_line = tmp_path / "unsealed.jsonl"
        plain_line.write_text(json.dumps({**lines[0], "sealed": clear.getvalue().strip()}) + "\n")
        cases = [
            (await backend.make(keys=OTHER_KEYS), path, DecryptionError),
            (await backend.make(keys=None), path, ConfigError),
            (cp, moved, DecryptionError),
            (cp, tampered, DecryptionError),
            (cp, plain_line, ConfigError),
        ]
        backend.keys = None
        cases.append((await backend.make(), path, ConfigError))
        for store, file, error in cases:
            with pytest.raises(error):
                await archive.import_file(store, file)
            assert await cp.aget_thread(cfg("t1")) is None
        counted = await archive.import_file(cp, path)
        assert counted == {"created": 2}
        assert await cp.aget_state(cfg("t2")) == {"note": MARKER}
        with pytest.raises(ConfigError, match="key ring"):  # a plain store cannot seal
            await archive.export_threads(await backend.make(), tmp_path / "x.jsonl", sealed=True)


async def test_a_downgrade_below_0006_refuses_sealed_deltas(tmp_path: Path) -> None:
    """0006's downgrade joins each delta's bytes to its base's; a sealed delta is an
    envelope of its own, so the joined bytes would never open again: the downgrade
    refuses before it changes anything, and every value still reads."""
    from tenxstore import migrate

    async with backend_for("sqlite+encrypted", tmp_path) as backend:
        cp = await backend.make()
        graph = chat(TenxCheckpointSaver(cp).for_user("alice"))
        run = {"configurable": {"thread_id": "t1"}}
        for n in range(6):
            await graph.ainvoke({"messages": [HumanMessage(f"m {n}", id=f"h{n}")]}, run)
        async with cp.engine.connect() as conn:
            deltas = await conn.execute(
                text("SELECT count(*) FROM lg_blobs WHERE base IS NOT NULL AND type LIKE '!%'")
            )
            assert deltas.scalar_one() > 0  # the premise: sealed deltas are there
        with pytest.raises(ConfigError, match="downgrade below 0006"):
            await migrate.downgrade(cp.backend, revision="0005_langgraph_storage")
        fresh = await backend.make()
        state = await chat(TenxCheckpointSaver(fresh).for_user("alice")).aget_state(run)
        assert len(state.values["messages"]) == 12


async def test_the_cache_serves_an_encrypted_store_only_what_it_sealed(tmp_path: Path) -> None:
    """With a key ring, a cache entry that is not sealed (cached before encryption was
    turned on, or written into Redis) is a miss, dropped; and a sealed entry opens only
    at the version, life and key it was sealed for: an older sealed state replayed under
    the current version, or an entry of the previous format, is a miss too."""
    async with backend_for("sqlite+redis", tmp_path) as backend:
        plain = await backend.make()
        await plain.aput_checkpoint(cfg(), {"note": MARKER})
        assert await plain.aget_state_cache(cfg()) == {"note": MARKER}
        assert holds(await raw_redis(backend))
        cp = await backend.make(keys=TEST_KEYS)
        await cp.aput_checkpoint(cfg("t2"), {"note": "t2 v1"})
        client = Redis.from_url(backend.redis_url)
        try:
            keys = [k async for k in client.scan_iter(match=f"{backend.key_prefix}:*")]
            [t1] = [k for k in keys if k.endswith(b":t1:alice")]
            [t2] = [k for k in keys if k.endswith(b":t2:alice")]
            # a plaintext entry is dropped and refilled sealed from the database
            assert await cp.aget_state_cache(cfg()) == {"note": MARKER}
            assert not holds(await raw_redis(backend)) and b"!tx2:" in await client.get(t1)
            tag, entry = unnamed(await client.get(t1))
            entry.pop("__checkpoint_sealed__")  # plaintext at the entry's own version
            await client.set(t1, tag + json.dumps({**entry, "note": "forged"}).encode())
            assert await cp.aget_state_cache(cfg()) == {"note": MARKER}
            # replay: v1's sealed state under v2's clear version
            _, v1 = unnamed(await client.get(t2))
            await cp.aput_checkpoint(cfg("t2"), {"note": "t2 v2"})
            assert await cp.aget_state_cache(cfg("t2")) == {"note": "t2 v2"}
            tag, v2 = unnamed(await client.get(t2))
            replayed = {**v1, "__checkpoint_version__": v2[VERSION]}
            await client.set(t2, tag + json.dumps(replayed).encode())
            assert await cp.aget_state_cache(cfg("t2")) == {"note": "t2 v2"}
            # an entry sealed by the previous format (bound to the thread only)
            old = TEST_KEYS.seal(encode({"note": "old format"}), "t2", "cache")
            await client.set(t2, tag + json.dumps({**v2, "__checkpoint_sealed__": old}).encode())
            assert await cp.aget_state_cache(cfg("t2")) == {"note": "t2 v2"}
            _, refilled = unnamed(await client.get(t2))
            assert refilled[VERSION] == 2 and refilled["__checkpoint_sealed__"] != old
        finally:
            await client.aclose()


VERSION = "__checkpoint_version__"


def unnamed(raw: bytes) -> tuple[bytes, dict[str, Any]]:
    """A cache entry's name of the master that stored it (``m:<id>:``, kept so that a
    forged entry is one this master would serve) and its JSON."""
    assert raw.startswith(b"m:"), raw[:60]
    body = raw.split(b":", 2)[2]
    found: dict[str, Any] = json.loads(body)
    return raw[: len(raw) - len(body)], found


async def test_a_strict_key_ring_refuses_plaintext_in_place_of_a_sealed_value(
    tmp_path: Path,
) -> None:
    """Without require_sealed, plaintext substituted for a sealed value reads (it is
    what rows written before encryption look like); with it, every read of a value
    that is not sealed raises, and a cache entry that is not sealed is a miss."""
    strict = KeyRing([("test-k1", bytes(range(32)))], require_sealed=True)
    async with backend_for("sqlite", tmp_path) as backend:
        await write_everything(await backend.make(keys=TEST_KEYS))
        cp = await backend.make(keys=strict)
        assert await cp.aget_state(cfg()) == {"note": MARKER}  # all sealed: reads
        await tamper(cp, """UPDATE states SET state_data = '{"note":"INJECTED"}'""")
        await tamper(cp, """UPDATE threads SET metadata = '{"topic":"INJECTED"}'""")
        await tamper(cp, "UPDATE lg_blobs SET type = substr(type, 2) WHERE type LIKE '!%'")
        lenient = await backend.make(keys=TEST_KEYS)
        assert await lenient.aget_state(cfg()) == {"note": "INJECTED"}
        with pytest.raises(DecryptionError, match="requires sealed") as caught:
            await cp.aget_state(cfg())
        assert caught.value.column == "states.state_data" and caught.value.thread_id == "t1"
        with pytest.raises(DecryptionError, match="requires sealed"):
            await cp.aget_thread(cfg())
        with pytest.raises(DecryptionError, match="requires sealed"):
            await cp.aexport_thread(cfg())
        saver = TenxCheckpointSaver(cp).for_user("alice")
        with pytest.raises(DecryptionError, match="lg_blobs"):
            await chat(saver).aget_state({"configurable": {"thread_id": "t1"}})
        with pytest.raises(DecryptionError, match="requires sealed"):
            await arotate_keys(cp)  # it does not seal plaintext it cannot trust
    assert strict.open_typed("!x", strict.seal_typed("x", b"v", 1, "c")[1], 1, "c") == ("x", b"v")
    with pytest.raises(DecryptionError, match="requires sealed"):
        strict.open_typed("bytes", b"v", 1, "c")
    assert pickle.loads(pickle.dumps(strict)).require_sealed
    key = KeyRing.generate_key()
    on = KeyRing.from_env({"TENXSTORE_KEYS": f"k:{key}", "TENXSTORE_REQUIRE_SEALED": "1"})
    off = KeyRing.from_env({"TENXSTORE_KEYS": f"k:{key}", "TENXSTORE_REQUIRE_SEALED": "0"})
    assert on is not None and on.require_sealed and off is not None and not off.require_sealed
    for bad in (
        {"TENXSTORE_KEYS": f"k:{key}", "TENXSTORE_REQUIRE_SEALED": "maybe"},
        {"TENXSTORE_REQUIRE_SEALED": "1"},
    ):
        with pytest.raises(ConfigError, match="TENXSTORE_REQUIRE_SEALED"):
            KeyRing.from_env(bad)
    with pytest.raises(ConfigError, match="require_sealed"):
        KeyRing([("k", key)], require_sealed="yes")  # type: ignore[arg-type]


async def test_a_strict_cache_drops_an_unsealed_entry(tmp_path: Path) -> None:
    strict = KeyRing([("test-k1", bytes(range(32)))], require_sealed=True)
    async with backend_for("sqlite+redis", tmp_path) as backend:
        await (await backend.make(keys=TEST_KEYS)).aput_checkpoint(cfg(), {"note": MARKER})
        cp = await backend.make(keys=strict)
        client = Redis.from_url(backend.redis_url)
        try:
            keys = [k async for k in client.scan_iter(match=f"{backend.key_prefix}:*")]
            [key] = [k for k in keys if k.endswith(b":t1:alice")]
            tag, entry = unnamed(await client.get(key))
            entry.pop("__checkpoint_sealed__")
            await client.set(key, tag + json.dumps({**entry, "note": "INJECTED"}).encode())
            assert await cp.aget_state_cache(cfg()) == {"note": MARKER}
        finally:
            await client.aclose()


class _LongType:
    """A serializer whose type is 64 characters (the most a plain store holds)."""

    def __init__(self) -> None:
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

        self.inner = JsonPlusSerializer()

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return "t" * 64, self.inner.dumps_typed(obj)[1]

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return self.inner.loads_typed(("msgpack", data[1]))

    def dumps(self, obj: Any) -> bytes:
        return self.inner.dumps(obj)

    def loads(self, data: bytes) -> Any:
        return self.inner.loads(data)


async def test_a_sealed_type_may_be_63_characters(tmp_path: Path) -> None:
    """Sealing marks a LangGraph value's type with '!': a 64-character type fits the
    column plain and is refused sealed (SerializationError, nothing written), on a put
    and on an import, before the database sees it."""
    from tenxstore.crypto import check_type

    assert check_type("t" * 64) and check_type("t" * 63, sealed=True)
    for kind, sealed in (("t" * 65, False), ("t" * 64, True)):
        with pytest.raises(SerializationError, match="at most"):
            check_type(kind, sealed=sealed)
    with pytest.raises(SerializationError):
        TEST_KEYS.seal_typed("t" * 64, b"v", 1, "c")
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    run = {"configurable": {"thread_id": "t1"}}
    async with backend_for("sqlite", tmp_path / "a") as plain_store:
        plain = await plain_store.make()
        graph = chat(TenxCheckpointSaver(plain, serde=_LongType()).for_user("alice"))
        await graph.ainvoke({"messages": [HumanMessage("hi", id="h0")]}, run)
        export = await plain.aexport_thread(cfg("t1"))
        assert export is not None and export.langgraph_checkpoints
    async with backend_for("sqlite+encrypted", tmp_path / "b") as sealed_store:
        cp = await sealed_store.make()
        graph = chat(TenxCheckpointSaver(cp, serde=_LongType()).for_user("alice"))
        with pytest.raises(SerializationError, match="63"):
            await graph.ainvoke({"messages": [HumanMessage("hi", id="h0")]}, run)
        with pytest.raises(SerializationError, match="63"):
            await cp.aimport_thread(export)
        assert await cp.aget_thread(cfg("t1")) is None
        assert (await raw_cells(sealed_store, cp))["lg_checkpoints"] == []


# -- the binding to the thread's life, and the envelope before it ----------------

KEY = bytes(range(32))  # TEST_KEYS's "test-k1"


def tx1_text_aad(key_id: str, thread_id: Any, column: str) -> bytes:
    """A ``tx1`` text envelope's associated data, as releases before ``tx2`` made it."""
    head = f"!tx1:{key_id}:".encode()
    return b"tenxstore\x00" + head + b"\x00" + column.encode() + b"\x00" + str(thread_id).encode()


def tx1_seal(text_: str, thread_id: Any, column: str, key_id: str = "test-k1") -> str:
    nonce = os.urandom(12)
    body = AESGCM(KEY).encrypt(nonce, text_.encode(), tx1_text_aad(key_id, thread_id, column))
    return f"!tx1:{key_id}:" + base64.b64encode(nonce + body).decode()


def tx1_open(stored: str, thread_id: Any, column: str, key_id: str = "test-k1") -> str:
    raw = base64.b64decode(stored.removeprefix(f"!tx1:{key_id}:"))
    aad = tx1_text_aad(key_id, thread_id, column)
    return AESGCM(KEY).decrypt(raw[:12], raw[12:], aad).decode()


def tx1_typed_open(kind: str, data: bytes, thread_id: Any, column: str) -> bytes:
    head = b"tx1" + bytes([7]) + b"test-k1"
    assert data.startswith(head)
    aad = b"tenxstore\x00" + head + b"\x00" + kind.removeprefix("!").encode() + b"\x00"
    aad += column.encode() + b"\x00" + str(thread_id).encode()
    at = len(head)
    return AESGCM(KEY).decrypt(data[at : at + 12], data[at + 12 :], aad)


def test_a_value_opens_only_in_the_life_it_was_sealed_for() -> None:
    """Incarnation and owner are bound exactly, and unambiguously (the owner is
    length-prefixed: no incarnation and owner run into another pair); a value bound to
    no life (an export line) opens only with none; a tx2 header turned into tx1's, to
    shed the binding, does not open."""
    life = Life(12, "3")
    sealed = TEST_KEYS.seal("x", "ta", STATE, life)
    kind, data = TEST_KEYS.seal_typed("msgpack", b"x", "ta", BLOB, life)
    assert sealed.startswith("!tx2:test-k1:") and data.startswith(b"tx2\x07test-k1")
    assert TEST_KEYS.open(sealed, "ta", STATE, Life(12, "3")) == "x"
    assert TEST_KEYS.open_typed(kind, data, "ta", BLOB, Life(12, "3")) == ("msgpack", b"x")
    others = [Life(13, "3"), Life(1, "23"), Life(123, ""), Life(12, None), Life(12, "3 "), None]
    for other in others:
        with pytest.raises(DecryptionError, match="authentication failed"):
            TEST_KEYS.open(sealed, "ta", STATE, other)
        with pytest.raises(DecryptionError, match="authentication failed"):
            TEST_KEYS.open_typed(kind, data, "ta", BLOB, other)
    shared = TEST_KEYS.seal("x", "ta", STATE, Life(12, None))  # a thread of no user
    assert TEST_KEYS.open(shared, "ta", STATE, Life(12, None)) == "x"
    with pytest.raises(DecryptionError):
        TEST_KEYS.open(shared, "ta", STATE, Life(12, ""))
    line = TEST_KEYS.seal("x", "ta", EXPORT, None)
    assert TEST_KEYS.open(line, "ta", EXPORT, None) == "x"
    with pytest.raises(DecryptionError):
        TEST_KEYS.open(line, "ta", EXPORT, Life(1, "a"))
    with pytest.raises(DecryptionError, match="authentication failed"):
        TEST_KEYS.open_typed(kind, b"tx1" + data[3:], "ta", BLOB, life)
    for bad in (Life("12", "3"), Life(True, "3"), Life(None, "3")):  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="incarnation must be an int"):
            TEST_KEYS.seal("x", "ta", STATE, bad)


def test_what_a_release_before_tx2_sealed_opens_and_an_upgrading_ring_seals_it() -> None:
    """A tx1 envelope (sealed as releases before tx2 sealed it) opens in any life of its
    thread; a ring with ``envelope="tx1"`` seals what those releases open, for the
    instances not yet upgraded (its values bind no life)."""
    old = tx1_seal('{"n":1}', "ta", STATE)
    for life in (Life(1, "alice"), Life(99, "eve"), None):
        assert TEST_KEYS.open(old, "ta", STATE, life) == '{"n":1}'
    with pytest.raises(DecryptionError):
        TEST_KEYS.open(old, "tb", STATE, Life(1, "alice"))  # still bound to its thread
    upgrading = KeyRing([("test-k1", KEY)], envelope="tx1")
    sealed = upgrading.seal("y", "ta", STATE, Life(5, "alice"))
    assert sealed.startswith("!tx1:test-k1:") and tx1_open(sealed, "ta", STATE) == "y"
    kind, data = upgrading.seal_typed("msgpack", b"y", "ta", BLOB, Life(5, "alice"))
    assert tx1_typed_open(kind, data, "ta", BLOB) == b"y"
    assert TEST_KEYS.open(sealed, "ta", STATE, Life(6, "eve")) == "y"
    assert upgrading.open(TEST_KEYS.seal("z", "ta", STATE, Life(5, "a")), "ta", STATE, Life(5, "a"))
    assert pickle.loads(pickle.dumps(upgrading)).envelope == "tx1"
    assert "envelope='tx1'" in repr(upgrading) and "envelope" not in repr(TEST_KEYS)
    key = KeyRing.generate_key()
    env = {"TENXSTORE_KEYS": f"k:{key}", "TENXSTORE_ENVELOPE": "tx1"}
    assert KeyRing.from_env(env).envelope == "tx1"  # type: ignore[union-attr]
    assert KeyRing.from_env({"TENXSTORE_KEYS": f"k:{key}"}).envelope == "tx2"  # type: ignore[union-attr]
    for bad in ({**env, "TENXSTORE_ENVELOPE": "tx3"}, {"TENXSTORE_ENVELOPE": "tx1"}):
        with pytest.raises(ConfigError, match="TENXSTORE_ENVELOPE"):
            KeyRing.from_env(bad)
    with pytest.raises(ConfigError, match="envelope"):
        KeyRing([("k", key)], envelope="tx0")
