"""python -m tools.train_demo redraft / evaluate --smoke: the drafter retrained on sampled
rollouts, and the offline acceptance under Gumbel-coupled sampling."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dspark_loop.contract.model_config import ModelConfig
from tests.integration.train_demo.conftest import load
from tools.train_demo import calibration, drafter, rollout
from tools.train_demo.anchors import anchors
from tools.train_demo.evaluate import streams
from workers.drafter_weights import load_drafter
from workers.sampling.noise import gumbel_noise
from workers.weights import load_model

TEMPS = [0.0, 0.7, 1.0]


@pytest.fixture(scope="module")
def redraft_run(smoke_run, tmp_path_factory) -> str:
    from tools.train_demo.__main__ import main

    out = str(tmp_path_factory.mktemp("redraft"))
    model = os.path.join(smoke_run, "model")
    assert main(["redraft", "--model", model, "--out", out, "--smoke", "--quiet", "--seed", "3"]) == 0
    return out


@pytest.fixture(scope="module")
def sampled(smoke_run):
    """The smoke target, its drafter and 4 held-out rollouts sampled at T = 0.8."""
    model = os.path.join(smoke_run, "model")
    cfg = ModelConfig.from_dir(model)
    target = load_model(model, cfg, quiet=True)
    held = streams(model, True)[2]
    ro = rollout.sampled(target, cfg, held, 4, [0.8], np.random.default_rng(5), True)
    return target, load_drafter(model, cfg), ro


def test_redraft_retrains_only_the_drafter_and_calibrates_it(smoke_run, redraft_run):
    """redraft must export the source checkpoint's target tensors unchanged and a retrained
    drafter (other mtp. tensors) with 7 per-position confidence temperatures in config.json,
    from rollouts sampled at each of 0, 0.7 and 1.0 with one seed per rollout."""
    old = load_file(os.path.join(smoke_run, "model", "model.safetensors"))
    new = load_file(os.path.join(redraft_run, "model", "model.safetensors"))
    assert old.keys() == new.keys()
    assert all(torch.equal(old[k], new[k]) for k in old if not k.startswith("mtp."))
    assert any(not torch.equal(old[k], new[k]) for k in old if k.startswith("mtp."))
    info = load(os.path.join(redraft_run, "redraft", "drafter.json"))
    temps = load(os.path.join(redraft_run, "model", "config.json"))["dspark_confidence_temperatures"]
    assert temps == info["position_temperatures"] and len(temps) == 7
    ro = torch.load(os.path.join(redraft_run, "redraft", "rollouts.pt"), weights_only=False)["train"]
    assert sorted(set(ro.temperature.tolist())) == pytest.approx(TEMPS)
    assert len(set(ro.seeds.tolist())) == len(ro.tokens)


def test_a_stopped_and_resumed_redraft_writes_the_same_drafter(smoke_run, redraft_run, tmp_path):
    """redraft stopped by --stop-after and continued with --resume must export the same
    weights as the uninterrupted run."""
    from tools.train_demo.__main__ import main

    base = ["redraft", "--model", os.path.join(smoke_run, "model"), "--out", str(tmp_path), "--smoke", "--quiet"]
    assert main(base + ["--seed", "3", "--stop-after", "3"]) == 0
    assert not os.path.exists(tmp_path / "model")
    assert main(base + ["--seed", "3", "--resume"]) == 0
    a = load_file(os.path.join(redraft_run, "model", "model.safetensors"))
    b = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sampled_rollouts_are_the_targets_gumbel_samples(smoke_run, sampled):
    """A sampled rollout's token at position t must be argmax(target_logits / T + G(seed, 0,
    t)) of the target's own logits over the rollout so far: the verify row's sample."""
    from tools.train_demo import trunk

    target, _, ro = sampled
    N, L = ro.tokens.shape
    cfg = ModelConfig.from_dir(os.path.join(smoke_run, "model"))
    logits = trunk.forward(target, trunk.PagedPass(cfg, N, L), ro.tokens)[0].view(N, L, -1)
    t = np.arange(ro.prompt_len, L)
    same = 0
    for r in range(N):
        seed = torch.full((len(t),), int(ro.seeds[r]))
        g = gumbel_noise(seed, torch.zeros_like(seed), torch.from_numpy(t), 0, logits.shape[-1])
        pick = (logits[r, t - 1] / 0.8 + g).argmax(-1).numpy()
        same += int((pick == ro.tokens[r, t]).sum())
    assert same / (N * len(t)) >= 0.95  # the decode and the teacher-forced pass: batch-invariant up to ties


def test_served_drafts_of_sampled_rollouts_use_the_verify_rows_noise(sampled):
    """calibration.serve_drafts on a sampled rollout must draw draft 1 as argmax(drafter
    logits / T + G(seed, 0, P + 1)): the noise the verify row for that position samples with."""
    target, net, ro = sampled
    seq, pos = anchors(ro, np.random.default_rng(1), 16)
    drafts, _, labels = calibration.serve_drafts(net, target, ro, seq, pos)
    with torch.no_grad():
        logits, _ = drafter.block_outputs(net, target, ro, seq, pos)  # [R, 7, V], draft 1 from the anchor
    seed = torch.from_numpy(ro.seeds[seq])
    g = gumbel_noise(seed, torch.zeros_like(seed), torch.from_numpy(pos + 1), 0, logits.shape[-1])
    assert np.array_equal(drafts[:, 0], (logits[:, 0] / 0.8 + g).argmax(-1).numpy())
    assert not np.array_equal(drafts[:, 0], logits[:, 0].argmax(-1).numpy())


def test_evaluate_measures_every_model_on_the_same_rollouts(smoke_run, redraft_run, tmp_path):
    """evaluate with two checkpoints of one target must report, per temperature and model,
    a mean accepted length of 1 + the sum of the per-position acceptance (non-increasing),
    and reuse its cached rollouts on a second run (the same figures)."""
    from tools.train_demo.__main__ import main

    models = [os.path.join(smoke_run, "model"), os.path.join(redraft_run, "model")]
    argv = ["evaluate", "--model", models[0], "--model", models[1], "--out", str(tmp_path), "--smoke", "--quiet"]
    figures = []
    for _ in range(2):
        assert main(argv + ["--temperatures", "0", "0.8"]) == 0
        figures.append(load(str(tmp_path / "summary-evaluate.json"))["evaluate"]["models"])
    assert figures[0] == figures[1] and list(figures[0]) == models
    for per_t in figures[0].values():
        assert list(per_t) == ["T=0", "T=0.8"]
        for acc in per_t.values():
            a = acc["acceptance_per_position"]
            assert len(a) == 7 and all(x >= y for x, y in zip(a, a[1:]))
            assert acc["mean_accepted_len"] == pytest.approx(1 + sum(a), abs=1e-3)
    assert len([n for n in os.listdir(tmp_path / "evaluate") if n.startswith("heldout-")]) == 2


def fake_evaluation(eval_dir: str, models: list[str], t08: tuple[float, float]) -> None:
    """summary-evaluate.json + train.log as `evaluate` writes them, with chosen figures."""
    import json

    os.makedirs(eval_dir, exist_ok=True)
    figs = [{"T=0": {"mean_accepted_len": 5.0}, "T=0.8": {"mean_accepted_len": m}} for m in t08]
    summary = {"evaluate": {"models": dict(zip(models, figs)), "anchors": 8, "rollouts": 2}}
    with open(os.path.join(eval_dir, "summary-evaluate.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f)
    with open(os.path.join(eval_dir, "train.log"), "w", encoding="utf-8") as f:
        f.write("2026-01-01 00:00:00 command: python -m tools.train_demo evaluate --model A --model B\n")


def test_redraft_ship_replaces_the_drafter_only_on_a_clear_gain(smoke_run, redraft_run, tmp_path):
    """redraft_ship must leave the destination untouched when T=0.8 does not improve by
    MIN_GAIN, and otherwise copy the new weights and config.json, keep the old drafter
    figures, record the evaluation and the commands, and list every file's new sha256."""
    import json
    import shutil

    from tools.train_demo.redraft_ship import ship
    from tools.train_demo.ship import file_entry

    dest = str(tmp_path / "demo")
    shutil.copytree(os.path.join(smoke_run, "model"), dest)
    files = {n: file_entry(os.path.join(dest, n)) for n in sorted(os.listdir(dest))}
    manifest = {"commands": ["train", "python -m tools.train_demo calibrate --model X"], "drafter": {"steps": 6}}
    with open(os.path.join(dest, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({**manifest, "files": files}, f)
    models = [dest, os.path.join(redraft_run, "model")]
    fake_evaluation(str(tmp_path / "flat"), models, (1.6, 1.62))
    assert ship(redraft_run, str(tmp_path / "flat"), dest, "ship")[0] is False
    assert {n: file_entry(os.path.join(dest, n)) for n in files} == files
    fake_evaluation(str(tmp_path / "gain"), models, (1.6, 2.4))
    assert ship(redraft_run, str(tmp_path / "gain"), dest, "ship")[0] is True
    m = load(os.path.join(dest, "manifest.json"))
    assert m["drafter_before_redraft"] == {"steps": 6} and m["drafter"]["temperatures"] == TEMPS
    assert m["acceptance_offline"]["after"]["T=0.8"]["mean_accepted_len"] == 2.4
    assert m["commands"][0] == "train" and " redraft " in m["commands"][1] and m["commands"][2] == "ship"
    assert m["files"] == {n: file_entry(os.path.join(dest, n)) for n in files}
    for name in ("model.safetensors", "config.json"):
        with open(os.path.join(dest, name), "rb") as a, open(os.path.join(redraft_run, "model", name), "rb") as b:
            assert a.read() == b.read()
