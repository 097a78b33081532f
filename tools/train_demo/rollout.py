"""The target's own sequences for drafter training: prompts from the corpus, continued
by the frozen target through the served forward (paged prefill, then one-row decode
steps), then one teacher-forced pass for the drafter's inputs. Continuations are greedy, or
sampled per rollout at its own temperature and seed with the server's sampler (Gumbel-max,
noise of (seed, choice 0, position)): what a sampling user's request produces.

    Rollouts.tokens  [N, L] int64        prompt (P tokens) + continuation
    Rollouts.taps    [N, 3, L, d] fp32   hc-mean of the trunk after each dspark_target_layer_id
    Rollouts.final   [N, L, d]           the head's input (p_target = softmax(head(final)))
    Rollouts.allowed [N, L, ceil(V/8)]   uint8, constrained rollouts (redraft
                                         --constrained-share): the packed grammar mask that
                                         token t was picked under (all bits set: free)

Constrained rollouts (sampled(factories=...)) continue each prompt with JSON documents under one
schema per rollout, through the server's GrammarConstraint: the target's logits outside the
mask at -inf before the pick, as the ranks apply a TokenMask; a document that ends (its EOS
accepted) is followed by a fresh one, so every generated token is a grammar's pick.
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
    allowed: np.ndarray | None = None  # [N, L, ceil(V/8)] uint8 packed grammar masks; None: all free

    def allowed_at(self, seq: np.ndarray, pos: np.ndarray, vocab_size: int) -> torch.Tensor | None:
        """[*seq.shape, V] bool: the mask each token seq[i], pos[i] was picked under;
        None: every rollout is free."""
        if self.allowed is None:
            return None
        bits = np.unpackbits(self.allowed[seq, pos], axis=-1, bitorder="little")[..., :vocab_size]
        return torch.from_numpy(bits.astype(bool))

    def sampling_rows(self, seq: np.ndarray) -> SamplingRows | None:
        """The requests of rollouts seq [R] (position left 0), None when all are greedy."""
        if self.temperature is None or not (self.temperature[seq] > 0).any():
            return None
        return SamplingRows.make(len(seq), temperature=self.temperature[seq], seed=self.seeds[seq])


class GrammarRows:
    """Per rollout, documents under its schema: the mask of its next token, and the tokens
    it took. factories [N]: () -> a fresh GrammarConstraint (schemas.constraint_factory).
    masks [N, length, ceil(V/8)]: the packed mask each token was picked under (all bits
    set where no grammar ruled: the prompt)."""

    def __init__(self, factories: list, vocab_size: int, length: int) -> None:
        self.factories = factories
        self.live = [f() for f in factories]
        self.docs: list[list[int]] = [[] for _ in factories]  # each rollout's current document
        self.masks = np.full((len(factories), length, (vocab_size + 7) // 8), 0xFF, np.uint8)

    def allowed(self, at: int) -> np.ndarray:
        """[N, V] bool: what may follow each rollout's document so far, the token at `at`."""
        allowed = np.stack([c.allowed_token_mask(d) for c, d in zip(self.live, self.docs)])
        self.masks[:, at] = np.packbits(allowed, axis=-1, bitorder="little")
        return allowed

    def take(self, tokens: np.ndarray) -> None:
        for r, t in enumerate(tokens.tolist()):
            self.docs[r].append(int(t))
            if not self.live[r].accept(int(t)):
                raise RuntimeError(f"rollout {r}: token {t} outside its own grammar mask")
            if self.live[r].is_terminated():  # the document ended: the next one starts
                self.live[r], self.docs[r] = self.factories[r](), []


