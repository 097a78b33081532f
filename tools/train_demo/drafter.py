"""Stage 3: the DSpark drafter (mtp.0..2, Markov head, confidence head) against the frozen
target, with dspark.md section 5's objective, through the served drafter's own pieces.

Per step, R anchors (sequence, position P in the generated part) of the target's rollouts:
    context   positions P-W .. P-1: Drafter.context_rows of the rollout taps, written by
              Drafter.write_context into fresh rings (one lease per anchor), as the ranks do
    block     Drafter.block_hidden (anchor token + 7 noise rows) -> x [R, 7, d]
              logits = block_logits(x) + markov(prev) with prev = anchor, label_1..label_6
              (teacher-forced), confidence_logit(x_s, markov_w1[prev])
    labels    the rollout's tokens at P+1..P+7 (the target's greedy tokens); p_target =
              softmax(head(final[P+k-1])) of the frozen target, over the grammar mask
              the token was picked under for a constrained rollout (rollout.sampled(factories=))
    loss      sum_k w_k (0.1 CE + 0.9 |p_draft - p_target|_1 + 1.0 BCE(c, clamp(1 - L1/2, 0, 1)))
              / sum_k w_k, w_k = exp(-(k-1)/4)
Then the confidence head is calibrated: one temperature folded into its weight, then one per
draft position for the host (calibration.py; config.json dspark_confidence_temperatures).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K
from tools.make_checkpoint import make_checkpoint
from tools.train_demo import calibration, rollout, state, trunk
from tools.train_demo.anchors import anchors, fill_rings
from tools.train_demo.shape import shape
from tools.train_demo.target import LoadBalancer, lr_at
from workers.comm import LocalComm
from workers.drafter_weights import checkpoint_name, load_drafter
from workers.model.layers import linear_rows
from workers.model.moe import Gate
from workers.weights import load_model

K = DSPARK_K
CONFIG_KEY = "dspark_confidence_temperatures"  # read by dspark_loop/verify_setup.py adaptive_policy
POS_WEIGHTS = torch.exp(-torch.arange(K, dtype=torch.float32) / 4)  # [7] exp(-(k-1)/4)
W_CE, W_L1, W_BCE = 0.1, 0.9, 1.0


def block_outputs(
    drafter, target, ro: rollout.Rollouts, seq: np.ndarray, pos: np.ndarray, prev: torch.Tensor | None = None
):
    """Teacher-forced block: logits + Markov bias [R, 7, V], confidence logits [R, 7]."""
    R = len(seq)
    rings, filler = fill_rings(drafter, ro, seq, pos)
    tok = torch.from_numpy(ro.tokens[seq, pos])
    x = drafter.block_hidden(
        rings, filler, target.embed, LocalComm(), torch.arange(R), torch.from_numpy(pos.copy()), tok
    )  # [R, 7, d]
    logits = drafter.block_logits(target.head, x)  # [R, 7, V]
    if prev is None:
        prev = torch.from_numpy(ro.tokens[seq[:, None], pos[:, None] + np.arange(K)[None, :]])  # [R, 7]
    m, bias = drafter.markov(prev.reshape(-1))
    conf = drafter.confidence_logit(x.reshape(R * K, -1), m).view(R, K)
    return logits + bias.view(R, K, -1), conf


def draft_loss(drafter, target, ro: rollout.Rollouts, seq: np.ndarray, pos: np.ndarray):
    R = len(seq)
    logits, conf = block_outputs(drafter, target, ro, seq, pos)
    labels = torch.from_numpy(ro.tokens[seq[:, None], pos[:, None] + 1 + np.arange(K)[None, :]])  # [R, 7]
    with torch.no_grad():
        fin = ro.final[seq[:, None], pos[:, None] + np.arange(K)[None, :]]  # [R, 7, d]
        t_logits = linear_rows(target.head, fin.reshape(R * K, -1)).float().view(R, K, -1)  # [R, 7, V]
        # a constrained rollout's token was the target's pick under its grammar mask: the
        # distribution to match is the masked one (free rollouts: every bit set)
        allowed = ro.allowed_at(seq[:, None], pos[:, None] + 1 + np.arange(K)[None, :], t_logits.shape[-1])
        if allowed is not None:
            t_logits = t_logits.masked_fill(~allowed, float("-inf"))
        p_target = torch.softmax(t_logits, -1)
    logp = torch.log_softmax(logits, -1)
    ce = -logp.gather(-1, labels[..., None]).squeeze(-1)  # [R, 7]
    l1 = (logp.exp() - p_target).abs().sum(-1)  # [R, 7]
    goal = (1 - 0.5 * l1.detach()).clamp(0, 1)
    bce = F.binary_cross_entropy_with_logits(conf, goal, reduction="none")
    w = POS_WEIGHTS / POS_WEIGHTS.sum()
    per = W_CE * ce + W_L1 * l1 + W_BCE * bce  # [R, 7]
    loss = (per * w).sum(-1).mean()
    stats = {
        "ce": (ce * w).sum(-1).mean().item(),
        "l1": (l1 * w).sum(-1).mean().item(),
        "bce": (bce * w).sum(-1).mean().item(),
        "top1": (logits.argmax(-1) == labels).float().mean().item(),
    }
    return loss, stats


def init_drafter(p: dict, seed: int, cfg: ModelConfig):
    d = make_checkpoint(
        os.path.join(tempfile.mkdtemp(prefix="demo-init-"), "init"),
        size="small",
        seed=seed + 1,
        dtype="float32",
        with_drafter=True,
        quiet=True,
        **p,
    )
    drafter = load_drafter(d, cfg)
    with torch.no_grad():
        for m in drafter.modules():
            if isinstance(m, Gate) and not m.is_hash:
                m.bias.zero_()
        drafter.markov_w2.weight.mul_(0.1)
        drafter.confidence.weight.zero_()
    return drafter


def run(
    out_dir: str, seed: int, smoke: bool, resume: bool, steps: int, log, progress, stop_after: int | None = None
) -> dict | None:
    d = os.path.join(out_dir, "drafter")
    os.makedirs(d, exist_ok=True)
    tok_dir, target_dir = os.path.join(out_dir, "tokenizer"), os.path.join(out_dir, "target", "model")
    p = shape(smoke)
    cfg = ModelConfig.from_dir(target_dir)
    target = load_model(target_dir, cfg, quiet=True)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    data_path = os.path.join(d, "rollouts.pt")
    data = state.load_state(data_path) if resume else None
    if data is None:
        streams = [np.load(os.path.join(tok_dir, n)) for n in ("train.npy", "heldout.npy")]
        data = rollout.train_and_heldout(target, cfg, *streams, seed, smoke, progress)
        state.save_state(data_path, data)
        log(f"drafter: {rollout.describe(data, smoke)} in {time.perf_counter() - t0:.0f}s")
    t_roll = time.perf_counter() - t0
    ro, held = data["train"], data["heldout"]
    drafter = init_drafter(p, seed, cfg)
    lr, R = 2e-3, 16 if smoke else 128
    fit = train(drafter, target, ro, d, seed, smoke, resume, steps, lr, R, log, progress, stop_after, "drafter")
    if fit is None:
        return None
    history, seconds = fit
    calib = calibration.calibrate(drafter, target, ro, held, seed, 64 if smoke else 1024, log, progress)
    info = fit_info(steps, R, lr, seconds, t_roll, history, calib, greedy_match=data["train"].greedy_match)
    finish("drafter", d, out_dir, drafter, target_dir, tok_dir, info, history, seconds, t_roll, log)
    return info


def fit_info(steps: int, R: int, lr: float, seconds: float, t_roll: float, history: list, calib: dict, **extra) -> dict:
    """A drafter stage's figures (drafter, redraft): the fit, the rollouts' time, the calibration."""
    return {
        **extra,
        "steps": steps,
        "anchors_per_step": R,
        "lr": lr,
        "seconds": round(seconds, 1),
        "rollout_seconds": round(t_roll, 1),
        "loss_first": history[0]["loss"] if history else None,
        "loss_last": history[-1]["loss"] if history else None,
        **calib,
    }


def finish(
    stage: str,
    d: str,
    out_dir: str,
    net,
    target_dir: str,
    tok_dir: str,
    info: dict,
    history: list,
    seconds: float,
    t_roll: float,
    log,
    what: str = "offline mean accepted length",
    wrote: str = "",
) -> None:
    """Export the calibrated drafter into out_dir/model, write d/drafter.json, log the summary."""
    export(out_dir, net, target_dir, tok_dir, info["position_temperatures"])
    with open(os.path.join(d, "drafter.json"), "w", encoding="utf-8") as f:
        json.dump({**info, "history": history}, f, indent=1)
    log(
        f"{stage}: done in {seconds:.0f}s (+{t_roll:.0f}s rollouts), loss {info['loss_first']} -> "
        f"{info['loss_last']}, ECE {info['ece_before']:.4f} -> {info['ece_after']:.4f}, "
        f"{what} {info['mean_accepted_len']:.2f}{wrote}"
    )


def train(
    drafter,
    target,
    ro: rollout.Rollouts,
    d: str,
    seed: int,
    smoke: bool,
    resume: bool,
    steps: int,
    lr: float,
    R: int,
    log,
    progress,
    stop_after: int | None,
    tag: str,
) -> tuple[list[dict], float] | None:
    """steps of AdamW on draft_loss over R random anchors of ro per step (cosine lr with
    warm-up), resumable from d/state.pt (rewritten every 25 steps); (history, seconds), or
    None when stopped early by stop_after (state saved). The drafter's expert stacks are
    synced back into its Linears on return."""
    params, stacks = trunk.trainable(drafter)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    balancer = LoadBalancer(drafter)
    st = state.load_state(os.path.join(d, "state.pt")) if resume else None
    start, history, t_used = 0, [], 0.0
    if st is not None:
        drafter.load_state_dict(st["model"], strict=True)
        stacks.load(st["stacks"])
        opt.load_state_dict(st["optim"])
        start, history, t_used = st["step"], st["history"], st["seconds"]
        log(f"{tag}: resumed at step {start}/{steps}")
    bar = progress(total=steps, initial=start, desc=tag)
    t1 = time.perf_counter()
    for step in range(start, steps):
        seq, pos = anchors(ro, np.random.default_rng([seed, 1000 + step]), R)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, max(1, steps // 20))
        loss, stats = draft_loss(drafter, target, ro, seq, pos)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        balancer.step()
        history.append({"step": step + 1, "loss": round(loss.item(), 4), **{k: round(v, 4) for k, v in stats.items()}})
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", top1=f"{stats['top1']:.2f}")
        stop = stop_after is not None and step + 1 >= stop_after and step + 1 < steps
        if (step + 1) % (3 if smoke else 25) == 0 or step + 1 == steps or stop:
            log(
                f"{tag}: step {step + 1}/{steps} loss {loss.item():.4f} ce {stats['ce']:.3f} "
                f"l1 {stats['l1']:.3f} bce {stats['bce']:.3f} top1 {stats['top1']:.3f} "
                f"({t_used + time.perf_counter() - t1:.0f}s)"
            )
            stacks.sync()
            state.save_state(
                os.path.join(d, "state.pt"),
                {
                    "model": drafter.state_dict(),
                    "stacks": stacks.state(),
                    "optim": opt.state_dict(),
                    "step": step + 1,
                    "history": history,
                    "seconds": t_used + time.perf_counter() - t1,
                },
            )
        if stop:
            bar.close()
            log(f"{tag}: stopped after step {step + 1} (--stop-after); continue with --resume")
            return None
    bar.close()
    stacks.sync()
    return history, t_used + time.perf_counter() - t1


def export(out_dir: str, drafter, target_dir: str, tok_dir: str, temperatures: list[float]) -> str:
    """DIR/model: the target's tensors + the drafter's (checkpoint names), bf16; config.json
    with the sequential confidence temperatures."""
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(target_dir, "model.safetensors"))
    last = drafter.cfg.dspark.num_stages - 1
    for name, t in state.bf16_round(drafter.state_dict()).items():
        tensors[checkpoint_name(name, last)] = t
    with open(os.path.join(target_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config[CONFIG_KEY] = temperatures
    return state.write_model_dir(os.path.join(out_dir, "model"), config, tensors, tok_dir)
