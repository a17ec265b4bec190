"""``tenxstore --help`` starts fast: the help of the command and of every subcommand
imports typer, rich and tenxstore's light modules, never SQLAlchemy, a driver, Redis,
cryptography, Alembic or LangGraph (a command imports what it uses when it runs).

The constants the commands show as option defaults are the CLI's own copies (their
modules import SQLAlchemy); each is checked here against the library's."""

from __future__ import annotations

import os
from pathlib import Path

from tests.procs import python_output

ROOT = Path(__file__).resolve().parents[2]

HEAVY_PACKAGES = (
    "sqlalchemy",
    "alembic",
    "redis",
    "langgraph",
    "langchain_core",
    "cryptography",
    "numpy",
    "asyncpg",
    "aiosqlite",
    "asyncmy",
)
HEAVY_MODULES = (
    "tenxstore.repository",
    "tenxstore.cache",
    "tenxstore.backends",
    "tenxstore.migrate",
    "tenxstore.memory.store",
)

# Every command's --help (and the groups'), in one fresh process; prints what it
# imported of HEAVY_PACKAGES and HEAVY_MODULES (given before it), one a line.
HELP_OF_EVERY_COMMAND = """
import sys
import typer.main
from typer.testing import CliRunner
from tenxstore.cli import app

runner = CliRunner()

def helps(command, path):
    yield [*path, "--help"]
    for name, sub in getattr(command, "commands", {}).items():
        yield from helps(sub, [*path, name])

shown = 0
for args in helps(typer.main.get_command(app), []):
    done = runner.invoke(app, args)
    assert done.exit_code == 0, (args, done.output, done.exception)
    assert "Usage:" in done.output, (args, done.output)
    shown += 1
assert shown > 20, shown
for name in sorted(sys.modules):
    if name in HEAVY_PACKAGES or name in HEAVY_MODULES:  # a submodule imports its package
        print(name)
"""


def test_help_imports_nothing_heavy() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    heavy = f"HEAVY_PACKAGES = {HEAVY_PACKAGES!r}\nHEAVY_MODULES = {HEAVY_MODULES!r}"
    printed = python_output(f"{heavy}\n{HELP_OF_EVERY_COMMAND}", env=env).split()
    assert printed == [], "imported by --help: " + ", ".join(printed)


def test_the_option_defaults_are_the_librarys() -> None:
    from tenxstore import lifecycle, rotation
    from tenxstore.cli import memories, ops
    from tenxstore.memory import lifecycle as memory_lifecycle

    assert ops.DEFAULT_BATCH_SIZE == lifecycle.DEFAULT_BATCH_SIZE
    assert ops.DEFAULT_ROTATION_BATCH == rotation.DEFAULT_ROTATION_BATCH
    assert memories.DEFAULT_SWEEP_BATCH == memory_lifecycle.DEFAULT_SWEEP_BATCH
