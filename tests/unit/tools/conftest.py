"""Checkpoints written once per test session (each takes ~0.1 s) and shared read-only."""

from __future__ import annotations

import json
import os

import pytest

from tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="session")
def make_ckpt(tmp_path_factory):
    """make_ckpt(**kwargs) -> path; one directory per distinct set of arguments."""
    made: dict = {}

    def make(**kwargs) -> str:
        key = tuple(sorted(kwargs.items()))
        if key not in made:
            out = tmp_path_factory.mktemp("ckpt") / "model"
            made[key] = make_checkpoint(str(out), quiet=True, **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_ckpt(make_ckpt) -> str:
    return make_ckpt(seed=0)


def read_config(path: str) -> dict:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        return json.load(f)
