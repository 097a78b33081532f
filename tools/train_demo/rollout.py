"""The target's own sequences for drafter training: prompts from the corpus, continued
by the frozen target through the served forward (paged prefill, then one-row decode
steps), then one teacher-forced pass for the drafter's inputs. Continuations are greedy, or
sampled per rollout at its own temperature and seed with the server's sampler (Gumbel-max,
noise of (seed, choice 0, position)): what a sampling user's request produces.

    Rollouts.tokens  [N, L] int64        prompt (P tokens) + continuation
    Rollouts.taps    [N, 3, L, d] fp32   hc-mean of the trunk after each dspark_target_layer_id
    Rollouts.final   [N, L, d]           the head's input (p_target = softmax(head(final)))
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from tools.train_demo import trunk
from workers.comm import LocalComm
from workers.sampling.rows import SamplingRows
from workers.sampling.sampler import sample
from workers.staging import Segment, stage


@dataclass
class Rollouts:
    tokens: np.ndarray
    taps: torch.Tensor
    final: torch.Tensor
    prompt_len: int
    greedy_match: float  # teacher-forced argmax == the rollout's next token (batch invariance)
    temperature: np.ndarray | None = None  # [N] fp32 per rollout (0: greedy); None: all greedy
    seeds: np.ndarray | None = None  # [N] int64 per rollout: its sampling noise's seed

    def sampling_rows(self, seq: np.ndarray) -> SamplingRows | None:
        """The requests of rollouts seq [R] (position left 0), None when all are greedy."""
        if self.temperature is None or not (self.temperature[seq] > 0).any():
            return None
        return SamplingRows.make(len(seq), temperature=self.temperature[seq], seed=self.seeds[seq])


@torch.no_grad()
def generate(model, cfg, prompts: np.ndarray, gen_len: int, progress=None, temperature=None, seeds=None) -> np.ndarray:
    """prompts [N, P] -> [N, P + gen_len]: continuations, all N in one decode batch; greedy,
    or sampled at temperature [N] (0: greedy) with seeds [N] as the server samples them."""
    N, P = prompts.shape
    paged = trunk.PagedPass(cfg, N, P + gen_len)
    pool = paged.pool(model.dtype)
    comm = LocalComm()
    rows = None if temperature is None else SamplingRows.make(N, temperature=temperature, seed=seeds)

    def run(segs, at: int):
        out = model(stage(segs, paged.tables, paged.layout, cfg, pool), pool, comm)
        if rows is None:
            return out.token_ids.numpy()
        # NOTE: position = the sampled token's own position (SamplingRows), the noise
        # coordinate the drafter's coupled pick of that token uses too
        return sample(out.logits, replace(rows, position=torch.full((N,), at)), comm, 0).numpy()

    out = np.zeros((N, P + gen_len), np.int64)
    out[:, :P] = prompts
    out[:, P] = run([Segment(r, 0, prompts[r].astype(np.int32), P, np.array([P - 1])) for r in range(N)], P)
    for t in range(P, P + gen_len - 1):
        segs = [Segment(r, t, out[r, t : t + 1].astype(np.int32), 1, np.array([0])) for r in range(N)]
        out[:, t + 1] = run(segs, t + 1)
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


def sampled(
    model, cfg, stream: np.ndarray, n: int, temperatures, rng: np.random.Generator, smoke: bool, bar=None
) -> Rollouts:
    """n rollouts of prompts from stream, rollout i continued at temperatures[i % len] (0:
    greedy) with its own seed from rng: the contexts sampling users produce."""
    _, _, plen, glen = sizes(smoke)
    temp = np.asarray([temperatures[i % len(temperatures)] for i in range(n)], np.float32)
    seeds = rng.integers(0, 2**62, n)
    toks = generate(model, cfg, prompts_from(stream, n, plen, rng), glen, bar, temp, seeds)
    return replace(features(model, cfg, toks, plen), temperature=temp, seeds=seeds)


def describe(data: dict[str, Rollouts], smoke: bool) -> str:
    n_train, n_held, plen, glen = sizes(smoke)
    return (
        f"rollouts {n_train}+{n_held} x {plen}+{glen} tokens, "
        f"teacher-forced argmax == greedy on {data['train'].greedy_match:.4f}"
    )
