"""One smoke run of every train_demo stage (tiny shapes, a few steps), shared by the tests."""

from __future__ import annotations

import json
import os

import pytest


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> str:
    from tools.train_demo.__main__ import main

    out = str(tmp_path_factory.mktemp("train_demo"))
    assert main(["all", "--out", out, "--smoke", "--quiet", "--seed", "3"]) == 0
    return out


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def stage_info(out: str, stage: str) -> dict:
    return load(os.path.join(out, stage, f"{stage}.json"))
