"""``tenxstore delete-user``, ``prune`` and ``stats`` on SQLite and PostgreSQL, with the
application's Redis cache."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timezone
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import text

import tenxstore
from tenxstore.cache import cache_key
from tenxstore.cli import app, ops
from tests import services
from tests.test_cli import db, fill, invoke, repo_for, run_cli, runner

__all__ = ["db"]  # the fixture, shared with test_cli

FENCE = b'{"__checkpoint_fence__":'


def row(output: str, label: str) -> int:
    """The count printed beside ``label`` in a table of the command's output."""
    found = re.search(rf"{re.escape(label)}\s*│\s*(\d+)", output)
    assert found is not None, output
    return int(found[1])


def threads_of(args: list[str], user: str | None = None) -> list[str]:
    async def go() -> list[str]:
        async with repo_for(args) as repo:
            scope: dict[str, Any] = {"user_id": user} if user else {"user_id": "x"}
            if user is None:
                scope["auth_policy"] = tenxstore.AuthPolicy(enforce_user_isolation=False)
            return [t.thread_id for t in await repo.alist_threads(scope, limit=None)]

    return asyncio.run(go())


def app_cache(args: list[str], threads: list[str], user: str) -> list[bytes | None]:
    """Warm the application's cache (default key prefix) and return what Redis holds."""

    async def go() -> list[bytes | None]:
        async with tenxstore.CachedCheckpointer(
            repo_for(args), redis_url=services.redis_url()
        ) as cp:
            for thread in threads:
                await cp.aget_state_cache({"thread_id": thread, "user_id": user})
            keys = [cache_key(cp.key_prefix, t, user, True) for t in threads]
            async with Redis.from_url(services.redis_url()) as client:
                values: list[bytes | None] = await client.mget(keys)
                return values

    return asyncio.run(go())


def test_delete_user_erases_one_user_and_fences_the_cache(db: list[str]) -> None:
    fill(db)  # thread-0 and thread-2 of user-0, thread-1 of user-1; 4 turns each
    assert all(v is not None for v in app_cache(db, ["thread-0", "thread-2"], "user-0"))
    refused = invoke("delete-user", "user-0", *db)
    assert refused.exit_code == 1 and "add --yes" in refused.output
    assert threads_of(db, "user-0") == ["thread-2", "thread-0"]

    redis = ["--redis-url", services.redis_url()]
    done = invoke("delete-user", "user-0", "--yes", "--batch-size", "1", *db, *redis)
    assert done.exit_code == 0, done.output
    assert "erased user 'user-0' (2 batch(es))" in done.output
    counts = {k: row(done.output, k) for k in ("threads", "states", "messages", "tool executions")}
    assert counts == {"threads": 2, "states": 8, "messages": 8, "tool executions": 2}
    assert row(done.output, "cache keys fenced") == 4
    assert threads_of(db, "user-0") == [] and threads_of(db, "user-1") == ["thread-1"]
    assert all(v is None or v.startswith(FENCE) for v in app_cache(db, ["thread-0"], "user-0"))
    again = invoke("delete-user", "user-0", "--yes", *db)
    assert again.exit_code == 0 and row(again.output, "threads") == 0


def test_delete_user_with_redis_down_deletes_nothing_and_says_so(db: list[str]) -> None:
    fill(db)
    down = invoke("delete-user", "user-0", "--yes", *db, "--redis-url", "redis://127.0.0.1:1/0")
    assert down.exit_code == 1
    assert "could not be fenced" in down.output and "Run the call again" in down.output
    assert len(threads_of(db, "user-0")) == 2


def age_all(args: list[str], when: datetime) -> None:
    async def go() -> None:
        async with repo_for(args) as repo:
            schema = f'"{args[3]}".' if len(args) > 3 else ""
            async with repo.engine.begin() as conn:
                for sql in (
                    "UPDATE {s}threads SET updated_at = :w",
                    "UPDATE {s}tool_executions SET started_at = :w, finished_at = :w",
                ):
                    await conn.execute(text(sql.format(s=schema)), {"w": when})

    asyncio.run(go())


