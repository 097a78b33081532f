"""--loop: the server's event loop (uvloop by default where installed)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from dspark_loop.config.cli import parse_args
from dspark_loop.event_loop import loop_factory, loop_name, run


async def which_loop() -> str:
    await asyncio.sleep(0)
    return loop_name(asyncio.get_running_loop())


def test_auto_runs_on_uvloop_when_installed_and_asyncio_when_asked():
    pytest.importorskip("uvloop")
    assert run(which_loop()) == "uvloop"
    assert run(which_loop(), "uvloop") == "uvloop"
    assert run(which_loop(), "asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_is_an_error_naming_the_way_out(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert run(which_loop()) == "asyncio"
    with pytest.raises(ValueError, match="pip install uvloop"):
        loop_factory("uvloop")
    with pytest.raises(SystemExit) as exc:
        parse_args(["--loop", "uvloop"])
    assert exc.value.code == 2
    assert "error: argument --loop: uvloop is not installed" in capsys.readouterr().err


def test_the_flag_reaches_the_config():
    assert parse_args(["--loop", "asyncio"]).event_loop == "asyncio"
    with pytest.raises(ValueError, match="unknown event loop"):
        loop_factory("tokio")
