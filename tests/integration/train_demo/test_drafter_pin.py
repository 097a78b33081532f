"""The drafter's training-time forward (tools/train_demo/drafter.block_outputs: rollout
taps -> rings -> block -> teacher-forced Markov head) is the serving drafter: fed the served
drafts as its teacher tokens it must reproduce them, and the served confidences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dspark_loop.contract.protocol import BlockUpdate, PartitionPlan, PrefillChunk, RankConfig, i32
from tools.train_demo import rollout
from tools.train_demo.drafter import block_outputs
from workers.runner import ModelRunner


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tools.make_checkpoint import make_checkpoint

    return make_checkpoint(
        str(tmp_path_factory.mktemp("pin") / "tiny"), size="tiny", seed=11, with_drafter=True, quiet=True
    )


@pytest.mark.parametrize("prompt_len", [9, 40])  # inside and past the drafter window (16)
def test_training_forward_reproduces_served_drafts(ckpt, prompt_len):
    """For the anchor a prefill hands the drafter, block_outputs with prev = (anchor,
    drafts 0..5) must argmax to exactly the served drafts, with the served confidences."""
    runner = ModelRunner(RankConfig(model=ckpt, block_size=8, num_blocks=32, spec_k=7, num_leases=2), quiet=True)
    prompt = np.random.default_rng(prompt_len).integers(10, runner.cfg.vocab_size, prompt_len)
    ups = [
        BlockUpdate(5, f.index, 0, i32(range(2 + f.num_pages(64), 2 + 2 * f.num_pages(64))))
        for f in runner.layout.families
    ]
    part = PartitionPlan(
        block_updates=ups, prefills=[PrefillChunk(5, 0, i32(prompt), True)], lease_req_ids=i32([5]), lease_ids=i32([1])
    )
    anchor = int(runner.execute(part)[0])
    _, drafts, conf = runner.take_drafts()  # [1, 7]
    tokens = np.concatenate([prompt, [anchor]])[None, :].astype(np.int64)  # committed + anchor
    ro = rollout.features(runner.model, runner.cfg, tokens, prompt_len)
    prev = torch.tensor([[anchor] + drafts[0, :6].tolist()])
    with torch.no_grad():
        logits, conf_logit = block_outputs(
            runner.spec.proposer.drafter, runner.model, ro, np.array([0]), np.array([prompt_len]), prev
        )
    assert logits.argmax(-1).tolist() == drafts.tolist()
    assert torch.equal(torch.sigmoid(conf_logit), torch.from_numpy(conf))
