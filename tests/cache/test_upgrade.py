"""A rolling upgrade: processes of the release before this one (which did not name the
master) and of this one share a Redis and a database.

This release stores an entry behind the name of its master, ``m:<master_replid>:``
and then the JSON as the release before wrote it. To that release such a value is not
JSON: a miss it logs and drops (the database answers), never a member of the state it
would hand back, and perhaps write back to the database. Its put script does not read
the prefixed head, and may replace the entry with one of its own: this release never
serves such a value (a miss, then a refill), while its guard still compares against
it. Fences did not change: both releases honour each other's.

The release before is the code this branch started from (:data:`PREVIOUS`): its
decoder and put script are run as they are, in a process of their own, when the
checkout holds that commit; the checks below that need no git run everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

import tenxstore
from tenxstore import CachedCheckpointer, CheckpointRepository
from tenxstore.redis_cache import decode_entry
from tests.cache.conftest import sql_statements
from tests.conftest import cfg

KEY = "cachetest:t1:alice"
ROOT = Path(__file__).parents[2]
PREVIOUS = "718342c5baef7eaf37939a6f84d9d692fc45dbeb"  # main, where this branch began

# The release before's head patterns (its _PARSE_HEAD), as its put, fence and drop
# scripts read a key: an entry's, and a fence's.
OLD_ENTRY_HEAD = '^ ?{"__checkpoint_version__":(%d+),"__checkpoint_incarnation__":(%d+)'
OLD_VERSION_HEAD = '^ ?{"__checkpoint_version__":(%d+)'
OLD_FENCE_HEAD = '^{"__checkpoint_fence__":%[(%d+),(%d+)%]'


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "u.db"


@pytest.fixture
async def cached(db: Path, redis_url: str) -> AsyncIterator[CachedCheckpointer]:
    repo = CheckpointRepository(f"sqlite:///{db}")
    await repo.asetup()
    cp = CachedCheckpointer(repo, redis_url=redis_url, key_prefix="cachetest", redis_timeout=2.0)
    yield cp
    await cp.aclose()


async def master_id(redis_client: Redis) -> bytes:
    replid: str = (await redis_client.info("replication"))["master_replid"]
    return replid.encode()


async def old_head_matches(redis_client: Redis, raw: bytes) -> list[bool]:
    """Whether each of the release before's head patterns matches ``raw`` (in Redis's
    own Lua, as its scripts run them)."""
    script = "return {string.match(ARGV[1], ARGV[2]) ~= nil and 1 or 0}"
    found = []
    for pattern in (OLD_ENTRY_HEAD, OLD_VERSION_HEAD, OLD_FENCE_HEAD):
        [matched] = await redis_client.eval(script, 0, raw, pattern)  # type: ignore[misc]
        found.append(bool(matched))
    return found


@pytest.mark.parametrize("state", [{"n": 1}, {"big": 2**70}], ids=["orjson", "stdlib"])
async def test_a_new_entry_is_no_json_to_the_release_before(
    cached: CachedCheckpointer, redis_client: Redis, state: dict[str, Any]
) -> None:
    await cached.aput_state(cfg(), state)
    raw = await redis_client.get(KEY)
    assert raw is not None
    tag = b"m:" + await master_id(redis_client) + b":"
    assert raw.startswith(tag) and b"__checkpoint_master__" not in raw
    body = raw[len(tag) :]  # the JSON as the release before wrote it
    assert body.startswith((b'{"__checkpoint_version__":1,', b' {"__checkpoint_version__":1,'))
    for loads in (json.loads, orjson.loads, tenxstore.serde.decode):
        with pytest.raises(ValueError):
            loads(raw)
    with pytest.raises(ValueError):  # the decoder the release before has too (unchanged)
        decode_entry(raw)
    entry = decode_entry(body)
    assert entry is not None and entry.state == state
    # its scripts see no entry and no fence there (it may replace it: see below)
    assert await old_head_matches(redis_client, raw) == [False, False, False]
    assert await old_head_matches(redis_client, body) == [True, True, False]


async def test_a_value_without_the_name_of_the_master_is_never_served(
    cached: CachedCheckpointer, redis_client: Redis
) -> None:
    config = cfg()
    await cached.aput_state(config, {"n": 1})
    life = config["_checkpoint_incarnation"]
    assert cached._redis is not None
    for old in (
        b'{"__checkpoint_version__":1,"__checkpoint_incarnation__":%d,"n":"old"}' % life,
        b' {"__checkpoint_version__":1,"__checkpoint_incarnation__":%d,"n":"old"}' % life,
        b'{"__checkpoint_version__":1,"n":"old"}',
    ):
        await redis_client.set(KEY, old)  # as the release before wrote it
        assert await cached._redis.get(KEY) == (old, False)
        with sql_statements(cached) as seen:
            assert await cached.aget_state_cache(cfg()) == {"n": 1}  # the database's
        assert seen != []
        refilled = await redis_client.get(KEY)
        assert refilled is not None and refilled.startswith(b"m:")
    with sql_statements(cached) as seen:
        assert await cached.aget_state_cache(cfg()) == {"n": 1}
    assert seen == []  # the refill, named: a hit


async def test_the_guard_reads_an_entry_of_the_release_before(
    cached: CachedCheckpointer, redis_client: Redis
) -> None:
    config = cfg()
    await cached.aput_state(config, {"n": 1})
    life = config["_checkpoint_incarnation"]
    newer = b'{"__checkpoint_version__":5,"__checkpoint_incarnation__":%d,"n":5}' % life
    await redis_client.set(KEY, newer)  # the release before cached version 5
    assert await cached.aput_state_cache(cfg(), {"n": "older"}, 3) is False
    assert await redis_client.get(KEY) == newer  # refused: it is below the entry
    assert await cached.aput_state_cache(cfg(), {"n": 6}, 6) is True
    stored = await redis_client.get(KEY)
    tag = b"m:" + await master_id(redis_client) + b":"
    assert stored == tag + b'{"__checkpoint_version__":6,"__checkpoint_incarnation__":%d,"n":6}' % (
        life
    )


async def test_fences_across_releases(cached: CachedCheckpointer, redis_client: Redis) -> None:
    config = cfg()
    await cached.aput_state(config, {"n": 1})
    life = config["_checkpoint_incarnation"]
    # this release's fence replaces the release before's entry...
    old = b'{"__checkpoint_version__":1,"__checkpoint_incarnation__":%d,"n":1}' % life
    await redis_client.set(KEY, old)
    assert cached._redis is not None
    await cached._redis.fence([(KEY, (life, 2))])
    fence = await redis_client.get(KEY)
    assert fence == b'{"__checkpoint_fence__":[%d,2]}' % life  # unprefixed, as it was
    assert decode_entry(fence) is None  # a miss to both releases' decoder
    assert await old_head_matches(redis_client, fence) == [False, False, True]
    # ...and the release before's fence (the same bytes) refuses this release's put below
    assert await cached.aput_state_cache(cfg(), {"n": "older"}, 1) is False
    assert await redis_client.get(KEY) == fence
    with sql_statements(cached) as seen:
        assert await cached.aget_state_cache(cfg()) == {"n": 1}  # a miss: the database
    assert seen != []


# -- the release before itself, in a process of its own --------------------------------

OLD_PROCESS = textwrap.dedent(
    """
    import asyncio, json, logging, sys

    import tenxstore
    from tenxstore import CachedCheckpointer, CheckpointRepository
    from tenxstore.redis_cache import decode_entry

    assert tenxstore.__file__.startswith(sys.argv[1]), tenxstore.__file__

    # A process of the release before that checked its schema before `tenxstore
    # upgrade` ran this release's migrations (0013: a nullable column it never names),
    # as in a rolling upgrade: it keeps running on that schema. (One started after the
    # upgrade refuses it: SchemaNotReady, "a newer tenxstore migrated it".)
    import tenxstore.migrate as migrate

    NEWER = ("0013_states_write_id",)
    checked = migrate.check_schema
    migrate.check_schema = lambda revision, store_id, where: checked(
        migrate.head_revision() if revision in NEWER else revision, store_id, where
    )
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("tenxstore").addHandler(handler)

    async def main(db, url, steps):
        repo = CheckpointRepository(f"sqlite:///{db}")
        cp = CachedCheckpointer(repo, redis_url=url, key_prefix="cachetest", redis_timeout=2.0)
        config = {"thread_id": "t1", "user_id": "alice"}
        out = []
        try:
            for step in steps:
                if step == "read":
                    out.append(await cp.aget_state_cache(dict(config)))
                else:
                    out.append(await cp.aput_state(dict(config), step))
        finally:
            await cp.aclose()
        return out

    done = asyncio.run(main(sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
    print(json.dumps({"out": done, "warnings": warnings}))
    """
)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release before's package, checked out of git (skips without that commit)."""
    where = tmp_path_factory.mktemp("previous")
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", PREVIOUS, "tenxstore", "alembic"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"this checkout does not hold {PREVIOUS[:10]} (the release before)")
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True, timeout=60)
    return where


def old_process(previous: Path, db: Path, redis_url: str, *steps: Any) -> dict[str, Any]:
    """Run ``steps`` ("read", or a state to write) on the release before; what each
    returned, and what it logged."""
    env = {**os.environ, "PYTHONPATH": str(previous)}
    done = subprocess.run(
        [sys.executable, "-c", OLD_PROCESS, str(previous), str(db), redis_url, json.dumps(steps)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=previous,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found


@pytest.mark.slow
async def test_the_release_before_and_this_one_side_by_side(
    previous: Path, cached: CachedCheckpointer, redis_client: Redis, db: Path, redis_url: str
) -> None:
    await cached.aput_state(cfg(), {"n": 1, "topic": "x"})
    assert (await redis_client.get(KEY) or b"").startswith(b"m:")
    # The release before reads this release's entry: a miss (logged, dropped), the
    # database's state exactly, which it refills in its own format.
    seen = old_process(previous, db, redis_url, "read")
    assert seen["out"] == [{"n": 1, "topic": "x"}]
    assert any("does not decode" in line for line in seen["warnings"])
    old = await redis_client.get(KEY)
    assert old is not None and old.startswith(b'{"__checkpoint_version__":1,')
    # This release never serves that entry: the database answers, and refills it named.
    with sql_statements(cached) as sql:
        assert await cached.aget_state_cache(cfg()) == {"n": 1, "topic": "x"}
    assert sql != []
    assert (await redis_client.get(KEY) or b"").startswith(b"m:")
    # The release before writes over this release's entry (its head is none it reads);
    # this release serves the database's head, then its own refill.
    assert old_process(previous, db, redis_url, {"n": 2})["out"] == [2]
    assert (await redis_client.get(KEY) or b"").startswith(b'{"__checkpoint_version__":2,')
    with sql_statements(cached) as sql:
        assert await cached.aget_state_cache(cfg()) == {"n": 2}
    assert sql != []
    with sql_statements(cached) as sql:
        assert await cached.aget_state_cache(cfg()) == {"n": 2}
    assert sql == []
    # This release's delete fences the key: the release before reads nothing, and its
    # refill or write below the fence does not land.
    assert await cached.aclean_thread(cfg())
    fence = await redis_client.get(KEY)
    assert fence is not None and fence.startswith(b'{"__checkpoint_fence__":')
    seen = old_process(previous, db, redis_url, "read")
    assert seen["out"] == [None] and seen["warnings"] == []
    assert await redis_client.get(KEY) == fence
    # The release before's write (a new life of the thread) and its entry: this release
    # serves the database's state, never the entry as it is.
    assert old_process(previous, db, redis_url, {"n": "again"})["out"] == [1]
    assert await cached.aget_state_cache(cfg()) == {"n": "again"}
    assert (await redis_client.get(KEY) or b"").startswith(b"m:")
    # and the release before reads it as a miss again, never with a member of ours
    assert old_process(previous, db, redis_url, "read")["out"] == [{"n": "again"}]
