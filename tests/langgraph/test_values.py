"""A stored LangGraph value never runs code: not when it is imported, copied or read.

LangGraph's msgpack can name a callable and its argument (``["os", "mkdir", PATH]``);
its permissive serde imports and calls it when the value is read. The saver's
default serde is strict, and an import or copy checks every LangGraph value before
writing anything.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from base64 import b64encode
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from sqlalchemy import select, update

from tenxstore import ConfigError, SerializationError, archive
from tenxstore.crypto import BLOB, life_of
from tenxstore.deltas import new_uid
from tenxstore.langgraph import TenxCheckpointSaver
from tenxstore.langgraph.values import check_value
from tests.conftest import Backend
from tests.langgraph.test_threads import alice, chat


def naming(module: str, name: str, argument: Any, code: int = 0) -> bytes:
    """A msgpack value whose extension names ``module.name`` called with ``argument``."""
    return ormsgpack.packb(ormsgpack.Ext(code, ormsgpack.packb([module, name, argument])))


@dataclasses.dataclass
class Order:  # a type of the user's own: refused unless allowed
    sku: str


def test_check_value_refuses_what_the_strict_serde_would() -> None:
    kind, safe = JsonPlusSerializer().dumps_typed([HumanMessage("hi"), AIMessage("yo")])
    check_value(kind, safe, "v")
    for kind in ("null", "bytes", "bytearray"):
        check_value(kind, b"\x00anything", "v")
    nested = ormsgpack.packb(
        {"deep": [[{"x": ormsgpack.Ext(0, ormsgpack.packb(["os", "system", "id"]))}]]}
    )
    for bad in (naming("os", "mkdir", "/tmp/x"), naming("builtins", "eval", "1"), nested):
        with pytest.raises(SerializationError, match="strict serde"):
            check_value("msgpack", bad, "v")
    with pytest.raises(SerializationError, match=r"datetime\.datetime\.system"):
        check_value(
            "msgpack",
            ormsgpack.packb(
                ormsgpack.Ext(3, ormsgpack.packb(["datetime", "datetime", "x", "system"]))
            ),
            "v",
        )
    with pytest.raises(SerializationError, match="pickle"):
        check_value("pickle", b"cos\nsystem\n.", "v")
    with pytest.raises(SerializationError, match="serializer type"):
        check_value("msgpack+aes", b"", "v")
    lc2 = b'{"lc": 2, "type": "constructor", "id": ["os", "mkdir"], "args": ["/tmp/x"]}'
    with pytest.raises(SerializationError, match=r"os\.mkdir"):
        check_value("json", lc2, "v")
    order = naming(Order.__module__, "Order", {"sku": "a"}, code=2)
    with pytest.raises(SerializationError):
        check_value("msgpack", order, "v")
    check_value("msgpack", order, "v", frozenset({(Order.__module__, "Order")}))
    with pytest.raises(SerializationError, match="not valid msgpack"):
        check_value("msgpack", b"\xc1", "v")


def _lg_line(path: Path) -> tuple[dict[str, Any], int]:
    """The export line of thread ``lg`` and the index of a blob holding a message list."""
    import orjson

    line = orjson.loads(path.read_text().splitlines()[0])
    for i, blob in enumerate(line["langgraph_blobs"]):
        if blob["channel"] == "messages":
            return line, i
    raise AssertionError("no messages value")


async def test_an_imported_value_naming_a_callable_is_refused(
    backend: Backend, tmp_path: Path
) -> None:
    source = await backend.make()
    graph = chat(TenxCheckpointSaver(source))
    await graph.ainvoke({"messages": [("user", "hello")]}, alice("lg"))
    dump = tmp_path / "lg.jsonl"
    assert await archive.export_threads(source, dump, ["lg"]) == 1
    await source.aclean_thread({"thread_id": "lg", "user_id": "alice"})
    line, i = _lg_line(dump)
    victim = tmp_path / "owned"
    line["langgraph_blobs"][i]["blob"] = b64encode(naming("os", "mkdir", str(victim))).decode()
    import orjson

    crafted = tmp_path / "crafted.jsonl"
    crafted.write_bytes(orjson.dumps(line) + b"\n")
    with pytest.raises(SerializationError, match=r"crafted.jsonl:1: langgraph_blobs\[\d+\]"):
        await archive.import_file(source, crafted)
    export = archive.export_from_json(line)
    with pytest.raises(SerializationError, match=r"os\.mkdir"):
        await source.aimport_thread(export)
    assert not victim.exists()
    assert await source.alist_threads({"user_id": "alice"}) == []  # nothing written
    # the untouched file imports, and the graph goes on
    assert (await archive.import_file(source, dump))["created"] == 1
    state = await graph.aget_state(alice("lg"))
    assert [m.content for m in state.values["messages"]] == ["hello", "reply 1"]


async def test_a_stored_value_naming_a_callable_is_never_called(
    backend: Backend, tmp_path: Path
) -> None:
    """Written into the database behind tenxstore's back (a restored backup, a row
    edited by hand): the default serde reads it as data, and nothing runs."""
    cp = await backend.make()
    saver = TenxCheckpointSaver(cp)
    graph = chat(saver)
    await graph.ainvoke({"messages": [("user", "hello")]}, alice("lg"))
    victim = tmp_path / "owned"
    kind, data = "msgpack", naming("os", "mkdir", str(victim))
    repository = getattr(cp, "inner", cp)
    b, t = repository.store.tables.lg_blobs, repository.store.tables.threads
    if repository.keys is not None:  # sealed for the thread's life, as a writer would
        async with repository.engine.connect() as conn:
            found = (
                await conn.execute(
                    select(t.c.incarnation, t.c.user_id).where(t.c.thread_id == "lg")
                )
            ).one()
        kind, data = repository.keys.seal_typed(kind, data, "lg", BLOB, life_of(found))
    async with repository.engine.begin() as conn:
        changed = await conn.execute(
            update(b)
            .where(b.c.thread_id == "lg", b.c.channel == "messages")
            # a row of its own (tenxstore never rewrites a row under its uid: a process
            # that wrote or read the row's value serves it from what it holds)
            .values(type=kind, blob=data, base=None, splice=None, skip=None, uid=new_uid())
        )
        assert changed.rowcount >= 1
    found = await saver.aget_tuple(alice("lg"))
    assert found is not None and not victim.exists()
    assert found.checkpoint["channel_values"]["messages"] == str(victim)  # its plain data


def test_the_cli_refuses_a_crafted_line_and_allows_a_type_named(tmp_path: Path) -> None:
    """`tenxstore import` names the line; --allow-type admits a type of one's own."""
    tenx = str(Path(sys.executable).with_name("tenxstore"))
    url = f"sqlite:///{tmp_path / 'x.db'}"
    line = {
        "format": "tenxstore.thread/2",
        "thread": {
            "thread_id": "t", "user_id": "u", "name": None, "metadata": {}, "version": 0,
            "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
        },
        "states": [], "messages": [], "tool_executions": [],
        "langgraph_blobs": [
            {
                "checkpoint_ns": "", "channel": "orders", "version": "1", "type": "msgpack",
                "blob": b64encode(naming(Order.__module__, "Order", {"sku": "a"}, 2)).decode(),
            }
        ],
    }  # fmt: skip
    import orjson

    path = tmp_path / "orders.jsonl"
    path.write_bytes(orjson.dumps(line) + b"\n")
    refused = subprocess.run(
        [tenx, "import", str(path), "--url", url], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 1 and "orders.jsonl:1:" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    allowed = subprocess.run(
        [tenx, "import", str(path), "--url", url, "--allow-type", f"{Order.__module__}:Order"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert allowed.returncode == 0, allowed.stderr
    bad = subprocess.run(
        [tenx, "import", str(path), "--url", url, "--allow-type", "no-colon"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and "module:Name" in bad.stderr


def test_allowed_types_are_for_the_default_serde() -> None:
    from tenxstore import CheckpointRepository

    cp = CheckpointRepository("postgresql://127.0.0.1:1/nowhere")  # no I/O: none made
    with pytest.raises(ConfigError, match="allowed_types"):
        TenxCheckpointSaver(cp, serde=JsonPlusSerializer(), allowed_types=[Order])
    saver = TenxCheckpointSaver(cp, allowed_types=[Order])
    assert saver.serde.loads_typed(
        ("msgpack", naming(Order.__module__, "Order", {"sku": "a"}, 2))
    ) == Order("a")
    strict = TenxCheckpointSaver(cp)
    assert strict.serde.loads_typed(
        ("msgpack", naming(Order.__module__, "Order", {"sku": "a"}, 2))
    ) == {"sku": "a"}
