"""URLs in errors never show a password; libpq's URL options work on asyncpg; a tool
call reused with other arguments names them by a digest, never their values."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import make_url, text

import tenxstore
from tenxstore import CheckpointRepository, ConfigError, ToolExecutionMismatch
from tenxstore.backends import async_url
from tenxstore.backends.pgoptions import asyncpg_options, several_hosts
from tenxstore.backends.standbys import replicas_of_url
from tenxstore.validate import masked_url
from tests.conftest import cfg
from tests.servers import free_port

SECRET = "s3cr3t-Pa55"

BAD_URLS = [
    f"postgresql://app:{SECRET}@127.0.0.1:54x2/test",  # a typo in the port
    f"postgresql://app:{SECRET}@[::1/test",  # an unclosed IPv6 bracket
    f"mysql://root:{SECRET}@127.0.0.1:33o6/test",
    f"postgresql://app:{SECRET}@127.0.0.1/test?bogus=1",
    f"postgresql://app:{SECRET}@127.0.0.1/test?sslmode=sometimes",
    f"postgresql://app:{SECRET}@127.0.0.1/test?connect_timeout=soon",
    f"postgresql://app:{SECRET}@127.0.0.1/test?sslmode=require&sslmode=disable",
    f"postgresql://app:{SECRET}@h1:54x2,h2:5432/test",  # several hosts, a typo in one
    f"postgresql://app:{SECRET}@,h2:5432/test",  # an empty host
    f"postgresql://app:{SECRET}@h1:,h2/test",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_url_that_is_refused_never_shows_its_password(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        CheckpointRepository(url)
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda: tenxstore.SqliteCheckpointer(f"postgresql://app:{SECRET}@host/db"),
        lambda: tenxstore.PgCheckpointer(
            postgres_dsn=f"postgresql://app:{SECRET}@127.0.0.1:5x/db", redis_url="redis://h"
        ),
        lambda: tenxstore.SqliteCheckpointer(
            "x.db", redis_url=f"redis://:{SECRET}@localhost:63x9/0"
        ),
        lambda: tenxstore.CachedCheckpointer(
            tenxstore.InMemoryCheckpointer(), redis_url=f"redis://u:{SECRET}@[::1/0"
        ),
        lambda: tenxstore.CachedCheckpointer(
            tenxstore.InMemoryCheckpointer(), redis_url=f"rediss//:{SECRET}@host/0"
        ),
    ],
)
def test_presets_and_redis_urls_never_show_a_password(make: Any) -> None:
    with pytest.raises(ConfigError) as refused:
        make()
    assert SECRET not in str(refused.value)


def test_masked_url() -> None:
    for url, shown in (
        (f"postgresql://u:{SECRET}@h/db", "postgresql://u:***@h/db"),
        (f"postgresql://u:p@{SECRET}@h/db", "postgresql://u:***@h/db"),  # "@" unescaped
        (f"rediss//:{SECRET}@h/0", "rediss//:***@h/0"),  # no "://"
        (f"postgresql://h/db?password={SECRET}&sslmode=require", None),
        (
            "postgresql://u@h:5432/db?application_name=a@b",
            "postgresql://u@h:5432/db?application_name=a@b",
        ),
        ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db"),
    ):
        masked = masked_url(url)
        assert SECRET not in masked
        if shown is not None:
            assert masked == shown


async def _setting(repo: CheckpointRepository, name: str) -> str:
    async with repo.engine.connect() as conn:
        value: str = (await conn.execute(text(f"SHOW {name}"))).scalar_one()
    return value


async def test_libpq_options_reach_asyncpg(pg_url: str, pg_schema: str) -> None:
    """psql's URL options work: TLS off as asked, an application name, server settings
    through ``options``, a connect timeout — and the store works through them."""
    url = (
        f"{pg_url}?sslmode=disable&application_name=tenx-worker&connect_timeout=5"
        "&options=-c%20statement_timeout%3D4500%20-c%20search_path%3Delsewhere"
    )
    async with CheckpointRepository(url, schema=pg_schema) as repo:
        await repo.asetup()
        await repo.aput_state(cfg(), {"ok": True})
        assert await repo.aget_state(cfg()) == {"ok": True}
        assert await _setting(repo, "application_name") == "tenx-worker"
        assert await _setting(repo, "statement_timeout") == "4500ms"
        assert await _setting(repo, "search_path") == "elsewhere"
        assert await _setting(repo, "ssl") in ("off", "on")  # the server's, not an error


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # a password may hold ",", "/" and "?": it is not a list of hosts
        ("postgresql://u:Hunter2,x/y@h:5432/db", "postgresql://u:Hunter2,x/y@h:5432/db"),
        ("postgresql://u:pa,ss?word@h/db", "postgresql://u:pa,ss?word@h/db"),
        ("postgresql://u:1,2/3@h/db", "postgresql://u:1,2/3@h/db"),
        # a host without a port gets libpq's 5432 (SQLAlchemy's list needs every port)
        ("postgresql://u@h1,h2:6/db", "postgresql://u@/db?host=h1:5432&host=h2:6"),
        ("postgresql://u:p@h1:1,h2:2/db?sslmode=disable",
         "postgresql://u:p@/db?host=h1:1&host=h2:2&sslmode=disable"),
        ("postgresql://u@%2Ftmp,h2/db", "postgresql://u@/db?host=/tmp:5432&host=h2:5432"),
        ("postgresql://h1,h2/db?application_name=a@b",
         "postgresql:///db?host=h1:5432&host=h2:5432&application_name=a@b"),
        ("mysql://u@h1,h2/db", "mysql://u@h1,h2/db"),  # not ours to read
    ],
)  # fmt: skip
def test_several_hosts_are_read_as_libpq_reads_them(given: str, expected: str) -> None:
    assert several_hosts(given) == expected


@pytest.mark.parametrize(
    "hosts", ["[::1]:5432,h2", "h1:x,h2", "h1:\u0665,h2", ",h2", "h1:,h2", "h1,h2:"]
)
def test_a_list_of_hosts_that_cannot_be_read_is_refused(hosts: str) -> None:
    with pytest.raises(ConfigError, match="each must be host or host:port"):
        CheckpointRepository(f"postgresql://app:{SECRET}@{hosts}/db")


def test_several_hosts_ask_for_the_primary_in_either_form() -> None:
    """``read-write`` unless the URL says otherwise: libpq's list, SQLAlchemy's repeated
    ``host=``, and its ``host=a,b&port=p,q``."""
    for url in (
        "postgresql://u@h1:1,h2:2/db",
        "postgresql://u@/db?host=h1:1&host=h2:2",
        "postgresql://u@/db?host=h1,h2&port=1,2",
    ):
        _, args = asyncpg_options(async_url(url))
        assert args["dsn"] == "postgresql://?target_session_attrs=read-write", url
    _, args = asyncpg_options(async_url("postgresql://u@h1,h2/db?target_session_attrs=any"))
    assert args["dsn"] == "postgresql://?target_session_attrs=any"
    _, args = asyncpg_options(async_url("postgresql://u@h1/db"))
    assert "dsn" not in args  # one host: as libpq, any


@pytest.mark.parametrize("form", ["commas", "query"])
async def test_several_hosts_reach_the_one_that_answers(
    pg_url: str, pg_schema: str, form: str
) -> None:
    """libpq's several hosts (``h1:p1,h2:p2``) and SQLAlchemy's (``?host=h1:p1&host=...``)
    both work: a host that refuses is passed over. With none answering, the error is
    ``DatabaseUnavailable`` naming them (a standby-only list: tests/scale/test_failover.py)."""
    url = make_url(pg_url)
    dead = f"127.0.0.1:{free_port()}"
    live = f"{url.host}:{url.port or 5432}"
    who = f"{url.username}@" if url.username else ""
    if form == "commas":
        several = f"postgresql://{who}{dead},{live}/{url.database}"
    else:
        several = f"postgresql://{who}/{url.database}?host={dead}&host={live}"
    async with CheckpointRepository(several, schema=pg_schema) as repo:
        await repo.asetup()
        await repo.aput_state(cfg(), {"ok": True})
        assert await repo.aget_state(cfg()) == {"ok": True}
    nobody = f"postgresql://{who}{dead},127.0.0.1:{free_port()}/{url.database}"
    async with CheckpointRepository(nobody, schema=pg_schema) as repo:
        with pytest.raises(tenxstore.DatabaseUnavailable, match="connection refused"):
            await repo.aget_state(cfg())


async def test_tls_required_of_a_server_without_it_is_our_error(pg_url: str) -> None:
    """``sslmode=require`` against a server that speaks no TLS: a TenxStoreError at the
    first call (the connection cannot be opened), never a raw TypeError."""
    async with CheckpointRepository(f"{pg_url}?sslmode=require") as repo:
        with pytest.raises(tenxstore.TenxStoreError):
            await repo.astore_id()


async def test_a_mismatch_names_arguments_by_digest(cp: CheckpointRepository) -> None:
    await cp.abegin_tool_execution(cfg(), "call", "charge", {"card": "4111-1111", "cvv": "123"})
    with pytest.raises(ToolExecutionMismatch) as other:
        await cp.abegin_tool_execution(cfg(), "call", "charge", {"card": "4111-1111", "cvv": "999"})
    message = str(other.value)
    assert "4111" not in message and "cvv" not in message and "123" not in message
    assert message.count("sha256:") == 2 and "'charge'" in message and "'call'" in message


def test_replicas_named_in_the_url_share_the_primary_s_settings() -> None:
    repo = CheckpointRepository(
        f"postgresql://app:{SECRET}@h1:1,h2:2/db?replica=s1&replica=s2:5433"
        "&max_replica_lag=2.5&sslmode=disable"
    )
    replicas = repo.backend.replicas
    assert replicas is not None and replicas.max_lag == 2.5
    urls = [r.backend.engine.url for r in replicas.replicas]
    assert [(u.host, u.port) for u in urls] == [("s1", 5432), ("s2", 5433)]
    for url in urls:
        assert url.password == SECRET and url.username == "app" and url.database == "db"
    _, standbys, lag = replicas_of_url(
        async_url("postgresql://u@h1,h2/db?replica=s&sslmode=disable")
    )
    assert [dict(u.query) for u in standbys] == [{"sslmode": "disable"}]  # not read-write
    assert lag is None
    assert "replica" not in repo.backend.engine.url.query
    assert SECRET not in replicas.replicas[0].name
    given = CheckpointRepository(
        "postgresql://u@h/db", replica_urls=["postgresql://u@s/db"], max_replica_lag=0.5
    )
    assert given.backend.replicas is not None and given.backend.replicas.max_lag == 0.5


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("postgresql://u@h/db?replica=s:x", {}, "replica= must be host"),
        ("postgresql://u@h/db?replica=u@s", {}, "replica= must be host"),
        ("postgresql://u@h/db?replica=:5432", {}, "replica= must be host"),
        ("postgresql://u@h/db?max_replica_lag=soon", {}, "max_replica_lag= must be a number"),
        ("postgresql://u@h/db?max_replica_lag=-1", {}, "max_replica_lag must be a positive"),
        ("postgresql://u@h/db", {"max_replica_lag": 0}, "max_replica_lag must be a positive"),
        ("postgresql://u@h/db", {"replica_urls": "postgresql://u@s/db"}, "a list of URLs"),
        ("postgresql://u@h/db", {"replica_urls": [None]}, "each of replica_urls"),
        ("sqlite+aiosqlite://", {"replica_urls": ["postgresql://u@s/db"]}, "PostgreSQL standbys"),
        ("postgresql://u@h/db", {"replica_urls": ["sqlite:///x.db"]}, "PostgreSQL standbys"),
    ],
)
def test_replicas_that_cannot_be_are_refused(url: str, options: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        CheckpointRepository(url, **options)


async def test_a_replica_that_is_no_standby_or_down_serves_nothing(
    pg_url: str, pg_schema: str
) -> None:
    """The primary named as its own replica (not in recovery: as a promoted standby
    would be) and a replica that refuses are both skipped, saying why; every read is
    the primary's and says so."""
    dead = make_url(pg_url).set(host="127.0.0.1", port=free_port())
    async with CheckpointRepository(pg_url, schema=pg_schema, replica_urls=[pg_url, dead]) as repo:
        await repo.asetup()
        config = cfg()
        await repo.aput_state(config, {"n": 1})
        for _ in range(3):
            assert [s.version for s in await repo.alist_states(config)] == [1]
            assert tenxstore.read_source(config) == tenxstore.ReadSource(None, 0.0)
        replicas = repo.backend.replicas
        assert replicas is not None
        whys = [r.why for r in replicas.replicas]
        assert "not in recovery" in whys[0]
        assert "refused" in whys[1] or "connect" in whys[1]
        assert all(r.served == 0 for r in replicas.replicas)
        health = await repo.acheck()
        assert [r.replica for r in health.replicas] == [r.name for r in replicas.replicas]
        assert all(r.error for r in health.replicas) and not health.ok
        assert any("not in recovery" in line for line in health.problems)
