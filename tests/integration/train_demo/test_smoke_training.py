"""python -m tools.train_demo --smoke: every stage learns something and the result serves."""

from __future__ import annotations

import os

import numpy as np

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.engine.outputs import SamplingParams
from tests.integration.dspark.harness import run
from tests.integration.train_demo.conftest import load, stage_info


def test_tokenizer_stage_writes_the_streams_and_the_corpus_hash(smoke_run):
    """The tokenizer stage must keep DeepSeek's special ids, write train and held-out
    streams that start with BOS, and record a 64-hex corpus hash."""
    from tokenizers import Tokenizer

    d = os.path.join(smoke_run, "tokenizer")
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    assert tok.token_to_id("<｜begin▁of▁sentence｜>") == 0 and tok.get_vocab_size() == 512
    info = load(os.path.join(d, "corpus.json"))
    assert len(info["corpus_hash"]) == 64 and info["heldout_files"] > 0
    for name in ("train.npy", "heldout.npy"):
        s = np.load(os.path.join(d, name))
        assert s[0] == 0 and len(s) > 1000


def test_target_stage_lowers_train_and_heldout_loss(smoke_run):
    """A few target steps must lower the training loss and the held-out loss."""
    info = stage_info(smoke_run, "target")
    h = info["history"]
    assert info["heldout_loss"] < info["heldout_loss_init"]
    assert h[-1]["train"] < h[1]["train"]


def test_drafter_stage_lowers_its_loss_and_reports_calibration(smoke_run):
    """A few drafter steps must lower the section-5 loss; calibration must report ECE
    before and after and a temperature."""
    info = stage_info(smoke_run, "drafter")
    assert info["loss_last"] < info["loss_first"]
    assert 0 <= info["ece_after"] <= 1 and 0 <= info["ece_before"] <= 1 and info["temperature"] > 0
    assert 1.0 <= info["mean_accepted_len"] <= 8.0


def test_smoke_checkpoint_serves_at_k0_and_k7_with_the_same_tokens(smoke_run):
    """The exported checkpoint must load through the normal loaders and serve greedy
    requests at K=0 and K=7 with identical tokens (K=7 really verifying)."""
    path = os.path.join(smoke_run, "model")
    cfg = ModelConfig.from_dir(path)
    assert cfg.dspark is not None and cfg.num_hidden_layers == 4
    rng = np.random.default_rng(0)
    prompts = {f"r{i}": [0] + rng.integers(10, cfg.vocab_size, 12 + 5 * i).tolist() for i in range(3)}
    params = {r: SamplingParams(max_tokens=20, ignore_eos=True) for r in prompts}
    k0 = run(path, 0, prompts, params)
    k7 = run(path, 7, prompts, params)
    assert k7.tokens == k0.tokens and all(len(t) == 20 for t in k0.tokens.values())
    assert k7.summary["num_verify_steps"] > 0


def test_a_stopped_and_resumed_run_writes_the_same_checkpoint(smoke_run, tmp_path):
    """Stopping each stage midway (--stop-after) and continuing with --resume must give
    byte-identical weights to the straight run of the same seed and thread count."""
    import shutil

    from tools.train_demo.__main__ import main

    out = str(tmp_path / "resumed")
    shutil.copytree(os.path.join(smoke_run, "tokenizer"), os.path.join(out, "tokenizer"))
    for stage, stop in (("target", 3), ("drafter", 2)):
        common = [stage, "--out", out, "--smoke", "--quiet", "--seed", "3"]
        assert main(common + ["--stop-after", str(stop)]) == 0
        assert main(common + ["--resume"]) == 0
    for rel in ("target/model/model.safetensors", "model/model.safetensors"):
        with open(os.path.join(smoke_run, rel), "rb") as a, open(os.path.join(out, rel), "rb") as b:
            assert a.read() == b.read(), rel


def test_drafter_stage_writes_per_position_temperatures_into_the_checkpoint(smoke_run):
    """The drafter stage must fit one confidence temperature per draft position and write
    them into the exported config.json (dspark_confidence_temperatures)."""
    info = stage_info(smoke_run, "drafter")
    temps = info["position_temperatures"]
    assert len(temps) == 7 and min(temps) > 0
    assert load(os.path.join(smoke_run, "model", "config.json"))["dspark_confidence_temperatures"] == temps
    assert len(info["ece_per_position_after"]) == 7 and len(info["ece_events_per_position"]) == 7


def test_calibrate_stage_recalibrates_a_trained_checkpoint_in_place(smoke_run, tmp_path):
    """calibrate --smoke on a copy of the trained checkpoint with a manifest must rewrite its
    config.json temperatures (within one grid step of the drafter stage's: the same rollouts
    and anchors, the head rounded to bf16 as exported), check the corpus hash, and update
    the manifest's figures and file hashes."""
    import json
    import shutil

    from tools.train_demo.__main__ import main
    from tools.train_demo.ship import file_entry

    model = str(tmp_path / "model")
    shutil.copytree(os.path.join(smoke_run, "model"), model)
    config = load(os.path.join(model, "config.json"))
    del config["dspark_confidence_temperatures"]
    with open(os.path.join(model, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    corpus = load(os.path.join(smoke_run, "tokenizer", "corpus.json"))
    manifest = {"seed": 3, "corpus_hash": corpus["corpus_hash"], "commands": ["train"], "drafter": {}, "files": {}}
    with open(os.path.join(model, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    work = str(tmp_path / "work")
    assert main(["calibrate", "--model", model, "--out", work, "--smoke", "--quiet", "--seed", "3"]) == 0
    info = load(os.path.join(work, "summary-calibrate.json"))["calibrate"]
    assert info["corpus_hash_matches"] is True
    temps = load(os.path.join(model, "config.json"))["dspark_confidence_temperatures"]
    assert temps == info["position_temperatures"]
    assert np.allclose(temps, stage_info(smoke_run, "drafter")["position_temperatures"], rtol=0.05)
    m = load(os.path.join(model, "manifest.json"))
    assert m["drafter"]["position_temperatures"] == temps and m["commands"][0] == "train"
    assert m["files"]["config.json"] == file_entry(os.path.join(model, "config.json"))
