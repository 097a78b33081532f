"""The target's own sequences for drafter training: prompts from the corpus, continued
greedily by the frozen target through the served forward (paged prefill, then one-row
decode steps), then one teacher-forced pass for the drafter's inputs.

    Rollouts.tokens  [N, L] int64        prompt (P tokens) + greedy continuation
    Rollouts.taps    [N, 3, L, d] fp32   hc-mean of the trunk after each dspark_target_layer_id
    Rollouts.final   [N, L, d]           the head's input (p_target = softmax(head(final)))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tools.train_demo import trunk
from workers.comm import LocalComm
from workers.staging import Segment, stage


@dataclass
class Rollouts:
    tokens: np.ndarray
    taps: torch.Tensor
    final: torch.Tensor
    prompt_len: int
    greedy_match: float  # teacher-forced argmax == the rollout's next token (batch invariance)


@torch.no_grad()
def generate(model, cfg, prompts: np.ndarray, gen_len: int, progress=None) -> np.ndarray:
    """prompts [N, P] -> [N, P + gen_len]: greedy continuations, all N in one decode batch."""
    N, P = prompts.shape
    paged = trunk.PagedPass(cfg, N, P + gen_len)
    pool = paged.pool(model.dtype)
    comm = LocalComm()

    def run(segs):
        return model(stage(segs, paged.tables, paged.layout, cfg, pool), pool, comm).token_ids.numpy()

    out = np.zeros((N, P + gen_len), np.int64)
    out[:, :P] = prompts
    out[:, P] = run([Segment(r, 0, prompts[r].astype(np.int32), P, np.array([P - 1])) for r in range(N)])
    for t in range(P, P + gen_len - 1):
        out[:, t + 1] = run([Segment(r, t, out[r, t : t + 1].astype(np.int32), 1, np.array([0])) for r in range(N)])
        if progress is not None:
            progress.update(1)
    return out


@torch.no_grad()
def features(model, cfg, tokens: np.ndarray, prompt_len: int, batch: int = 16) -> Rollouts:
    N, L = tokens.shape
    layers = tuple(cfg.dspark.target_layer_ids)
    taps = torch.zeros(N, len(layers), L, cfg.hidden_size)
    final = torch.zeros(N, L, cfg.hidden_size)
    match = total = 0
    for i in range(0, N, batch):
        rows = tokens[i : i + batch]
        logits, y, tp = trunk.forward(model, trunk.PagedPass(cfg, len(rows), L), rows, layers)
        b = len(rows)
        for j, layer in enumerate(layers):
            taps[i : i + b, j] = tp[layer].float().mean(dim=1).view(b, L, -1)
        final[i : i + b] = y.float().view(b, L, -1)
        pred = logits.argmax(-1).view(b, L).numpy()
        match += int((pred[:, prompt_len - 1 : -1] == rows[:, prompt_len:]).sum())
        total += b * (L - prompt_len)
    return Rollouts(tokens, taps, final, prompt_len, match / max(1, total))


def prompts_from(stream: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    starts = rng.integers(0, len(stream) - length, n)
    return np.stack([stream[s : s + length] for s in starts]).astype(np.int64)


def sizes(smoke: bool) -> tuple[int, int, int, int]:
    """(train rollouts, held-out rollouts, prompt length, generated length)."""
    return (8, 4, 16, 24) if smoke else (160, 32, 64, 160)


def train_and_heldout(
    model, cfg, train_stream: np.ndarray, held_stream: np.ndarray, seed: int, smoke: bool, progress
) -> dict[str, Rollouts]:
    """The drafter stage's rollouts (and the calibrate stage's, rebuilt identically): prompts
    drawn from each token stream with one seeded generator, train first."""
    n_train, n_held, plen, glen = sizes(smoke)
    rng = np.random.default_rng([seed, 7])
    bar = progress(total=2 * (glen - 1), desc="rollouts")
    data = {}
    for name, stream, n in (("train", train_stream, n_train), ("heldout", held_stream, n_held)):
        toks = generate(model, cfg, prompts_from(stream, n, plen, rng), glen, bar)
        data[name] = features(model, cfg, toks, plen)
    bar.close()
    return data


def describe(data: dict[str, Rollouts], smoke: bool) -> str:
    n_train, n_held, plen, glen = sizes(smoke)
    return (
        f"rollouts {n_train}+{n_held} x {plen}+{glen} tokens, "
        f"teacher-forced argmax == greedy on {data['train'].greedy_match:.4f}"
    )
