"""Stage "redraft": retrain the drafter of an already-trained checkpoint (e.g. the shipped
demo) for sampling users, its target frozen.

    tokens      the corpus through the checkpoint's own tokenizer.json (evaluate.streams)
    rollouts    train and held-out prompts continued by the target, SAMPLED: rollout i at
                temperatures[i % n] (0 = greedy) with its own seed, the server's sampler;
                3x the drafter stage's count (a greedy-only set's share each)
    constrained --constrained-share F: that share of the rollouts continue as JSON documents
                under random schemas (schemas.py; rollout.sampled(factories=): the target's picks
                under the server's grammar masks), the rest as above
    training    a fresh drafter (drafter.init_drafter), or MODEL's own (--from-model: a
                fine-tune, e.g. to add constrained rollouts to a shipped drafter), drafter.train: the drafter stage's
                objective and schedule, teacher-forced on the sampled tokens (what a sampling
                request's accepted drafts are); resumable from DIR/redraft/state.pt
    calibration calibration.calibrate on these rollouts: the drafts of sampled rollouts
                Gumbel-coupled as served, so the confidence fits the acceptance of the mix
    writes      DIR/model (drafter.export: the target's tensors unchanged) and
                DIR/redraft/drafter.json; nothing in MODEL (ship with redraft_ship.py)
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import torch

from dspark_loop.contract.model_config import ModelConfig
from tools.train_demo import calibration, drafter, rollout, schemas, state
from tools.train_demo.evaluate import streams
from tools.train_demo.shape import shape
from workers.drafter_weights import load_drafter
from workers.weights import load_model

SCALE = 3  # rollouts per temperature share: sizes() x SCALE in all


SCHEMAS = 64  # random schemas the constrained rollouts are spread over


def make_rollouts(
    target, cfg, train_stream, held_stream, temperatures, seed: int, smoke: bool, progress, model_dir: str, share: float
) -> dict:
    """share: the constrained rollouts' share (0: none)."""
    n_train, n_held, _, glen = rollout.sizes(smoke)
    rng = np.random.default_rng([seed, 17])
    factories = None
    if share > 0:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        pool = schemas.schema_pool(seed, 4 if smoke else SCHEMAS)
        factories = [schemas.constraint_factory(tok, cfg.vocab_size, s) for s in pool]
    bar = progress(total=(4 if factories else 2) * (glen - 1), desc="rollouts")
    data = {}
    for name, stream, n in (("train", train_stream, n_train), ("heldout", held_stream, n_held)):
        n_con = int(round(share * n * SCALE))
        parts = [rollout.sampled(target, cfg, stream, n * SCALE - n_con, temperatures, rng, smoke, bar)]
        if n_con:
            # NOTE: held-out documents under schemas of their own (the pool's second half)
            half = len(factories) // 2
            mine = factories[:half] if name == "train" else factories[half:]
            parts.append(rollout.sampled(target, cfg, stream, n_con, temperatures, rng, smoke, bar, mine))
        data[name] = rollout.concat(parts)
    bar.close()
    return data


def run(
    model_dir: str,
    out_dir: str,
    seed: int,
    smoke: bool,
    resume: bool,
    steps: int,
    temperatures: list[float],
    log,
    progress,
    stop_after: int | None = None,
    constrained_share: float = 0.0,
    from_model: bool = False,
) -> dict | None:
    d = os.path.join(out_dir, "redraft")
    os.makedirs(d, exist_ok=True)
    cfg = ModelConfig.from_dir(model_dir)
    target = load_model(model_dir, cfg, quiet=True)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    data_path = os.path.join(d, "rollouts.pt")
    data = state.load_state(data_path) if resume else None
    if data is None:
        _, train_stream, held_stream = streams(model_dir, smoke)
        data = make_rollouts(
            target, cfg, train_stream, held_stream, temperatures, seed, smoke, progress, model_dir, constrained_share
        )
        state.save_state(data_path, data)
        n = {k: len(v.tokens) for k, v in data.items()}
        with open(os.path.join(d, "rollouts.json"), "w", encoding="utf-8") as f:
            json.dump({"seconds": round(time.perf_counter() - t0, 1), **n}, f)
        log(
            f"redraft: {n['train']}+{n['heldout']} rollouts sampled at temperatures {temperatures} "
            f"in {time.perf_counter() - t0:.0f}s"
        )
    with open(os.path.join(d, "rollouts.json"), encoding="utf-8") as f:
        t_roll = json.load(f)["seconds"]  # NOTE: the run that built them (a --resume reuses them)
    ro, held = data["train"], data["heldout"]
    net = load_drafter(model_dir, cfg) if from_model else drafter.init_drafter(shape(smoke), seed, cfg)
    lr, R = (5e-4 if from_model else 2e-3), 16 if smoke else 128
    fit = drafter.train(net, target, ro, d, seed, smoke, resume, steps, lr, R, log, progress, stop_after, "redraft")
    if fit is None:
        return None
    history, seconds = fit
    calib = calibration.calibrate(net, target, ro, held, seed, 64 if smoke else 1024, log, progress)
    rollouts = {k: len(v.tokens) for k, v in data.items()}
    info = drafter.fit_info(
        steps,
        R,
        lr,
        seconds,
        t_roll,
        history,
        calib,
        model=model_dir,
        temperatures=temperatures,
        rollouts=rollouts,
        constrained_share=constrained_share,
        from_model=from_model,
    )
    drafter.finish(
        "redraft",
        d,
        out_dir,
        net,
        model_dir,
        model_dir,
        info,
        history,
        seconds,
        t_roll,
        log,
        what="offline mean accepted length on the mixed held-out rollouts",
        wrote=f"; wrote {out_dir}/model",
    )
    return info