def test_prune_dry_run_then_prune(db: list[str]) -> None:
    fill(db)
    age_all(db, datetime(2020, 1, 1, tzinfo=timezone.utc))
    fill(db[:], threads=1, turns=1)  # thread-0 written again: in use
    bad = invoke("prune", "--idle-for", "ninety days", *db)
    assert bad.exit_code == 1 and "not a duration" in bad.output
    assert invoke("prune", *db).exit_code != 0  # --idle-for is required

    dry = invoke("prune", "--idle-for", "90d", "--dry-run", *db)
    assert dry.exit_code == 0, dry.output
    assert "2 thread(s) idle for 90d would be deleted" in dry.output
    assert "thread-1" in dry.output and "thread-2" in dry.output
    assert row(dry.output, "messages") == 8 and "2020-01-01" in dry.output
    assert sorted(threads_of(db)) == ["thread-0", "thread-1", "thread-2"]

    refused = invoke("prune", "--idle-for", "12w", *db)  # no terminal to ask on
    assert refused.exit_code == 1 and "add --yes" in refused.output
    assert sorted(threads_of(db)) == ["thread-0", "thread-1", "thread-2"]
    done = invoke("prune", "--idle-for", "12w", "--yes", *db, "--batch-size", "1")
    assert done.exit_code == 0, done.output
    assert row(done.output, "threads") == 2 and "(2 batch(es))" in done.output
    assert threads_of(db) == ["thread-0"]
    nothing = invoke("prune", "--idle-for", "90d", "--dry-run", *db)
    assert "0 thread(s) idle for 90d would be deleted" in nothing.output


def test_stats_prints_users_tables_and_cache_keys(db: list[str]) -> None:
    fill(db)
    app_cache(db, ["thread-0"], "user-0")
    shown = invoke("stats", *db, "--top", "1", "--redis-url", services.redis_url(), "--exact")
    assert shown.exit_code == 0, shown.output
    assert "threads   3 of 2 user(s)" in shown.output
    assert re.search(r"user-0\s*│\s*2\s*│\s*8\s*│\s*8\s*│\s*2\s*│\s*0", shown.output)
    assert "user-1" not in shown.output  # top 1
    assert row(shown.output, "messages") == 12  # the table's rows
    keys = re.search(r"cache\s+(\d+) key\(s\)", shown.output)
    assert keys is not None and int(keys[1]) >= 1
    for name in ("threads", "states", "messages", "tool_executions", "lg_checkpoints"):
        assert re.search(rf"{name}\s*│\s*\d+\s*│\s*[\d.]+ k?B", shown.output), name


def test_the_console_script_runs_the_new_commands(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    fill(["--url", url], threads=2, turns=1)
    erased = run_cli("delete-user", "user-1", "--yes", "--url", url)
    assert erased.returncode == 0, erased.stderr
    assert re.search(r"threads\s*│\s*1", erased.stdout)
    bad = run_cli("prune", "--idle-for", "90x", "--url", url)
    assert bad.returncode == 1 and bad.stderr.startswith("error: not a duration: '90x'")
    assert "Traceback" not in bad.stderr
    stats = run_cli("stats", "--url", url)
    assert stats.returncode == 0 and "threads   1 of 1 user(s)" in stats.stdout


def test_delete_user_and_prune_alike_dry_run_and_ask_first(
    db: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both show what would go with --dry-run, and on a terminal ask before deleting
    (no deletes nothing); without one, both need --yes."""
    fill(db)  # thread-0 and thread-2 of user-0, thread-1 of user-1
    age_all(db, datetime(2020, 1, 1, tzinfo=timezone.utc))
    dry = invoke("delete-user", "user-0", "--dry-run", *db)
    assert dry.exit_code == 0, dry.output
    assert "2 thread(s) and 0 memor(ies) of user 'user-0' would be erased" in dry.output
    assert row(dry.output, "messages") == 8 and "thread-2" in dry.output
    for command in (["delete-user", "user-0"], ["prune", "--idle-for", "90d"]):
        refused = invoke(*command, *db)
        assert refused.exit_code == 1 and "no terminal to ask on: add --yes" in refused.output

    monkeypatch.setattr(ops, "_interactive", lambda: True)
    kept = runner.invoke(app, ["delete-user", "user-0", *db], input="n\n")
    assert kept.exit_code == 1 and "nothing was deleted" in kept.output
    assert "erase 2 thread(s) and 0 memor(ies) of user 'user-0' for good?" in kept.output
    kept = runner.invoke(app, ["prune", "--idle-for", "90d", *db], input="\n")  # default: no
    assert kept.exit_code == 1 and "delete 3 thread(s) idle for 90d?" in kept.output
    assert sorted(threads_of(db)) == ["thread-0", "thread-1", "thread-2"]

    erased = runner.invoke(app, ["delete-user", "user-0", *db], input="y\n")
    assert erased.exit_code == 0 and row(erased.output, "threads") == 2, erased.output
    pruned = runner.invoke(app, ["prune", "--idle-for", "90d", *db], input="y\n")
    assert pruned.exit_code == 0 and row(pruned.output, "threads") == 1, pruned.output
    assert threads_of(db) == []
