"""``tenxstore.langgraph`` is a package of rooms, and its public face is what it was:
every name exported before the split imports from it as before, and its storage rooms
(which the repository itself uses) never pull LangGraph in."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tenxstore.langgraph as lg

# Every name tenxstore.langgraph exported when it was one module (and SHARED_USER,
# documented as tenxstore.langgraph_store's before the split).
EXPORTED = {
    "DEFAULT_HISTORY_LIMIT": "saver",
    "HEAD_KEY": "saver",
    "LangGraphImport": "importer",
    "MemoryConfig": "memory",
    "ReplaySafeToolNode": "tools",
    "SHARED_USER": "store",
    "TenxCheckpointSaver": "saver",
    "TenxStore": "store",
    "acopy_langgraph_thread": "export",
    "aimport_langgraph": "importer",
    "ainvoke_retrying": "runs",
    "format_memories": "memory",
    "idempotent_input": "runs",
    "import_langgraph": "importer",
    "invoke_retrying": "runs",
    "memory_tools": "memory",
    "run_life": "saver",
}


def test_every_public_name_imports_from_the_package_as_before() -> None:
    assert sorted(lg.__all__) == sorted(EXPORTED)
    namespace: dict[str, object] = {}
    exec("from tenxstore.langgraph import *", namespace)  # the star import itself
    for name, room in EXPORTED.items():
        value = getattr(lg, name)
        assert namespace[name] is value
        assert getattr(sys.modules[f"tenxstore.langgraph.{room}"], name) is value
        assert name in dir(lg)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'TenxSaver'"):
        lg.TenxSaver  # noqa: B018  # the lookup is the test
    with pytest.raises(ImportError):
        exec("from tenxstore.langgraph import TenxSaver", {})


def test_the_repository_never_imports_langgraph() -> None:
    """The storage rooms are the repository's; LangGraph is an extra."""
    code = (
        "import sys, tenxstore, tenxstore.langgraph.tables, tenxstore.langgraph.values\n"
        "loaded = sorted(\n"
        "    m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langchain_core')\n"
        ")\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
