"""Our paged forward against transformers' DeepseekV4ForCausalLM (fp32) on the same weights."""

import numpy as np

from tests.integration.model.conftest import Driver, new_runner, prompt, reference_greedy, reference_logits
from workers.staging import Segment

PROMPT_LEN = 150
NUM_NEW = 64
# Measured max |ours - transformers| over every logit of a 150-token prompt: ~2e-5 with
# logits spread by ~10 units (summation order only).
LOGIT_TOL = 2e-4


def test_full_prompt_logits_match_transformers(ref):
    """Every row's logits of a one-shot prefill must equal transformers' within LOGIT_TOL."""
    runner = new_runner(ref.path)
    p = prompt(1, PROMPT_LEN, ref.vocab_size)
    drv = Driver(runner)
    drv.map(1, len(p))
    out = runner.forward([Segment(1, 0, np.asarray(p, np.int32), len(p), np.arange(len(p)))])
    want = reference_logits(ref.model, p)
    assert out.logits.shape == want.shape
    assert float((out.logits - want).abs().max()) < LOGIT_TOL


def test_greedy_decode_reproduces_transformers_tokens(ref):
    """64 greedy tokens through 1-row decode segments must equal transformers' cached greedy."""
    p = prompt(2, 97, ref.vocab_size)
    want = reference_greedy(ref.model, p, NUM_NEW)
    drv = Driver(new_runner(ref.path))
    tok = int(drv.prefill(1, p).token_ids[0])
    got = [tok]
    for i in range(NUM_NEW - 1):
        tok = int(drv.prefill(1, [tok], start=len(p) + i).token_ids[0])
        got.append(tok)
    assert got == want
    assert len(set(got)) > 4  # the reference really moves through the vocabulary


def test_bf16_logits_stay_close_to_fp32(mixed_ref):
    """bf16 activations must keep the greedy choice of most rows and logits within a few %."""
    p = prompt(3, 64, mixed_ref.vocab_size)
    want = reference_logits(mixed_ref.model, p)
    drv = Driver(new_runner(mixed_ref.path, dtype="bfloat16"))
    drv.map(1, len(p))
    out = drv.runner.forward([Segment(1, 0, np.asarray(p, np.int32), len(p), np.arange(len(p)))])
    rel = float((out.logits - want).norm() / want.norm())
    assert rel < 0.05, rel
    assert float((out.logits.argmax(-1) == want.argmax(-1)).float().mean()) > 0.8
