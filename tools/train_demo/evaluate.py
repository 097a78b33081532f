"""Offline acceptance of a checkpoint's drafter, greedy and under sampling, on held-out
rollouts: the 7-draft chain as the server drafts and verifies it.

    python -m tools.train_demo evaluate --model DIR [--model DIR2 ...] [--temperatures 0 0.8]
        [--out WORK] [--anchors 2048] [--rollouts 64]

    rollouts    per temperature T: held-out prompts continued by the checkpoint's target,
                greedy (T = 0) or SAMPLED at T with one seed per rollout (the contexts a
                sampling user produces); built once per target and cached under WORK
    drafts      per anchor (rollout, position P): Drafter.propose on the rollout's context;
                at T > 0 draft s = argmax(drafter_logits / T + G(seed, P+1+s)) with the
                serving noise (workers/sampling: DraftPicker, gumbel_noise)
    accepted    the target's token at P+1+s is the rollout's own (argmax(target_logits / T
                + G), the same noise), so the chain accepts drafts while they equal it:
                mean accepted length = 1 + E[accepted drafts] per 8-row verify, and
                acceptance per position = P(drafts 0..s all accepted)

--constrained: also, per T, held-out rollouts written as JSON documents under
tools.bench.demo.SCHEMA (a schema outside redraft's training pool; rollout.sampled(factories=):
the target's picks under the grammar masks), reported as "json T=t". The drafts are the
drafter's own (the server also replaces a draft where the grammar allows one token only),
so this is a lower bound of what a served constrained request accepts.

Several --model directories sharing one target (e.g. a retrained drafter and the shipped
one) are measured on the same rollouts and anchors.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from dspark_loop.contract.model_config import ModelConfig
from tools.train_demo import calibration, rollout, state, tokenizer
from tools.train_demo.anchors import anchors
from workers.drafter_weights import load_drafter
from workers.weights import load_model


def target_digest(model_dir: str) -> str:
    """sha256 over the target's tensors (names without the drafter's mtp. prefix)."""
    h = hashlib.sha256()
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        for name in sorted(k for k in f.keys() if not k.startswith("mtp.")):
            h.update(name.encode())
            h.update(f.get_tensor(name).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def streams(model_dir: str, smoke: bool) -> tuple[list, np.ndarray, np.ndarray]:
    """(corpus files, train stream, held-out stream) through the checkpoint's tokenizer.json."""
    files, train, held = tokenizer.corpus(smoke)
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    return (files, *(tokenizer.stream(tok, [f.text for f in part]) for part in (train, held)))


def acceptance(drafter, target, ro: rollout.Rollouts, n: int, seed: int) -> dict:
    """Mean accepted length and per-position acceptance of n anchors of ro, served drafts."""
    seq, pos = anchors(ro, np.random.default_rng([seed, 4000]), n)
    drafts, _, labels = calibration.serve_drafts(drafter, target, ro, seq, pos)
    return {**calibration.acceptance(drafts, labels), "anchors": n}


def heldout(target, cfg, held_stream, temperature: float, n: int, seed: int, smoke: bool, progress, grammar=None):
    """grammar: () -> a fresh GrammarConstraint (constrained rollouts), None: free ones."""
    rng = np.random.default_rng([seed, 5000 + (grammar is not None), round(temperature * 1000)])
    bar = progress(total=rollout.sizes(smoke)[3] - 1, desc=f"rollouts T={temperature}")
    factories = None if grammar is None else [grammar]
    ro = rollout.sampled(target, cfg, held_stream, n, [temperature], rng, smoke, bar, factories)
    bar.close()
    return ro


def run(
    model_dirs: list[str],
    out_dir: str,
    temperatures: list[float],
    seed: int,
    smoke: bool,
    n_anchors: int,
    n_rollouts: int,
    log,
    progress,
    constrained: bool = False,
) -> dict:
    d = os.path.join(out_dir, "evaluate")
    os.makedirs(d, exist_ok=True)
    cfg = ModelConfig.from_dir(model_dirs[0])
    digests = [target_digest(m) for m in model_dirs]
    if len(set(digests)) > 1:
        raise ValueError(f"--model directories with different targets: {model_dirs}")
    target = load_model(model_dirs[0], cfg, quiet=True)
    held_stream = None
    results = {m: {} for m in model_dirs}
    grammar = None
    if constrained:
        from tools.bench.demo import SCHEMA
        from tools.train_demo.schemas import constraint_factory

        grammar = constraint_factory(
            Tokenizer.from_file(os.path.join(model_dirs[0], "tokenizer.json")), cfg.vocab_size, SCHEMA
        )
    for kind, g in (("", None),) + ((("json-", grammar),) if constrained else ()):
        for t in temperatures:
            name = f"{'json ' if g is not None else ''}T={t:g}"
            path = os.path.join(d, f"heldout-{kind}T{t:g}-n{n_rollouts}-s{seed}-{digests[0][:16]}.pt")
            ro = state.load_state(path)
            if ro is None:
                t0 = time.perf_counter()
                if held_stream is None:
                    held_stream = streams(model_dirs[0], smoke)[2]
                ro = heldout(target, cfg, held_stream, t, n_rollouts, seed, smoke, progress, g)
                state.save_state(path, ro)
                log(f"evaluate: {n_rollouts} held-out rollouts at {name} in {time.perf_counter() - t0:.0f}s")
            for m in model_dirs:
                acc = acceptance(load_drafter(m, cfg), target, ro, n_anchors, seed)
                results[m][name] = acc
                log(
                    f"evaluate: {m} {name}: mean accepted length {acc['mean_accepted_len']:.3f}, "
                    f"per position {acc['acceptance_per_position']} ({n_anchors} anchors of {n_rollouts} rollouts)"
                )
    return {"models": results, "temperatures": temperatures, "anchors": n_anchors, "rollouts": n_rollouts}
