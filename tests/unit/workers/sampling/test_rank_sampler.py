"""The rank's sampling pass over whole plans: K=7 verify tiles emit exactly the K=0 tokens
(filters and penalties on), and the logprob entries name the right positions and tokens."""

import hashlib

import numpy as np
import torch

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.contract.protocol import DecodeBatch, PartitionPlan, PrefillChunk, SamplingSpec, i8, i32
from dspark_loop.contract.sampling_knobs import KNOB_NAMES, SamplingKnobs
from tests.unit.workers.sampling.sharded import run_sharded
from workers.comm import LocalComm
from workers.sampling.logprobs import log_softmax_sharded
from workers.sampling.rank_sampler import RankSampler
from workers.sampling.step_rows import step_rows

V = 64
PROMPT = [5, 9, 2, 7]


def spec(req_id, **kw) -> SamplingSpec:
    knobs = dict(
        temperature=0.9,
        top_k=20,
        top_p=0.9,
        min_p=0.02,
        presence_penalty=0.3,
        frequency_penalty=0.2,
        repetition_penalty=1.2,
    )
    base = dict(
        req_id=req_id,
        prompt_len=len(PROMPT),
        seed=1234,
        choice=0,
        num_logprobs=-1,
        num_prompt_logprobs=-1,
        output_token_ids=b"",
        prompt_token_ids=i32(PROMPT),
    )
    for k, v in kw.items():
        (knobs if k in KNOB_NAMES else base)[k] = v
    return SamplingSpec(knobs=SamplingKnobs(**knobs), **base)


def fake_logits(tokens) -> torch.Tensor:
    """A stand-in model: the next-token logits [V] are a pure function of the prefix."""
    digest = hashlib.blake2b(np.asarray(tokens, np.int64).tobytes(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest, "little") % (1 << 62))
    return torch.randn(V, generator=g) * 2.5


def plan(prefills=(), decode=None, sampling=(), freed=()) -> PartitionPlan:
    return PartitionPlan(prefills=list(prefills), decode=decode, sampling=list(sampling), freed_req_ids=list(freed))


def run_step(sampler, part, seq_of_row):
    rows = step_rows(part, sampler.wants_prompt_logprobs)
    logits = torch.stack([fake_logits(seq_of_row(i)) for i in range(len(rows.req_ids))])
    sampler.begin(part)
    return sampler.run(rows, logits, LocalComm())


def generate_k0(s, num_tokens):
    sampler, seq = RankSampler(0, V), list(PROMPT)
    first = plan([PrefillChunk(1, 0, i32(PROMPT), True)], sampling=[s])
    tokens, _ = run_step(sampler, first, lambda i: seq)
    seq.append(int(tokens[0]))
    while len(seq) < len(PROMPT) + num_tokens:
        L = len(seq) - 1
        d = DecodeBatch(i32([1]), i32([L]), i8([1]), i32([seq[-1]]))
        tokens, _ = run_step(sampler, plan(decode=d), lambda i: seq)
        seq.append(int(tokens[0]))
    return seq[len(PROMPT) :]


def generate_k7(s, num_tokens, reference, error_at):
    """Verify tiles whose drafts are the reference with a planted error at index error_at
    (7: never wrong), so each verify accepts error_at + 1 tokens."""
    sampler, seq = RankSampler(0, V), list(PROMPT)
    first = plan([PrefillChunk(1, 0, i32(PROMPT), True)], sampling=[s])
    tokens, _ = run_step(sampler, first, lambda i: seq)
    seq.append(int(tokens[0]))
    while len(seq) < len(PROMPT) + num_tokens:
        L = len(seq) - 1
        out = len(seq) - len(PROMPT)
        drafts = np.array((reference + [0] * 8)[out : out + 7])
        if error_at < 7:
            drafts[error_at] = (drafts[error_at] + 1) % V
        tile = [seq[-1], *drafts.tolist()]
        d = DecodeBatch(i32([1]), i32([L]), i8([8]), i32(tile))
        preds, _ = run_step(sampler, plan(decode=d), lambda i, seq=seq, tile=tile: seq + tile[1 : i + 1])
        a = int(accept_chain(drafts[None], preds.numpy()[None])[0])
        seq += drafts[: a - 1].tolist() + [int(preds[a - 1])]
    return seq[len(PROMPT) : len(PROMPT) + num_tokens]


def test_verify_tiles_emit_exactly_the_k0_tokens_with_filters_and_penalties():
    """With top-k/top-p/min-p and all three penalties on, a K=7 run (full, partial and first-
    draft-wrong acceptance) must emit the K=0 tokens for the same seed."""
    s = spec(1)
    reference = generate_k0(s, 40)
    assert len(set(reference)) > 10  # it really samples
    for error_at in (7, 3, 0):
        assert generate_k7(s, 40, reference, error_at) == reference, error_at


