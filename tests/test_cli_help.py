"""``tenxstore --help`` and every command's ``--help`` read as sentences: a flag shows
no ``<bool>``, and no help text is broken mid-line.

How "broken mid-line" is checked: the help is rendered 1,000 columns wide, where rich
has no reason to wrap anything, and each command's description (each paragraph) and
each option's help must then come out on one line. A line break that is left there
came from the text itself (a docstring's own line breaks, which typer keeps in rich
mode and which cut a sentence at any terminal width), not from wrapping. At a real
width rich wraps between words, which is what a reader expects."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from tenxstore.cli import app

runner = CliRunner()
WIDE = {"COLUMNS": "1000", "TERMINAL_WIDTH": "1000"}


def _commands(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, [*path, name])


COMMANDS = [
    pytest.param(path, command, id=" ".join(path) or "tenxstore")
    for path, command in _commands(typer.main.get_command(app), [])
]


def _help(path: list[str]) -> str:
    shown = runner.invoke(app, [*path, "--help"], env=WIDE)
    assert shown.exit_code == 0, shown.output
    return shown.output


def _one_line(text: str, output: str) -> bool:
    """Whether ``text`` (its words, in order) is printed on one line of ``output``."""
    words = text.split()
    pattern = r"[ \t]+".join(re.escape(word) for word in words)
    return any(re.search(pattern, line) for line in output.splitlines())


def test_every_command_is_checked() -> None:
    names = {each.id for each in COMMANDS}
    assert {
        "tenxstore",
        "upgrade",
        "copy",
        "prune",
        "delete-user",
        "memories",
        "memories list",
    } <= names


@pytest.mark.parametrize(("path", "command"), COMMANDS)
def test_help_shows_no_type_beside_a_flag(path: list[str], command: Any) -> None:
    output = _help(path)
    assert "<bool>" not in output
    for param in command.params:
        if getattr(param, "is_flag", False):
            for name in param.opts:
                assert not re.search(rf"{re.escape(name)}\s+<", output), (name, output)


@pytest.mark.parametrize(("path", "command"), COMMANDS)
def test_help_breaks_no_sentence_mid_line(path: list[str], command: Any) -> None:
    output = _help(path)
    texts = [p for p in inspect.cleandoc(command.help or "").split("\n\n") if p.strip()]
    texts += [param.help for param in command.params if getattr(param, "help", None)]
    for sub in getattr(command, "commands", {}).values():  # the list of commands
        texts += inspect.cleandoc(sub.help or "").split("\n\n")[:1]
    assert texts
    for text in texts:
        assert _one_line(text, output), f"broken across lines: {text!r}\n{output}"
