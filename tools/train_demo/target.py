"""Stage 2: the DeepSeek-V4 target as a causal LM, through the served trunk (trunk.forward).

Batches are windows of seq_len tokens of the train stream at offsets drawn from
rng(seed, step): a resumed run sees exactly the batches a straight run would. Routed
gates balance load the aux-loss-free way (bias += rate * sign(mean load - load)).
Held-out loss: mean next-token CE over fixed windows of the held-out stream.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

from dspark_loop.checkpoint.config import build_config, resolve_size
from dspark_loop.checkpoint.tensors import HEAD_LOGIT_STD
from dspark_loop.contract.model_config import ModelConfig
from tools.make_checkpoint import make_checkpoint
from tools.train_demo import state, trunk
from tools.train_demo.shape import shape
from workers.model.moe import Gate
from workers.weights import load_model

BIAS_RATE = 1e-3


def windows(stream: np.ndarray, rng: np.random.Generator, n: int, length: int) -> np.ndarray:
    starts = rng.integers(0, len(stream) - length, n)
    return np.stack([stream[s : s + length] for s in starts]).astype(np.int64)  # [n, length]


def heldout_windows(stream: np.ndarray, n: int, length: int) -> np.ndarray:
    starts = np.linspace(0, len(stream) - length - 1, n).astype(np.int64)
    return np.stack([stream[s : s + length] for s in starts]).astype(np.int64)


def lm_loss(logits: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """logits [B*S, V] over rows [B, S]: mean CE of each row's next token."""
    B, S = rows.shape
    lg = logits.view(B, S, -1)[:, :-1].reshape(-1, logits.shape[-1])
    return F.cross_entropy(lg, torch.from_numpy(rows[:, 1:]).reshape(-1))


def init_model(p: dict, seed: int):
    """The random initial target (make_checkpoint's init, head scaled to unit logits, zero
    gate biases) loaded through the served loader."""
    d = make_checkpoint(
        os.path.join(tempfile.mkdtemp(prefix="demo-init-"), "init"),
        size="small",
        seed=seed,
        dtype="float32",
        with_drafter=True,
        quiet=True,
        **p,
    )
    cfg = ModelConfig.from_dir(d)
    model = load_model(d, cfg, quiet=True)
    with torch.no_grad():
        model.head.weight.mul_(1.0 / HEAD_LOGIT_STD)
        for m in model.modules():
            if isinstance(m, Gate) and not m.is_hash:
                m.bias.zero_()
    return cfg, model


class LoadBalancer:
    """Counts each routed gate's picks in a step, then nudges its bias."""

    def __init__(self, model) -> None:
        self.counts: dict[Gate, torch.Tensor] = {}
        for m in model.modules():
            if isinstance(m, Gate) and not m.is_hash:
                m.register_forward_hook(self._hook)

    def _hook(self, gate, args, out) -> None:
        idx = out[0]
        c = torch.bincount(idx.flatten(), minlength=gate.weight.shape[0]).float()
        self.counts[gate] = self.counts.get(gate, 0) + c

    @torch.no_grad()
    def step(self) -> None:
        for gate, c in self.counts.items():
            gate.bias.add_(BIAS_RATE * torch.sign(c.mean() - c))
        self.counts.clear()


