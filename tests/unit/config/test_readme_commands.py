"""Every command README.md shows runs as written.

- the server (`scripts/serve.sh`, `python -m dspark_loop`): its arguments parse with the
  server's own parser (starting ranks would take minutes; the offline command runs for real
  in the slow set);
- a tool (`python -m tools.X ...`): `--help` runs and names every flag the README passes;
- `curl` and the Python example: run against the HTTP API over a scripted engine on a real
  localhost port, and answer 200;
- `scripts/test.sh` is this suite itself, so it is not run from inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from dspark_loop.config.cli import build_parser as server_parser
from tests.unit.api.fake_engine import FakeEngine
from tests.unit.api.harness import serving

ROOT = pathlib.Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
SERVER = ("scripts/serve.sh", "python -m dspark_loop", ".venv/bin/python -m dspark_loop")
SUITE = "scripts/test.sh"  # the command that runs this very test
COMMAND_START = re.compile(r"    (scripts/|\.venv/|python |curl |[A-Z_]+=)")  # an indented command
FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
README_PORT = re.compile(r"(?:localhost|127\.0\.0\.1):8000")
SERVED_NAME = "default-v1"  # the demo's served name, which the README's examples send


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def readme_commands() -> list[str]:
    """Shell commands from the README's indented code blocks (continuations joined, comments
    dropped, `a & b` split); fenced blocks are code, not commands."""
    text = re.sub(r"\\\n\s*", " ", FENCED.sub("", readme_text()))
    commands = []
    for line in text.splitlines():
        if not COMMAND_START.match(line):
            continue
        command: list[str] = []
        for word in shlex.split(line, comments=True) + ["&"]:
            if word in ("&", "&&", ";"):
                if command:
                    commands.append(shlex.join(command))
                command = []
            else:
                command.append(word)
    return commands


def python_examples() -> list[str]:
    return [body for lang, body in FENCED.findall(readme_text()) if lang == "python"]


def program_of(command: str) -> tuple[str, list[str]]:
    """(the program, its arguments): a server entry point, `python -m MODULE`, or the first word."""
    words = shlex.split(command)
    for n in (4, 3, 1):
        if " ".join(words[:n]) in SERVER + (SUITE,):
            return " ".join(words[:n]), words[n:]
    if words[:2] == ["python", "-m"]:
        return " ".join(words[:3]), words[3:]
    return words[0], words[1:]


COMMANDS = readme_commands()
SERVER_COMMANDS = [c for c in COMMANDS if program_of(c)[0] in SERVER]
TOOL_COMMANDS = [c for c in COMMANDS if program_of(c)[0].startswith("python -m tools.")]
CURL_COMMANDS = [c for c in COMMANDS if program_of(c)[0] == "curl"]


def test_the_readme_shows_the_commands_this_test_checks():
    """The README must still show the serve, test, curl and client examples, and nothing this
    test cannot run."""
    programs = [program_of(c)[0] for c in COMMANDS]
    assert programs.count("scripts/serve.sh") >= 2 and SUITE in programs
    assert CURL_COMMANDS and python_examples()
    unknown = [c for c in COMMANDS if c not in SERVER_COMMANDS + TOOL_COMMANDS + CURL_COMMANDS and SUITE not in c]
    assert unknown == []


@pytest.mark.parametrize("command", SERVER_COMMANDS)
def test_each_server_command_line_parses(command):
    """A documented server command must parse with the server's own parser (exit 2 fails the test)."""
    server_parser().parse_args(program_of(command)[1])


@pytest.mark.parametrize("command", TOOL_COMMANDS)
def test_each_tool_command_runs_and_knows_its_flags(command):
    """`python -m tools.X --help` must run, and name every flag the README passes to it."""
    program, args = program_of(command)
    module = program.split()[-1]
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    flags = [a.split("=")[0] for a in args if a.startswith("--")]
    assert [f for f in flags if f not in done.stdout] == []


def curl_against(command: str, url: str) -> list[str]:
    """The README's curl, aimed at `url` instead of port 8000, failing on an HTTP error."""
    words = shlex.split(README_PORT.sub(url, command))
    return words[:1] + ["--silent", "--show-error", "--fail-with-body"] + words[1:]


@pytest.mark.parametrize("command", CURL_COMMANDS)
async def test_each_curl_command_gets_an_answer(command):
    """The README's curl, sent to the API on a real port, must answer 200 with a completion."""
    async with serving(FakeEngine(max_model_len=1024), max_model_len=1024, served_model_name=SERVED_NAME) as tc:
        url = f"{tc.server.host}:{tc.server.port}"
        proc = await asyncio.create_subprocess_exec(
            *curl_against(command, url), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
    assert proc.returncode == 0, (out, err)
    assert b'"choices"' in out


@pytest.mark.parametrize("example", python_examples())
async def test_each_python_example_runs_against_the_api(example):
    """The openai-client example, pointed at the API on a real port, must run to the end."""
    async with serving(FakeEngine(max_model_len=1024), max_model_len=1024, served_model_name=SERVED_NAME) as tc:
        code = README_PORT.sub(f"{tc.server.host}:{tc.server.port}", example)
        printed = io.StringIO()

        def run() -> None:
            with contextlib.redirect_stdout(printed):
                exec(compile(code, "README.md", "exec"), {})

        await asyncio.to_thread(run)  # the client blocks; the server answers on this loop
    assert printed.getvalue().strip()


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in SERVER_COMMANDS if "--prompt" in c and "--model" not in c])
def test_the_offline_command_generates_with_the_demo(command):
    """The offline command runs as written (the shipped demo on one CPU rank) and prints its text."""
    args = program_of(command)[1]
    done = subprocess.run(
        [sys.executable, "-m", "dspark_loop", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--- prompt 1" in done.stdout
