"""Batch invariance: a request's tokens must not depend on what else is in the step."""

import numpy as np
import torch

from tests.integration.model.conftest import Driver, new_runner, prompt
from workers.staging import Segment

LENS = [37, 90, 5, 130]
NUM_DECODE = 12


def alone(ref, req_prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    drv = Driver(new_runner(ref.path))
    out = drv.prefill(1, req_prompt)
    toks, first = [int(out.token_ids[0])], out.logits[0]
    for i in range(NUM_DECODE):
        toks.append(int(drv.prefill(1, [toks[-1]], start=len(req_prompt) + i).token_ids[0]))
    return toks, first


def packed(ref, prompts: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    drv = Driver(new_runner(ref.path))
    segs = [Segment(r, 0, np.asarray(p, np.int32), len(p), np.array([len(p) - 1])) for r, p in enumerate(prompts)]
    out = drv.run(segs)
    toks = [[int(t)] for t in out.token_ids]
    for i in range(NUM_DECODE):
        segs = [
            Segment(r, len(p) + i, np.array([toks[r][-1]], np.int32), 1, np.array([0])) for r, p in enumerate(prompts)
        ]
        for r, t in enumerate(drv.run(segs).token_ids):
            toks[r].append(int(t))
    return toks, out.logits


def test_packed_prefill_and_batched_decode_equal_each_request_alone(ref):
    """Packed prefill + batched 1-row decode must give every request its solo tokens, and the
    prefill logits bit for bit."""
    prompts = [prompt(10 + i, n, ref.vocab_size) for i, n in enumerate(LENS)]
    got, logits = packed(ref, prompts)
    for r, p in enumerate(prompts):
        want, first = alone(ref, p)
        assert got[r] == want
        assert torch.equal(logits[r], first)


def test_same_request_beside_different_neighbours_gives_same_tokens(mixed_ref):
    """A request must decode the same tokens first, last or between other requests."""
    target = prompt(20, 61, mixed_ref.vocab_size)
    others = [prompt(30 + i, n, mixed_ref.vocab_size) for i, n in enumerate([12, 100, 7])]
    a, _ = packed(mixed_ref, [target] + others)
    b, _ = packed(mixed_ref, others[:2] + [target])
    c, _ = packed(mixed_ref, [others[2], target])
    assert a[0] == b[2] == c[1]
