"""Every command line README.md shows must be accepted, as written, by its CLI parser."""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest

from dspark_loop.config.cli import build_parser as server_parser
from tools.tap import build_parser as tap_parser

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"
PARSERS = {  # program -> the parser its arguments go to
    "scripts/serve.sh": server_parser,
    "python -m dspark_loop": server_parser,
    ".venv/bin/python -m dspark_loop": server_parser,
    ".venv/bin/python -m tools.tap": tap_parser,
    "python -m tools.tap": tap_parser,
}
NOT_OURS = ("scripts/test.sh", "curl")  # pytest's arguments, and a client
COMMAND_START = re.compile(r"    (scripts/|\.venv/|python |curl |[A-Z_]+=)")  # an indented command


def readme_commands() -> list[str]:
    """Shell commands from the README's indented code blocks (continuations joined, comments
    dropped, `a & b` split)."""
    text = re.sub(r"\\\n\s*", " ", README.read_text(encoding="utf-8"))
    commands = []
    for line in text.splitlines():
        if not COMMAND_START.match(line):
            continue
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in words + ["&"]:
            if word in ("&", "&&", ";"):
                if command:
                    commands.append(shlex.join(command))
                command = []
            else:
                command.append(word)
    return commands


def program_of(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command)
    for n in (4, 3, 1):
        if " ".join(words[:n]) in PARSERS or " ".join(words[:n]) in NOT_OURS:
            return " ".join(words[:n]), words[n:]
    return words[0], words[1:]


COMMANDS = readme_commands()


def test_the_readme_shows_the_commands_this_test_checks():
    """The README must still show the serve, speculation and debug-tap commands."""
    programs = [program_of(c)[0] for c in COMMANDS]
    assert programs.count("scripts/serve.sh") >= 4 and ".venv/bin/python -m tools.tap" in programs


@pytest.mark.parametrize("command", COMMANDS)
def test_each_readme_command_line_parses(command):
    """A documented command must parse with its program's own parser (exit 2 fails the test)."""
    program, args = program_of(command)
    if program in NOT_OURS:
        return
    assert program in PARSERS, f"README command {command!r}: no parser known for {program!r}"
    PARSERS[program]().parse_args(args)
