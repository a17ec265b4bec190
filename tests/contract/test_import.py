"""Importing from a file: streamed (memory bounded by the largest thread, not the
file), every line checked before anything is written, times kept exactly or refused,
and every decoder bounded (no RecursionError from a deeply nested line)."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest

from tenxstore import ConfigError, archive
from tests.conftest import Backend, cfg


def thread_line(thread: str, messages: int = 0, when: str = "2026-01-01T00:00:00+00:00") -> bytes:
    """One export line: a thread of ``messages`` messages of 200 characters."""
    return orjson.dumps(
        {
            "format": "tenxstore.thread/2",
            "thread": {
                "thread_id": thread,
                "user_id": "alice",
                "name": None,
                "metadata": {},
                "version": 0,
                "created_at": when,
                "updated_at": when,
            },
            "states": [],
            "messages": [
                {"message": {"id": f"{thread}-{i}", "content": "m" * 200}, "created_at": when}
                for i in range(messages)
            ],
            "tool_executions": [],
        }
    )


def write_file(path: Path, threads: int, messages: int, last: bytes) -> None:
    with path.open("wb") as out:
        for n in range(threads):
            out.write(thread_line(f"t{n}", messages) + b"\n")
        out.write(last + b"\n")


async def test_an_import_streams_and_checks_every_line_first(
    sql_backend: Backend, tmp_path: Path
) -> None:
    """A file whose last line is invalid writes nothing and names that line; the peak
    memory of reading it does not grow with the file (4x the threads, about the same
    peak): the lines are checked one at a time, then written one at a time."""
    cp = await sql_backend.make()
    bad = b'{"format": "tenxstore.thread/2", "thread": {}}'
    peaks = []
    for threads in (100, 400):
        path = tmp_path / f"{threads}.jsonl"
        write_file(path, threads, 40, bad)
        tracemalloc.start()
        try:
            with pytest.raises(ConfigError, match=rf"{threads}\.jsonl:{threads + 1}: "):
                await archive.import_file(cp, path)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert await cp.alist_threads({"user_id": "alice"}) == []
    assert peaks[1] < 2 * peaks[0], peaks  # not 4x (as it was): bounded by a thread
    # the same file without its bad line imports whole, in one go
    good = tmp_path / "good.jsonl"
    write_file(good, 50, 40, thread_line("last", 1))
    assert (await archive.import_file(cp, good))["created"] == 51
    assert len(await cp.aget_messages(cfg("t49"))) == 40


async def test_times_are_stored_in_utc_or_refused(backend: Backend, tmp_path: Path) -> None:
    """SQLite and MySQL columns hold no zone: a time imported with an offset lost it
    (``+14:00`` stored 14 hours late), and one past 9999-12-31 in UTC was cut short.
    Now a time is converted to UTC, and one beyond the range is refused, naming it."""
    cp = await backend.make()
    export = archive.export_from_json(
        orjson.loads(thread_line("t", 1, "2026-01-01T00:00:00+14:00"))
    )
    assert await cp.aimport_thread(export) == "created"
    info = await cp.aget_thread(cfg("t"))
    assert info is not None and info.created_at == datetime(2025, 12, 31, 10, tzinfo=timezone.utc)
    path = tmp_path / "far.jsonl"
    path.write_bytes(thread_line("far", 0, "9999-12-31T23:59:59-05:00") + b"\n")
    with pytest.raises(ConfigError, match=r"far\.jsonl:1: thread\.created_at .* out of range"):
        await archive.import_file(cp, path)
    assert await cp.aget_thread(cfg("far")) is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tenxstore.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("mark", ["", " "], ids=["orjson", "stdlib"])
@pytest.mark.parametrize("depth", [300, 100_000])
def test_a_deeply_nested_line_is_one_error_line(mark: str, depth: int, tmp_path: Path) -> None:
    """A line nested deeper than any value tenxstore writes — with or without the
    leading space that marks the standard library's JSON — is ``error: FILE:1: ...``,
    never a RecursionError traceback."""
    nested: Any = "[" * depth + "]" * depth
    line = thread_line("t").replace(b'"metadata":{}', b'"metadata":{"x":' + nested.encode() + b"}")
    path = tmp_path / "deep.jsonl"
    path.write_bytes(mark.encode() + line + b"\n")
    done = _cli("import", str(path), "--url", f"sqlite:///{tmp_path / 'x.db'}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    assert done.stderr.startswith(f"error: {path}:1: ") and done.stderr.count("\n") == 1


def test_every_decoder_is_bounded() -> None:
    from tenxstore.serde import MAX_DEPTH, decode, encode

    deep = [[]]  # type: list[Any]
    for _ in range(MAX_DEPTH - 2):
        deep = [deep]
    for text in (encode(deep), " " + encode(deep)):
        assert decode(text) == deep
    for depth in (MAX_DEPTH + 1, 5_000, 200_000):
        with pytest.raises(ValueError):
            decode(" " + "[" * depth + "]" * depth)
        with pytest.raises(ValueError):
            decode(b" " + b"[" * depth + b"]" * depth)