@torch.no_grad()
def generate(
    model, cfg, prompts: np.ndarray, gen_len: int, progress=None, temperature=None, seeds=None, grammar=None
) -> np.ndarray:
    """prompts [N, P] -> [N, P + gen_len]: continuations, all N in one decode batch; greedy,
    or sampled at temperature [N] (0: greedy) with seeds [N] as the server samples them.
    grammar: a GrammarRows (of length P + gen_len), whose masks rule every generated token
    and record what each was picked under."""
    N, P = prompts.shape
    paged = trunk.PagedPass(cfg, N, P + gen_len)
    pool = paged.pool(model.dtype)
    comm = LocalComm()
    rows = None if temperature is None else SamplingRows.make(N, temperature=temperature, seed=seeds)

    def run(segs, at: int):
        out = model(stage(segs, paged.tables, paged.layout, cfg, pool), pool, comm)
        logits = out.logits
        if grammar is not None:
            allowed = grammar.allowed(at)  # [N, V]
            logits = logits.float().masked_fill(~torch.from_numpy(allowed[:, : logits.shape[1]]), float("-inf"))
        if rows is None:
            picked = out.token_ids.numpy() if grammar is None else logits.argmax(-1).numpy()
        else:
            # NOTE: position = the sampled token's own position (SamplingRows), the noise
            # coordinate the drafter's coupled pick of that token uses too
            picked = sample(logits, replace(rows, position=torch.full((N,), at)), comm, 0).numpy()
        if grammar is not None:
            grammar.take(picked)
        return picked

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
    model,
    cfg,
    stream: np.ndarray,
    n: int,
    temperatures,
    rng: np.random.Generator,
    smoke: bool,
    bar=None,
    factories: list | None = None,
) -> Rollouts:
    """n rollouts of prompts from stream, rollout i continued at temperatures[i % len] (0:
    greedy) with its own seed from rng: the contexts sampling users produce. factories:
    each rollout's continuation JSON documents under factories[i % len]'s grammar (module
    docstring), its masks in Rollouts.allowed; None: free text."""
    _, _, plen, glen = sizes(smoke)
    temp = np.asarray([temperatures[i % len(temperatures)] for i in range(n)], np.float32)
    seeds = rng.integers(0, 2**62, n)
    grammar = None
    if factories is not None:
        grammar = GrammarRows([factories[i % len(factories)] for i in range(n)], cfg.vocab_size, plen + glen)
    toks = generate(model, cfg, prompts_from(stream, n, plen, rng), glen, bar, temp, seeds, grammar)
    allowed = None if grammar is None else grammar.masks
    return replace(features(model, cfg, toks, plen), temperature=temp, seeds=seeds, allowed=allowed)


def concat(parts: list[Rollouts]) -> Rollouts:
    """One set of rollouts from several of the same prompt and total lengths."""
    a = parts[0]
    if any(p.prompt_len != a.prompt_len or p.tokens.shape[1] != a.tokens.shape[1] for p in parts):
        raise ValueError("rollouts of different prompt or total lengths cannot be joined")
    n = [len(p.tokens) for p in parts]

    def column(get, fill):
        if all(get(p) is None for p in parts):
            return None
        return np.concatenate([get(p) if get(p) is not None else fill(p) for p in parts])

    vbytes = next((p.allowed.shape[2] for p in parts if p.allowed is not None), 0)
    L = a.tokens.shape[1]
    return Rollouts(
        tokens=np.concatenate([p.tokens for p in parts]),
        taps=torch.cat([p.taps for p in parts]),
        final=torch.cat([p.final for p in parts]),
        prompt_len=a.prompt_len,
        greedy_match=float(np.average([p.greedy_match for p in parts], weights=n)),
        temperature=column(lambda p: p.temperature, lambda p: np.zeros(len(p.tokens), np.float32)),
        seeds=column(lambda p: p.seeds, lambda p: np.zeros(len(p.tokens), np.int64)),
        allowed=column(lambda p: p.allowed, lambda p: np.full((len(p.tokens), L, vbytes), 0xFF, np.uint8)),
    )


def describe(data: dict[str, Rollouts], smoke: bool) -> str:
    n_train, n_held, plen, glen = sizes(smoke)
    return (
        f"rollouts {n_train}+{n_held} x {plen}+{glen} tokens, "
        f"teacher-forced argmax == greedy on {data['train'].greedy_match:.4f}"
    )
