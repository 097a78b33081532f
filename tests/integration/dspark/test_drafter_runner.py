"""The rank-side drafter on the tiny checkpoint: what K=0 and K=7 load, missing-drafter
errors, ring scrubs, and drafts that do not depend on the batch."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from dspark_loop.contract.protocol import BlockUpdate, PartitionPlan, PrefillChunk, RankConfig, i32
from tests.integration.dspark.harness import prompt
from workers.runner import ModelRunner


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tools.make_checkpoint import make_checkpoint

    return make_checkpoint(
        str(tmp_path_factory.mktemp("dspark") / "tiny"),
        size="tiny",
        seed=7,
        with_drafter=True,
        num_hidden_layers=4,
        quiet=True,
    )


def new_runner(path):
    return ModelRunner(RankConfig(model=path, block_size=8, num_blocks=32, spec_k=7, num_leases=4), quiet=True)


def admit(runner, req_id, lease, tokens, scrub=()):
    ups = [
        BlockUpdate(req_id, f.index, 0, i32(range(req_id * 8, req_id * 8 + f.num_pages(64))))
        for f in runner.layout.families
    ]
    part = PartitionPlan(
        block_updates=ups,
        prefills=[PrefillChunk(req_id, 0, i32(tokens), True)],
        lease_req_ids=i32([req_id]),
        lease_ids=i32([lease]),
        scrub_lease_ids=i32(scrub),
    )
    runner.execute(part)
    return runner.take_drafts()


def test_k0_loads_and_allocates_nothing_drafter_related(ckpt):
    """A K=0 runner on a drafter checkpoint must hold no drafter, rings or leases and
    return no drafts."""
    runner = ModelRunner(RankConfig(model=ckpt, block_size=8, num_blocks=8), quiet=True)
    assert runner.spec is None and runner.take_drafts() is None
    assert not any(n.startswith("mtp") for n in runner.model.state_dict())


def test_k7_without_drafter_config_or_tensors_names_what_is_missing(ckpt, tmp_path):
    """K=7 must refuse a checkpoint without dspark_* keys, and one whose config has them
    but whose tensors lack mtp.*, naming the missing parts."""
    from tools.make_checkpoint import make_checkpoint

    plain = make_checkpoint(str(tmp_path / "plain"), size="tiny", seed=7, num_hidden_layers=4, quiet=True)
    with pytest.raises(ValueError, match="dspark_target_layer_ids"):
        new_runner(plain)
    with open(os.path.join(ckpt, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    shutil.copy(os.path.join(ckpt, "config.json"), os.path.join(plain, "config.json"))
    assert "dspark_noise_token_id" in cfg
    with pytest.raises(ValueError, match=r"lacks \d+ drafter tensors: \['mtp\.0\."):
        new_runner(plain)


def test_a_scrubbed_lease_is_all_zero_and_other_leases_keep_their_rows(ckpt):
    """Seeding writes ring rows under the request's lease; a plan that scrubs that lease
    must zero exactly its blocks in every stage."""
    runner = new_runner(ckpt)
    admit(runner, 1, 2, prompt(1, 30, 1024))
    admit(runner, 2, 3, prompt(2, 30, 1024))
    spec = runner.spec.proposer
    assert all(spec.lease_rows(2, k).abs().sum() > 0 for k in range(3))
    keep = [spec.lease_rows(3, k).clone() for k in range(3)]
    runner.execute(PartitionPlan(freed_req_ids=[1], scrub_lease_ids=i32([2])))
    assert all(torch.count_nonzero(spec.lease_rows(2, k)) == 0 for k in range(3))
    assert all(torch.equal(spec.lease_rows(3, k), keep[k]) for k in range(3))
    assert torch.count_nonzero(spec.rings[0][spec.filler_row :]) == 0  # the filler is never written


def test_drafts_do_not_depend_on_the_batch_or_the_lease(ckpt):
    """A request's seeded drafts must be identical alone (lease 0) and packed with another
    request (lease 3)."""
    p = prompt(9, 27, 1024)
    alone = admit(new_runner(ckpt), 1, 0, p)
    runner = new_runner(ckpt)
    ups = [
        BlockUpdate(r, f.index, 0, i32(range(r * 8, r * 8 + f.num_pages(64))))
        for r in (1, 2)
        for f in runner.layout.families
    ]
    runner.execute(
        PartitionPlan(
            block_updates=ups,
            prefills=[PrefillChunk(2, 0, i32(prompt(3, 19, 1024)), True), PrefillChunk(1, 0, i32(p), True)],
            lease_req_ids=i32([2, 1]),
            lease_ids=i32([1, 3]),
        )
    )
    req_ids, drafts, conf = runner.take_drafts()
    assert req_ids.tolist() == [2, 1]
    assert np.array_equal(drafts[1], alone[1][0]) and np.array_equal(conf[1], alone[2][0])
    assert ((conf >= 0) & (conf <= 1)).all()


def test_a_skipped_drafter_pass_keeps_the_ring_so_later_drafts_are_unchanged(ckpt):
    """A decode whose drafter pass is masked off (DecodeBatch.draft_mask 0) must keep its
    context rows (held until it drafts again): the drafts of the next step must equal those
    of a rank that drafted at every step."""
    from dspark_loop.contract.protocol import DecodeBatch, i8

    p = prompt(11, 29, 1024)
    runners = [new_runner(ckpt), new_runner(ckpt)]
    ups = [BlockUpdate(1, f.index, 0, i32(range(8, 8 + f.num_pages(64)))) for f in runners[0].layout.families]
    toks, firsts = [], []
    for r in runners:
        plan = PartitionPlan(
            block_updates=ups, prefills=[PrefillChunk(1, 0, i32(p), True)], lease_req_ids=i32([1]), lease_ids=i32([0])
        )
        toks.append(int(r.execute(plan)[0]))
        firsts.append(r.take_drafts())
    assert toks[0] == toks[1] and np.array_equal(firsts[0][1], firsts[1][1])
    pos, drafts = len(p), firsts[0][1][0]
    preds = []
    for skip, runner in zip((False, True), runners):  # a 4-row verify (3 drafts), drafting or not
        d = DecodeBatch(i32([1]), i32([pos]), i8([4]), i32([toks[0], *drafts[:3]]), draft_mask=b"\x00" if skip else b"")
        preds.append(runner.execute(PartitionPlan(decode=d)))
        out = runner.take_drafts()
        assert (out is None or len(out[0]) == 0) == skip
    assert np.array_equal(preds[0], preds[1])
    a = 1  # accepted rows
    while a < 4 and drafts[a - 1] == preds[0][a - 1]:
        a += 1
    nxt = []
    for runner in runners:  # the same 1-row step after the accepted rows, drafting
        d = DecodeBatch(i32([1]), i32([pos + a]), i8([1]), i32([int(preds[0][a - 1])]))
        runner.execute(PartitionPlan(decode=d))
        nxt.append(runner.take_drafts())
    assert np.array_equal(nxt[0][1], nxt[1][1]) and np.array_equal(nxt[0][2], nxt[1][2])
    assert all(
        torch.equal(runners[0].spec.proposer.lease_rows(0, k), runners[1].spec.proposer.lease_rows(0, k))
        for k in range(3)
    )


def test_many_skipped_passes_then_drafting_give_the_drafts_of_a_rank_that_always_drafted(ckpt):
    """Context rows held over many skipped passes (the prompt's pass skipped too, PrefillChunk
    draft=False) must reach the rings before the request drafts again: its drafts and
    confidences then equal a rank's that drafted every step, and the held rows are gone."""
    from dspark_loop.contract.protocol import DecodeBatch, i8

    p = prompt(5, 40, 1024)
    runners = [new_runner(ckpt), new_runner(ckpt)]
    ups = [BlockUpdate(1, f.index, 0, i32(range(8, 8 + f.num_pages(128)))) for f in runners[0].layout.families]
    toks = []
    for skip, r in zip((False, True), runners):
        chunk = PrefillChunk(1, 0, i32(p), True, draft=not skip)
        plan = PartitionPlan(block_updates=ups, prefills=[chunk], lease_req_ids=i32([1]), lease_ids=i32([0]))
        toks.append(int(r.execute(plan)[0]))
        r.take_drafts()
    assert toks[0] == toks[1]
    tok, pos = toks[0], len(p)
    spec = runners[1].spec.proposer
    for step in range(12):  # 1-row decodes; the second rank skips every pass but the last
        outs, drafts = [], []
        for skip, r in zip((False, step < 11), runners):
            d = DecodeBatch(i32([1]), i32([pos]), i8([1]), i32([tok]), draft_mask=b"\x00" if skip else b"")
            outs.append(int(r.execute(PartitionPlan(decode=d))[0]))
            drafts.append(r.take_drafts())
        assert outs[0] == outs[1]
        tok, pos = outs[0], pos + 1
        if step == 10:
            assert spec.pending.sum() >= 11  # the prompt tail and 11 decode rows held, not written
    assert not spec.pending.any()  # written when it drafted
    (ids0, d0, c0), (ids1, d1, c1) = drafts
    assert ids0.tolist() == ids1.tolist() == [1]
    assert np.array_equal(d0, d1) and np.array_equal(c0, c1)
