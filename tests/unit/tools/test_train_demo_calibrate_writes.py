"""tools/train_demo/recalibrate.py's writers: the temperatures reach the server's reader
and the manifest stays consistent with the files it lists."""

from __future__ import annotations

import json
import os
import shutil

from dspark_loop.config.default_model import DEMO_DIR, DEMO_MANIFEST
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.verify_setup import adaptive_policy
from tools.train_demo.recalibrate import write_config, write_manifest
from tools.train_demo.ship import file_entry

TEMPS = [1.2, 1.1, 1.0, 0.95, 0.9, 0.85, 0.8]


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def copy_of_demo_configs(tmp_path) -> str:
    """config.json + manifest.json of the shipped demo in a tmp dir (never the demo itself)."""
    d = str(tmp_path / "model")
    os.makedirs(d)
    for name in ("config.json", DEMO_MANIFEST):
        shutil.copyfile(os.path.join(DEMO_DIR, name), os.path.join(d, name))
    return d


def test_written_temperatures_are_the_ones_the_server_policy_applies(tmp_path):
    """write_config must set config.json's dspark_confidence_temperatures so that the
    server's AdaptiveVerify construction (verify_setup.adaptive_policy) reads them back exactly,
    and must leave every other config key as it was."""
    d = copy_of_demo_configs(tmp_path)
    before = load(os.path.join(d, "config.json"))
    write_config(d, TEMPS)
    after = load(os.path.join(d, "config.json"))
    assert after.pop("dspark_confidence_temperatures") == TEMPS
    assert after == {k: v for k, v in before.items() if k != "dspark_confidence_temperatures"}
    policy = adaptive_policy(None, ModelConfig.from_dir(d))
    assert policy.acceptance.temperatures.tolist() == TEMPS


def test_manifest_records_the_fit_the_command_once_and_the_new_config_hash(tmp_path):
    """write_manifest must put the fit under "drafter", keep one calibrate command (a rerun
    replaces it) after the training commands, and list config.json's new bytes and sha256."""
    d = copy_of_demo_configs(tmp_path)
    training = [c for c in load(os.path.join(d, DEMO_MANIFEST))["commands"] if " calibrate " not in f" {c} "]
    fit = {"position_temperatures": TEMPS, "ece_per_position_before": [0.1] * 7}
    for run in range(2):
        write_config(d, TEMPS)
        manifest = load(os.path.join(d, DEMO_MANIFEST))
        write_manifest(d, manifest, fit, f"python -m tools.train_demo calibrate --model X --seed {run}")
    m = load(os.path.join(d, DEMO_MANIFEST))
    assert m["drafter"]["position_temperatures"] == TEMPS and "steps" in m["drafter"]
    assert m["commands"] == training + ["python -m tools.train_demo calibrate --model X --seed 1"]
    assert m["files"]["config.json"] == file_entry(os.path.join(d, "config.json"))
