"""The tenxstore command, on SQLite and PostgreSQL, through its runner and a subprocess."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import tenxstore
from tenxstore import archive, migrate
from tenxstore.cli import app
from tests import services
from tests.conftest import drop_schema, new_schema

runner = CliRunner()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """``--url``/``--schema`` arguments of an empty database."""
    if request.param == "sqlite":
        yield ["--url", f"sqlite:///{tmp_path / 'cli.db'}"]
        return
    schema = new_schema()
    yield ["--url", services.pg_url(), "--schema", schema]
    asyncio.run(drop_schema(services.pg_url(), schema))


def repo_for(args: list[str]) -> tenxstore.CheckpointRepository:
    url = args[1]
    schema = args[3] if len(args) > 3 else None
    return tenxstore.CheckpointRepository(url, schema=schema)


def fill(args: list[str], threads: int = 3, turns: int = 4) -> None:
    """Threads with states, messages, metadata and tool calls, written by the library."""

    async def go() -> None:
        async with repo_for(args) as repo:
            await repo.asetup()
            for i in range(threads):
                config = {"thread_id": f"thread-{i}", "user_id": f"user-{i % 2}"}
                await repo.aput_thread(config, name=f"Thread {i} \x00", metadata={"n": 2**70})
                for turn in range(turns):
                    await repo.aput_checkpoint(
                        config,
                        {"turn": turn, "nan": float("nan")},
                        [{"role": "user", "content": f"{i}/{turn} ünï"}],
                    )
                await repo.arun_tool_once(config, f"call-{i}", "lookup", {"q": i}, lambda q: q * 2)

    asyncio.run(go())


def invoke(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    return result


def test_upgrade_and_current(db: list[str]) -> None:
    before = invoke("current", *db)
    assert before.exit_code == 0, before.output
    assert "current: (none)" in before.output and "behind" in before.output
    assert invoke("upgrade", *db).exit_code == 0
    after = invoke("current", *db)
    assert f"current: {migrate.head_revision()}" in after.output and "up to date" in after.output


def test_threads_show_and_history(db: list[str]) -> None:
    fill(db)
    listed = invoke("threads", *db)
    assert listed.exit_code == 0, listed.output
    assert all(f"thread-{i}" in listed.output for i in range(3))
    mine = invoke("threads", *db, "--user", "user-1")
    assert "thread-1" in mine.output and "thread-0" not in mine.output
    shown = invoke("show", "thread-1", *db, "--user", "user-1")
    assert shown.exit_code == 0, shown.output
    assert "version 4" in shown.output and "messages 4" in shown.output
    assert "tool calls 1" in shown.output and '"turn": 3' in shown.output
    history = invoke("history", "thread-1", *db)
    assert history.exit_code == 0 and all(f"│ {v} " in history.output for v in (1, 2, 3, 4))
    one = invoke("history", "thread-1", *db, "--version", "2")
    assert one.exit_code == 0 and '"turn": 1' in one.output


def export_all(args: list[str]) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        async with repo_for(args) as repo:
            exports = [
                await repo.aexport_thread({"thread_id": t.thread_id, **archive.OPERATOR})
                async for t in repo.aiter_threads()
            ]
            return [archive.export_to_json(e) for e in exports if e is not None]

    return asyncio.run(go())


def test_export_then_import_reproduces_every_row(db: list[str], tmp_path: Path) -> None:
    fill(db)
    path = tmp_path / "all.jsonl"
    exported = invoke("export", "--all", "-o", str(path), *db)
    assert exported.exit_code == 0, exported.output
    assert len(path.read_text().splitlines()) == 3
    target = ["--url", f"sqlite:///{tmp_path / 'target.db'}"]
    first = invoke("import", str(path), *target)
    assert first.exit_code == 0 and "3 created" in first.output, first.output
    assert json.dumps(export_all(target), sort_keys=True) == json.dumps(
        export_all(db), sort_keys=True
    )
    again = invoke("import", str(path), *target)
    assert "3 unchanged" in again.output
    one = tmp_path / "one.jsonl"
    assert invoke("export", "thread-0", "-o", str(one), *db).exit_code == 0
    fill(target[:2], threads=1, turns=5)  # thread-0 now differs in the target
    conflict = invoke("import", str(one), *target)
    assert conflict.exit_code == 1 and "other content" in conflict.output
    assert "3 unchanged" not in conflict.output
    replaced = invoke("import", str(one), *target, "--on-conflict", "replace")
    assert "1 replaced" in replaced.output
    assert export_all(target)[0] == export_all(db)[0]


def test_copy_sqlite_to_postgresql_resumes_and_verifies(tmp_path: Path) -> None:
    source = ["--url", f"sqlite:///{tmp_path / 'source.db'}"]

    async def many() -> None:
        async with repo_for(source) as repo:
            await repo.asetup()
            for i in range(1000):
                config = {"thread_id": f"t{i:04d}", "user_id": f"u{i % 7}"}
                await repo.aput_checkpoint(config, {"i": i}, [{"id": "m", "i": i}])
                if i % 100 == 0:
                    await repo.arun_tool_once(config, "c", "t", {}, lambda: "ok")

    asyncio.run(many())
    schema = new_schema()
    destination = ["--url", services.pg_url(), "--schema", schema]
    try:

        async def interrupted() -> None:
            async with repo_for(source) as src, repo_for(destination) as dst:
                await dst.asetup()
                done = 0

                def stop_midway(_: str) -> None:
                    nonlocal done
                    done += 1
                    if done == 400:
                        raise KeyboardInterrupt

                with pytest.raises(KeyboardInterrupt):
                    await archive.copy_threads(src, dst, progress=stop_midway)

        asyncio.run(interrupted())
        resumed = invoke("copy", source[1], destination[1], "--destination-schema", schema)
        assert resumed.exit_code == 0, resumed.output
        assert "400 unchanged" in resumed.output and "600 created" in resumed.output
        assert "holds 1000 thread(s)" in resumed.output
        assert export_all(destination) == export_all(source)  # row for row
    finally:
        asyncio.run(drop_schema(services.pg_url(), schema))


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tenxstore.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["threads", "--url", "postgresql://postgres@127.0.0.1:1/nowhere"],
        ["threads", "--url", "mysql://localhost/db"],
        ["show", "missing", "--url", "sqlite:///{tmp}/empty.db"],
        ["history", "missing", "--url", "sqlite:///{tmp}/empty.db"],
        ["import", "{tmp}/absent.jsonl", "--url", "sqlite:///{tmp}/empty.db"],
        ["export", "--url", "sqlite:///{tmp}/empty.db", "-o", "{tmp}/x.jsonl"],
    ],
    ids=["unreachable", "unsupported", "no-thread", "no-history", "no-file", "no-threads-named"],
)
def test_bad_input_is_one_line_and_no_traceback(args: list[str], tmp_path: Path) -> None:
    async def empty() -> None:
        async with tenxstore.CheckpointRepository(f"sqlite:///{tmp_path}/empty.db") as repo:
            await repo.asetup()

    asyncio.run(empty())
    done = run_cli(*(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr


def test_a_malformed_line_imports_nothing(tmp_path: Path) -> None:
    source = ["--url", f"sqlite:///{tmp_path / 's.db'}"]
    fill(source, threads=2)
    path = tmp_path / "broken.jsonl"
    assert invoke("export", "--all", "-o", str(path), *source).exit_code == 0
    good = path.read_text().splitlines()
    path.write_text(good[0] + "\n" + good[1][:40] + "\n")
    target = f"sqlite:///{tmp_path / 't.db'}"
    done = run_cli("import", str(path), "--url", target)
    assert done.returncode == 1 and f"{path}:2:" in done.stderr
    assert "Traceback" not in done.stderr
    assert export_all(["--url", target]) == []  # the good first line was not imported either


def test_demo_runs_with_no_flags(tmp_path: Path) -> None:
    done = run_cli("demo", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "lost a race" in done.stdout
    assert "replayed from the ledger" in done.stdout
    assert "email sent 1 time(s) and replayed 1 time(s)" in done.stdout
    assert (tmp_path / "tenxstore-demo.db").exists()
