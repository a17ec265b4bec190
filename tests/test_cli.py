"""The tenxstore command, on SQLite and PostgreSQL, through its runner and a subprocess."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url
from typer.testing import CliRunner

import tenxstore
from tenxstore import archive, migrate, serde
from tenxstore.cli import app
from tenxstore.langgraph import TenxCheckpointSaver
from tests import services
from tests.conftest import drop_schema, mysql_admin, new_mysql_database, new_schema
from tests.servers import free_port

runner = CliRunner()


def database(kind: str, tmp_path: Path) -> Iterator[list[str]]:
    """``--url``/``--schema`` arguments of an empty database of that kind."""
    if kind == "sqlite":
        yield ["--url", f"sqlite:///{tmp_path / 'cli.db'}"]
    elif kind == "postgresql":
        schema = new_schema()
        yield ["--url", services.pg_url(), "--schema", schema]
        asyncio.run(drop_schema(services.pg_url(), schema))
    else:
        url, name = asyncio.run(new_mysql_database())
        yield ["--url", url]
        asyncio.run(mysql_admin(services.mysql_url(), f"DROP DATABASE `{name}`"))


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """``--url``/``--schema`` arguments of an empty database."""
    yield from database(request.param, tmp_path)


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def every_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """The same, on each SQL database."""
    yield from database(request.param, tmp_path)


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
    assert before.exit_code == 1, before.output  # behind head is not "fine"
    if db[1].startswith("sqlite"):
        assert "no SQLite database" in before.output
        assert not Path(db[1].removeprefix("sqlite:///")).exists()  # reading created nothing
    else:
        assert "current: (none)" in before.output and "behind" in before.output
    assert invoke("upgrade", *db).exit_code == 0
    after = invoke("current", *db)
    assert f"current: {migrate.head_revision()}" in after.output and "up to date" in after.output


def test_a_url_naming_several_hosts(tmp_path: Path) -> None:
    """libpq's ``h1:p1,h2:p2`` works in every command, reads included (the reading
    commands look at the URL first: it parsed as one host with a port of "p1,h2")."""
    url = make_url(services.pg_url())
    who = f"{url.username}@" if url.username else ""
    several = f"postgresql://{who}127.0.0.1:{free_port()},{url.host}:{url.port}/{url.database}"
    args = ["--url", several, "--schema", new_schema()]
    try:
        assert invoke("upgrade", *args).exit_code == 0
        fill(args, threads=1, turns=1)
        listed = invoke("threads", *args)
        assert listed.exit_code == 0 and "thread-0" in listed.output, listed.output
    finally:
        asyncio.run(drop_schema(services.pg_url(), args[3]))


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


def graph_threads(args: list[str]) -> None:
    """Thread ``lg`` written by a LangGraph chat graph only (two turns), thread
    ``both`` by the core API and then the graph."""
    from tests.langgraph.test_threads import alice, chat

    async def go() -> None:
        async with repo_for(args) as repo:
            await repo.asetup()
            graph = chat(TenxCheckpointSaver(repo))
            await repo.aput_checkpoint(
                {"thread_id": "both", "user_id": "alice"},
                {"core": True},
                [{"role": "user", "content": "from the core API"}],
            )
            for text in ("hello [bold]there[/]", "and again"):
                await graph.ainvoke({"messages": [("user", text)]}, alice("lg"))
            await graph.ainvoke({"messages": [("user", "graph too")]}, alice("both"))

    asyncio.run(go())


def test_a_langgraph_thread_in_threads_show_and_history(every_db: list[str]) -> None:
    graph_threads(every_db)
    listed = invoke("threads", *every_db)
    assert listed.exit_code == 0, listed.output
    rows = [line for line in listed.output.splitlines() if "alice" in line]
    # the last write first; LangGraph checkpoints counted (two turns: 6; one: 3)
    assert [row.split("│")[1].strip() for row in rows] == ["both", "lg"], listed.output
    assert [row.split("│")[5].strip() for row in rows] == ["3", "6"], listed.output

    shown = invoke("show", "lg", *every_db, "--user", "alice")
    assert shown.exit_code == 0, shown.output
    assert "version 0" in shown.output and "LangGraph checkpoints 6" in shown.output
    assert "step 4  source loop" in shown.output and "null" not in shown.output
    conversation = [line.strip() for line in shown.output.splitlines() if line.startswith("  ")]
    assert conversation[:4] == [
        "human: hello [bold]there[/]",
        "ai: reply 1",
        "human: and again",
        "ai: reply 3",
    ], shown.output
    assert invoke("show", "lg", *every_db, "--user", "mallory").exit_code == 1

    both = invoke("show", "both", *every_db)
    assert both.exit_code == 0, both.output
    assert "state (core API), version 1:" in both.output and '"core": true' in both.output
    assert "human: graph too" in both.output and "from the core API" not in both.output

    history = invoke("history", "lg", *every_db)
    assert history.exit_code == 0, history.output
    ids = re.findall(r"│ ([0-9a-f-]{36}) │", history.output)
    assert len(ids) == 6 and ids == sorted(ids, reverse=True), history.output
    assert (
        "branch:to:reply, messages" in history.output and "states (core API)" not in history.output
    )
    first_input = invoke("history", "lg", *every_db, "--checkpoint", ids[-1])
    assert first_input.exit_code == 0, first_input.output
    assert "step -1  source input" in first_input.output
    assert "pending writes:" in first_input.output and "hello [bold]there[/]" in first_input.output
    labelled = invoke("history", "both", *every_db)
    assert "states (core API)" in labelled.output and "LangGraph checkpoints" in labelled.output
    missing = invoke("history", "lg", *every_db, "--checkpoint", "nope")
    assert missing.exit_code == 1 and "no LangGraph checkpoint 'nope'" in missing.output


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


@pytest.mark.slow
def test_copy_sqlite_to_postgresql_resumes_and_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive, "THREAD_PAGE", 50)  # the resumed copy crosses a page
    source = ["--url", f"sqlite:///{tmp_path / 'source.db'}"]

    async def many() -> None:
        async with repo_for(source) as repo:
            await repo.asetup()
            for i in range(120):  # three pages of 50
                config = {"thread_id": f"t{i:04d}", "user_id": f"u{i % 7}"}
                await repo.aput_checkpoint(config, {"i": i}, [{"id": "m", "i": i}])
                if i % 12 == 0:
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
                    if done == 30:
                        raise KeyboardInterrupt

                with pytest.raises(KeyboardInterrupt):
                    await archive.copy_threads(src, dst, progress=stop_midway)

        asyncio.run(interrupted())
        resumed = invoke("copy", source[1], destination[1], "--destination-schema", schema)
        assert resumed.exit_code == 0, resumed.output
        assert "30 unchanged" in resumed.output and "90 created" in resumed.output
        assert "holds 120 thread(s)" in resumed.output
        assert export_all(destination) == export_all(source)  # row for row
    finally:
        asyncio.run(drop_schema(services.pg_url(), schema))


def test_copy_between_sqlite_mariadb_and_postgresql(tmp_path: Path) -> None:
    """The three databases, each way round: SQLite -> MariaDB -> PostgreSQL -> SQLite."""
    source = ["--url", f"sqlite:///{tmp_path / 'source.db'}"]
    fill(source, threads=5, turns=3)
    mysql, database = asyncio.run(new_mysql_database())
    schema = new_schema()
    try:
        for src, dst, extra in (
            (source[1], mysql, []),
            (mysql, services.pg_url(), ["--destination-schema", schema]),
            (services.pg_url(), f"sqlite:///{tmp_path / 'back.db'}", ["--source-schema", schema]),
        ):
            done = invoke("copy", src, dst, *extra)
            assert done.exit_code == 0, done.output
            assert "5 created" in done.output and "holds 5 thread(s)" in done.output
        expected = export_all(source)
        assert export_all(["--url", mysql]) == expected
        assert export_all(["--url", services.pg_url(), "--schema", schema]) == expected
        assert export_all(["--url", f"sqlite:///{tmp_path / 'back.db'}"]) == expected
    finally:
        asyncio.run(drop_schema(services.pg_url(), schema))
        asyncio.run(mysql_admin(services.mysql_url(), f"DROP DATABASE `{database}`"))


def _another_spelling(url: str) -> str:
    """The same database by another URL: another path to the SQLite file, or a libpq
    option that changes nothing of the PostgreSQL database."""
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        return f"sqlite:///{path.parent}/./{path.name}"
    return f"{url}{'&' if '?' in url else '?'}application_name=copy-onto-itself"


def test_copy_onto_the_same_store_is_refused_before_any_write(db: list[str]) -> None:
    fill(db, threads=2, turns=2)
    before = export_all(db)
    schemas = ["--source-schema", db[3], "--destination-schema", db[3]] if len(db) > 3 else []
    for destination in (db[1], _another_spelling(db[1])):
        refused = invoke("copy", db[1], destination, *schemas, "--on-conflict", "replace")
        assert refused.exit_code == 1, refused.output
        assert "the source and the destination are the same store" in refused.output
        assert "copied" not in refused.output.replace("nothing was copied", "")
    assert export_all(db) == before


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
        ["threads", "--url", "oracle://localhost/db"],
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


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [serde.decode(line) for line in path.read_text().splitlines()]


def write_lines(path: Path, records: list[dict[str, Any]]) -> None:
    def line(record: dict[str, Any]) -> str:
        try:
            return serde.encode(record)
        except tenxstore.SerializationError:  # a lone surrogate: only an escape writes it
            return json.dumps(record)

    path.write_text("".join(line(r) + "\n" for r in records))


@pytest.mark.parametrize(
    ("break_it", "named"),
    [
        (lambda r: r["thread"].update(version=-5), "$.thread.version"),
        (lambda r: r["messages"].append({"message": [1], "created_at": None}), "$.messages"),
        (lambda r: r["tool_executions"][0].update(status="x" * 40), "$.tool_executions[0].status"),
        (lambda r: r["thread"].update(version=r["thread"]["version"] + 1), "thread.version"),
        (lambda r: r["thread"].update(thread_id="\ud800"), ":2:"),  # not even JSON text
    ],
    ids=["negative-version", "list-message", "long-status", "version-mismatch", "surrogate-id"],
)
def test_import_checks_every_line_first_and_writes_nothing(
    tmp_path: Path, break_it: Any, named: str
) -> None:
    source = ["--url", f"sqlite:///{tmp_path / 's.db'}"]
    fill(source, threads=3)
    path = tmp_path / "all.jsonl"
    assert invoke("export", "--all", "-o", str(path), *source).exit_code == 0
    records = lines_of(path)
    break_it(records[1])
    write_lines(path, records)
    target = f"sqlite:///{tmp_path / 't.db'}"
    done = run_cli("import", str(path), "--url", target)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{path}:2:" in done.stderr and named in done.stderr, done.stderr
    assert export_all(["--url", target]) == []  # line 1 was not imported either


def test_a_conflict_on_a_later_line_imports_nothing(tmp_path: Path) -> None:
    source = ["--url", f"sqlite:///{tmp_path / 's.db'}"]
    fill(source, threads=3)
    path = tmp_path / "all.jsonl"
    assert invoke("export", "--all", "-o", str(path), *source).exit_code == 0
    target = ["--url", f"sqlite:///{tmp_path / 't.db'}"]
    fill(target, threads=1, turns=5)  # thread-0 exists in the target with other content
    records = lines_of(path)
    write_lines(path, [*records[1:], records[0]])
    done = run_cli("import", str(path), *target)
    assert done.returncode == 1 and f"{path}:3:" in done.stderr and "other content" in done.stderr
    assert [e["thread"]["thread_id"] for e in export_all(target)] == ["thread-0"]


def test_export_to_standard_output_and_no_file_on_failure(tmp_path: Path) -> None:
    source = ["--url", f"sqlite:///{tmp_path / 's.db'}"]
    fill(source, threads=2)
    done = run_cli("export", "--all", *source)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["thread"]["thread_id"] for line in done.stdout.splitlines()] == [
        "thread-0",
        "thread-1",
    ]
    target = tmp_path / "nope.jsonl"
    missing = run_cli("export", "thread-0", "nope", "-o", str(target), *source)
    assert missing.returncode == 1 and "no thread 'nope'" in missing.stderr
    assert not target.exists() and list(tmp_path.glob("*.partial")) == []


def test_commands_that_read_create_no_database(tmp_path: Path) -> None:
    absent = tmp_path / "absent.db"
    for args in (
        ["threads", "--url", f"sqlite:///{absent}"],
        ["current", "--url", f"sqlite:///{absent}"],
        ["doctor", "--url", f"sqlite:///{absent}"],
        ["copy", f"sqlite:///{absent}", f"sqlite:///{tmp_path / 'copy.db'}"],
    ):
        done = run_cli(*args)
        assert done.returncode == 1 and "no SQLite database" in done.stderr, (args, done.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_bad_choices_fail_before_connecting(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text("")
    done = run_cli(
        "import",
        str(tmp_path / "x.jsonl"),
        "--on-conflict",
        "bogus",
        "--url",
        "postgresql://x@127.0.0.1:1/db",
    )
    assert done.returncode == 2 and "--on-conflict" in done.stderr and "bogus" in done.stderr
    assert "on_conflict" not in done.stderr and "Traceback" not in done.stderr


def test_listings_say_when_there_is_nothing_and_print_one_time_format(tmp_path: Path) -> None:
    db = ["--url", f"sqlite:///{tmp_path / 'd.db'}"]
    assert invoke("upgrade", *db).exit_code == 0
    empty = invoke("threads", *db)
    assert empty.exit_code == 0 and "no threads" in empty.output
    fill(db, threads=1, turns=2)
    stamps = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC")
    assert stamps.search(invoke("threads", *db).output)
    assert stamps.search(invoke("history", "thread-0", *db).output)
    assert "``" not in invoke("history", "--help").output


def test_what_the_data_holds_is_printed_as_it_is(tmp_path: Path) -> None:
    """Ids, names and errors are the user's data: rich markup in them ("[/]" would be a
    closing tag with nothing to close; "[bold]" a style) is printed as written, by every
    command, bars included."""
    args = ["--url", f"sqlite:///{tmp_path / 'markup.db'}"]
    name, user = "[/][b]x", "[red]u"  # short: the table's columns fit them whole

    async def write() -> None:
        async with repo_for(args) as repo:
            await repo.asetup()
            config = {"thread_id": "[/]t", "user_id": user}
            await repo.aput_thread(config, name=name)
            await repo.aput_checkpoint(config, {"n": 1}, [{"content": "[/]"}])
            await repo.arun_tool_once(config, "[/]call", "[/]tool", {"q": 1}, lambda q: q)

    asyncio.run(write())
    listed = invoke("threads", *args)
    assert listed.exit_code == 0 and name in listed.output and user in listed.output
    shown = invoke("show", "[/]t", "--user", user, *args)
    assert shown.exit_code == 0 and "[/]tool" in shown.output, shown.output
    assert invoke("history", "[/]t", *args).exit_code == 0
    assert invoke("stats", *args).exit_code == 0
    erased = invoke("delete-user", user, "--yes", *args)
    assert erased.exit_code == 0, erased.output


def test_version_downgrade_and_doctor(tmp_path: Path) -> None:
    assert invoke("--version").output.strip() == f"tenxstore {tenxstore.__version__}"
    db = ["--url", f"sqlite:///{tmp_path / 'd.db'}"]
    assert invoke("upgrade", *db).exit_code == 0
    healthy = invoke("doctor", *db)
    assert healthy.exit_code == 0 and "healthy" in healthy.output
    refused = invoke("downgrade", "0002_langgraph", *db)
    assert refused.exit_code == 1 and "--yes" in refused.output
    assert invoke("downgrade", "0002_langgraph", *db, "--yes").exit_code == 0
    behind = invoke("doctor", *db)
    assert (
        behind.exit_code == 1 and "0002_langgraph" in behind.output and "upgrade" in behind.output
    )
    no_redis = invoke("doctor", *db, "--redis-url", f"redis://127.0.0.1:{services.free_port()}/0")
    assert no_redis.exit_code == 1 and "cache:" in no_redis.output


def test_demo_on_postgresql(tmp_path: Path) -> None:
    schema = new_schema()
    try:
        done = run_cli("demo", "--url", services.pg_url(), "--schema", schema, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "email sent 1 time(s)" in done.stdout and list(tmp_path.iterdir()) == []
    finally:
        asyncio.run(drop_schema(services.pg_url(), schema))


def test_import_replace_invalidates_the_applications_cache(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    fill(["--url", url], threads=1, turns=2)
    backup = tmp_path / "backup.jsonl"
    assert invoke("export", "thread-0", "-o", str(backup), "--url", url).exit_code == 0

    async def app_reads() -> Any:
        async with tenxstore.SqliteCheckpointer(
            tmp_path / "app.db", redis_url=services.redis_url()
        ) as cp:
            return await cp.aget_state_cache({"thread_id": "thread-0", "user_id": "user-0"})

    async def app_writes() -> None:
        async with tenxstore.SqliteCheckpointer(
            tmp_path / "app.db", redis_url=services.redis_url()
        ) as cp:
            config = {"thread_id": "thread-0", "user_id": "user-0"}
            await cp.aget_state_cache(config)
            await cp.aput_state(config, {"turn": "after the backup"})
            assert await cp.aget_state_cache(dict(config)) == {"turn": "after the backup"}

    asyncio.run(app_writes())
    done = invoke(
        "import",
        str(backup),
        "--url",
        url,
        "--on-conflict",
        "replace",
        "--redis-url",
        services.redis_url(),
    )
    assert done.exit_code == 0 and "1 replaced" in done.output, done.output
    restored = asyncio.run(app_reads())
    assert restored is not None and restored["turn"] == 1  # the backup, not the cached entry
    # Redis unreachable: the database changes, but the command says what it could not do.
    asyncio.run(app_writes())
    lost = invoke(
        "import",
        str(backup),
        "--url",
        url,
        "--on-conflict",
        "replace",
        "--redis-url",
        "redis://127.0.0.1:1/0",
    )
    assert lost.exit_code == 1, lost.output
    assert "cache invalidation(s) did not reach Redis" in lost.output
    # Run again once Redis answers: the database is as imported, and the entry is fenced.
    again = invoke(
        "import",
        str(backup),
        "--url",
        url,
        "--on-conflict",
        "replace",
        "--redis-url",
        services.redis_url(),
    )
    assert again.exit_code == 0 and "1 unchanged" in again.output, again.output
    restored = asyncio.run(app_reads())
    assert restored is not None and restored["turn"] == 1


def test_a_command_reads_the_primary_whatever_replicas_the_url_names() -> None:
    """An operator reads what is there now: the ``replica=`` options of a URL are left
    out of the repository a command opens."""
    from tenxstore.cli.common import repository

    repo = repository("postgresql://u@h/db?replica=s1&replica=s2:5433&max_replica_lag=2", None)
    assert repo.backend.replicas is None
    assert "replica" not in repo.backend.engine.url.query
