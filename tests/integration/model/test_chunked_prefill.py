"""Chunked prefill: chunk boundaries anywhere (off page, off ratio alignment) must give
the same cache and the same logits as a one-shot prefill."""

import pytest
import torch

from tests.integration.model.conftest import Driver, new_runner, prompt

PROMPT_LEN = 181


def chunked(drv: Driver, req: int, p: list[int], size: int):
    out = None
    for start in range(0, len(p), size):
        piece = p[start : start + size]
        out = drv.prefill(req, piece, start=start, sample=start + size >= len(p))
    return out


@pytest.mark.parametrize("chunk_size", [7, 13, 64])
def test_chunked_prefill_equals_one_shot(mixed_ref, chunk_size):
    """The last row's logits and the next 8 greedy tokens must not depend on the chunking."""
    p = prompt(5, PROMPT_LEN, mixed_ref.vocab_size)
    one = Driver(new_runner(mixed_ref.path))
    want = one.prefill(1, p)
    many = Driver(new_runner(mixed_ref.path))
    got = chunked(many, 1, p, chunk_size)
    assert torch.allclose(got.logits, want.logits, atol=2e-4, rtol=0)
    a, b = int(want.token_ids[0]), int(got.token_ids[0])
    assert a == b
    for i in range(8):
        a = int(one.prefill(1, [a], start=PROMPT_LEN + i).token_ids[0])
        b = int(many.prefill(1, [b], start=PROMPT_LEN + i).token_ids[0])
        assert a == b


def test_unsampled_chunks_return_no_token(mixed_ref):
    """A prefill chunk that does not end the prompt must produce no logit row."""
    drv = Driver(new_runner(mixed_ref.path))
    out = drv.prefill(1, prompt(6, 20, mixed_ref.vocab_size), sample=False)
    assert out.logits.shape[0] == 0 and out.token_ids.numel() == 0