@torch.no_grad()
def heldout_loss(model, cfg, stream: np.ndarray, n: int, seq_len: int, batch: int) -> float:
    rows = heldout_windows(stream, n, seq_len)
    total = 0.0
    for i in range(0, n, batch):
        r = rows[i : i + batch]
        logits, _, _ = trunk.forward(model, trunk.PagedPass(cfg, len(r), seq_len), r)
        total += lm_loss(logits, r).item() * len(r)
    return total / n


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def run(
    out_dir: str,
    seed: int,
    smoke: bool,
    resume: bool,
    steps: int,
    batch: int,
    seq_len: int,
    lr: float,
    log,
    progress,
    stop_after: int | None = None,
) -> dict | None:
    d = os.path.join(out_dir, "target")
    os.makedirs(d, exist_ok=True)
    tok_dir = os.path.join(out_dir, "tokenizer")
    train = np.load(os.path.join(tok_dir, "train.npy"))
    held = np.load(os.path.join(tok_dir, "heldout.npy"))
    p = shape(smoke)
    torch.manual_seed(seed)
    cfg, model = init_model(p, seed)
    params, stacks = trunk.trainable(model)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    balancer = LoadBalancer(model)
    st = state.load_state(os.path.join(d, "state.pt")) if resume else None
    start, history, t_used = 0, [], 0.0
    if st is not None:
        model.load_state_dict(st["model"], strict=True)
        stacks.load(st["stacks"])
        opt.load_state_dict(st["optim"])
        start, history, t_used = st["step"], st["history"], st["seconds"]
        log(f"target: resumed at step {start}/{steps}")
    paged = trunk.PagedPass(cfg, batch, seq_len)
    n_eval = 8 if smoke else 32
    if start == 0:
        history.append({"step": 0, "heldout": heldout_loss(model, cfg, held, n_eval, seq_len, batch)})
        log(f"target: step 0 held-out loss {history[-1]['heldout']:.4f}")
    bar = progress(total=steps, initial=start, desc="target")
    t0 = time.perf_counter()
    for step in range(start, steps):
        rows = windows(train, np.random.default_rng([seed, step]), batch, seq_len)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, max(1, steps // 20))
        logits, _, _ = trunk.forward(model, paged, rows)
        loss = lm_loss(logits, rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        balancer.step()
        history.append({"step": step + 1, "train": round(loss.item(), 4)})
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        last = step + 1 == steps
        stop = stop_after is not None and step + 1 >= stop_after
        if (step + 1) % (5 if smoke else 10) == 0 or last or stop:
            if last or (step + 1) % (100 if not smoke else 5) == 0:
                history[-1]["heldout"] = heldout_loss(model, cfg, held, n_eval, seq_len, batch)
            log(
                f"target: step {step + 1}/{steps} train {loss.item():.4f}"
                + (f" held-out {history[-1]['heldout']:.4f}" if "heldout" in history[-1] else "")
                + f" ({t_used + time.perf_counter() - t0:.0f}s)"
            )
            stacks.sync()
            state.save_state(
                os.path.join(d, "state.pt"),
                {
                    "model": model.state_dict(),
                    "stacks": stacks.state(),
                    "optim": opt.state_dict(),
                    "step": step + 1,
                    "history": history,
                    "seconds": t_used + time.perf_counter() - t0,
                },
            )
        if stop and not last:
            bar.close()
            log(f"target: stopped after step {step + 1} (--stop-after); continue with --resume")
            return None
    bar.close()
    seconds = t_used + time.perf_counter() - t0
    stacks.sync()
    tensors = state.bf16_round(model.state_dict())
    config = build_config(resolve_size("small", p), dtype="bfloat16", w8a8=False, with_drafter=True)
    state.write_model_dir(os.path.join(d, "model"), config, tensors, tok_dir)
    final = history[-1].get("heldout")
    info = {
        "steps": steps,
        "batch": batch,
        "seq_len": seq_len,
        "lr": lr,
        "seconds": round(seconds, 1),
        "heldout_loss": final,
        "heldout_loss_init": history[0].get("heldout"),
        "train_loss_first": history[1]["train"] if len(history) > 1 else None,
        "train_loss_last": history[-1].get("train"),
        "tokens": steps * batch * seq_len,
    }
    with open(os.path.join(d, "target.json"), "w", encoding="utf-8") as f:
        json.dump({**info, "history": history}, f, indent=1)
    log(f"target: done in {seconds:.0f}s, held-out loss {history[0].get('heldout', float('nan')):.4f} -> {final:.4f}")
    return info