def test_another_seed_or_choice_gives_another_sequence_and_greedy_ignores_the_seed():
    """Seeds and choice indices must change a sampled sequence; at temperature 0 they must not."""
    a = generate_k0(spec(1), 20)
    assert generate_k0(spec(1, seed=99), 20) != a and generate_k0(spec(1, choice=1), 20) != a
    g = generate_k0(spec(1, temperature=0.0), 20)
    assert generate_k0(spec(1, temperature=0.0, seed=5), 20) == g


def test_prompt_and_sampled_logprob_entries_name_positions_and_tokens():
    """A prompt-logprob request must get entries for positions 1..P-1 (the prompt tokens) and
    P (the sampled token), each equal to log_softmax of its row at that token."""
    sampler = RankSampler(0, V)
    part = plan([PrefillChunk(1, 0, i32(PROMPT), True)], sampling=[spec(1, num_logprobs=2, num_prompt_logprobs=1)])
    rows = step_rows(part, lambda r: True)
    logits = torch.stack([fake_logits(PROMPT[: i + 1]) for i in range(len(PROMPT))])
    sampler.begin(part)
    tokens, lp = sampler.run(rows, logits, LocalComm())
    assert lp.positions.tolist() == [1, 2, 3, 4]
    assert lp.token_ids.tolist() == PROMPT[1:] + [int(tokens[0])]
    ref = log_softmax_sharded(logits, LocalComm())
    at = torch.tensor(lp.token_ids.tolist(), dtype=torch.long)
    assert np.array_equal(lp.values, ref[torch.arange(4), at].numpy())
    assert lp.top_ids.shape == (4, 2)


def test_tp_slices_give_the_same_tokens_and_logprobs():
    """Two ranks each holding half the vocabulary must answer the tp1 tokens and logprobs."""
    part = plan(
        [PrefillChunk(1, 0, i32(PROMPT), True)],
        decode=DecodeBatch(i32([2]), i32([10]), i8([3]), i32([4, 8, 8])),
        sampling=[
            spec(1, num_logprobs=3, num_prompt_logprobs=0),
            spec(2, num_logprobs=0, prompt_len=6, output_token_ids=i32([8, 8, 8, 1])),
        ],
    )
    rows = step_rows(part, lambda r: r == 1)
    logits = torch.randn(len(rows.req_ids), V, generator=torch.Generator().manual_seed(0)) * 3

    def per_rank(sl, comm, off):
        sampler = RankSampler(off, V // comm.shard.tp_size)
        sampler.begin(part)
        return sampler.run(rows, sl, comm)

    ((tok1, lp1),) = run_sharded(per_rank, logits, 1)
    for tok, lp in run_sharded(per_rank, logits, 2):
        assert torch.equal(tok, tok1)
        for name in ("req_ids", "positions", "token_ids", "values", "top_ids", "top_values"):
            assert np.array_equal(getattr(lp, name), getattr(lp1, name)), name


def test_a_readmitted_request_resumes_with_the_tokens_it_would_have_sampled():
    """Preemption by recompute: re-prefilling prompt + m outputs (the spec carrying those
    outputs for the penalties) must sample output m+1 exactly, as the decode step did."""
    s = spec(1, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    out = generate_k0(s, 12)
    for m in range(1, 12):
        again = spec(7, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, output_token_ids=i32(out[:m]))
        seq = PROMPT + out[:m]
        part = plan([PrefillChunk(7, 0, i32(seq), True)], sampling=[again])
        tokens, _ = run_step(RankSampler(0, V), part, lambda i, seq=seq: seq)
        assert int(tokens[0]) == out[m], m


def test_drafts_drawn_with_the_shared_noise_match_the_target_sample_when_the_logits_agree():
    """A drafter whose logits equal the target's must propose exactly the verify rows' samples
    (same noise coordinates); greedy requests keep the argmax."""
    from workers.sampling.draft_pick import DraftPicker
    from workers.sampling.rows import SamplingRows
    from workers.sampling.sampler import sample

    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(5)) * 2
    rows = SamplingRows.make(
        6, temperature=[0.8, 1.0, 0.0, 1.3, 0.5, 1.0], top_k=[0, 5, 0, 0, 0, 0], seed=torch.arange(6) + 40
    )
    anchor = torch.tensor([10, 20, 30, 40, 50, 60])
    pick = DraftPicker(rows, anchor, LocalComm(), 0)
    for s in range(3):
        target = sample(
            logits,
            SamplingRows.make(
                6, temperature=rows.temperature, top_k=rows.top_k, seed=rows.seed, position=anchor + 1 + s
            ),
            LocalComm(),
            0,
        )
        assert torch.equal(pick(logits, s), target)
