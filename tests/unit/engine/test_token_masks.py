"""The scheduler asks a constrained request's constraint for one mask per sampled row and
ships it packed in the plan; at K=7 a constrained request verifies its drafts under masks
advanced along them; a failing constraint ends only its own request."""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import as_i8, pack_mask, unpack_mask
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.engine.factories import (
    allowed_tokens,
    make_mesh,
    make_requests,
    make_scheduler,
    run_step,
    run_to_completion,
)

VOCAB = tiny_tokenizer().get_vocab_size()


class RecordingConstraint:
    """Allows the two ordinary tokens after the number of outputs so far; records each ask."""

    def __init__(self, fail_at: int | None = None):
        self.asked: list[list[int]] = []
        self.asked_drafts: list[list[int]] = []
        self.fail_at = fail_at

    def allowed(self, n: int) -> np.ndarray:
        mask = np.zeros(VOCAB, dtype=bool)
        ok = allowed_tokens()
        mask[[ok[n % len(ok)], ok[(n + 1) % len(ok)]]] = True
        return mask

    def allowed_token_mask(self, output_ids: list[int]) -> np.ndarray:
        self.asked.append(list(output_ids))
        if self.fail_at is not None and len(output_ids) >= self.fail_at:
            raise ValueError("grammar broke")
        return self.allowed(len(output_ids))

    def row_masks(self, output_ids: list[int], drafts: list[int]) -> list[bytes]:
        """Row i follows output_ids + drafts[:i]; stops after the first refused draft."""
        self.asked_drafts.append(list(drafts))
        masks = [pack_mask(self.allowed_token_mask(output_ids))]
        for i, d in enumerate(drafts):
            if not self.allowed(len(output_ids) + i)[d]:
                break
            masks.append(pack_mask(self.allowed(len(output_ids) + i + 1)))
        return masks


def test_pack_and_unpack_round_trip_any_vocab_slice():
    """Packed bits must unpack to the same allowed ids for any [start, stop) slice, with
    ids past the mask refused."""
    rng = np.random.default_rng(0)
    allowed = rng.random(1000) < 0.3
    bits = pack_mask(allowed)
    assert len(bits) == 125
    assert np.array_equal(unpack_mask(bits, 0, 1000), allowed)
    assert np.array_equal(unpack_mask(bits, 500, 1000), allowed[500:])
    assert not unpack_mask(bits, 990, 1010)[10:].any()


def test_each_sampled_row_of_a_constrained_request_carries_its_mask():
    """The finishing prefill chunk and every decode row of a constrained request must carry
    the constraint's mask for the outputs so far; chunks that do not sample and
    unconstrained requests carry none."""
    sched = make_scheduler(max_num_batched_tokens=8)  # 12-token prompt: two chunks
    free, bound = make_requests(sched, 2, prompt_len=12, max_tokens=3)
    c = RecordingConstraint()
    bound.constraint = c
    sched.add(free)
    sched.add(bound)
    mesh = make_mesh(sched)
    seen = []
    while sched.has_work:
        step, _ = run_step(sched, mesh)
        for m in step.plan.partitions[0].token_masks:
            assert m.req_id == bound.req_id
            seen.append(unpack_mask(m.bits, 0, VOCAB))
    assert c.asked == [[], bound.output_ids[:1], bound.output_ids[:2]]
    assert [list(np.flatnonzero(s)) for s in seen] == [list(np.flatnonzero(c.allowed(n))) for n in range(3)]


def test_constrained_requests_verify_drafts_under_masks_that_follow_the_drafts():
    """With K=7 a constrained request with drafts must verify 8 rows like its unconstrained
    neighbour; its rows must carry the masks of the grammar advanced along the drafts (row i
    after drafts[:i]) up to and including the row of the first draft the grammar refuses."""
    sched = make_scheduler(spec_k=7)
    free, bound = make_requests(sched, 2, prompt_len=4, max_tokens=20)
    c = RecordingConstraint()
    bound.constraint = c
    sched.add(free)
    sched.add(bound)
    mesh = make_mesh(sched)
    run_step(sched, mesh)  # prefill both
    ok = allowed_tokens()
    n = len(bound.output_ids)
    # drafts 0..2 follow the constraint (allowed(n + i) holds ok[(n+i) % len] and the next);
    # draft 3 is refused
    drafts = [ok[(n + i) % len(ok)] for i in range(3)] + [tiny_tokenizer().token_to_id("</think>")] * 4
    for r in (free, bound):
        sched.partitions[r.partition].set_drafts(r, np.array(drafts, np.int32))
    step, _ = run_step(sched, mesh)
    pplan = step.plan.partitions[0]
    rows = dict(zip(np.frombuffer(pplan.decode.req_ids, np.int32).tolist(), as_i8(pplan.decode.num_rows).tolist()))
    assert rows == {free.req_id: 8, bound.req_id: 8}
    assert c.asked_drafts[-1] == drafts
    assert [(m.req_id, m.row) for m in pplan.token_masks] == [(bound.req_id, i) for i in range(4)]
    for m in pplan.token_masks:
        assert np.array_equal(unpack_mask(m.bits, 0, VOCAB), c.allowed(n + m.row))


def test_a_failing_constraint_ends_only_its_request_with_an_error():
    """A constraint that raises must finish its request with finish_reason error (pages
    freed) while the other request runs to its normal end."""
    sched = make_scheduler()
    free, bound = make_requests(sched, 2, prompt_len=6, max_tokens=5)
    bound.constraint = RecordingConstraint(fail_at=2)
    sched.add(free)
    sched.add(bound)
    got = run_to_completion(sched, make_mesh(sched))
    last = got[bound.request_id][-1]
    assert last.finished and last.finish_reason == "error" and "grammar broke" in last.error
    assert len(bound.output_ids) == 2
    assert got[free.request_id][-1].finish_reason == "length"
    assert sum(len(o.new_token_ids) for o in got[free.request_id]) == 5
    sched.check_integrity()
    assert all(p.cache.num_free() == [pool.num_blocks for pool in p.cache.pools] for p in sched.partitions)


class ForcingConstraint(RecordingConstraint):
    """Also replaces every draft by the first allowed token of its row (a forced token)."""

    def row_masks(self, output_ids, drafts):
        for i in range(len(drafts)):
            drafts[i] = int(np.flatnonzero(self.allowed(len(output_ids) + i))[0])
        return super().row_masks(output_ids, drafts)


def test_tokens_the_grammar_forces_replace_the_drafts_in_the_verify_tile():
    """Drafts a constraint rewrote (tokens its grammar forces) must be the ones the plan's
    verify tile carries, and the ones acceptance is checked against."""
    sched = make_scheduler(spec_k=7)
    (bound,) = make_requests(sched, 1, prompt_len=4, max_tokens=20)
    c = ForcingConstraint()
    bound.constraint = c
    sched.add(bound)
    mesh = make_mesh(sched)
    run_step(sched, mesh)  # prefill
    sched.partitions[bound.partition].set_drafts(bound, np.full(7, tiny_tokenizer().token_to_id("</think>"), np.int32))
    n = len(bound.output_ids)
    step, _ = run_step(sched, mesh)
    tile = np.frombuffer(step.plan.partitions[0].decode.token_ids, np.int32)
    assert tile[1:].tolist() == [int(np.flatnonzero(c.allowed(n + i))[0]) for i in range(7)]
    assert step.partitions[0].verify_drafts[0].tolist() == tile[1:].tolist()


class PartlyForcing(RecordingConstraint):
    """Like RecordingConstraint, but at output index n with n % 3 == 1 it allows one token
    only (a forced row: the draft there is repaired to it, as the real grammar does), and
    reports its forced rows."""

    def allowed(self, n: int) -> np.ndarray:
        if n % 3 != 1:
            return super().allowed(n)
        mask = np.zeros(VOCAB, dtype=bool)
        mask[allowed_tokens()[(n + 1) % len(allowed_tokens())]] = True
        return mask

    def row_masks(self, output_ids: list[int], drafts: list[int]) -> list[bytes]:
        self.asked_drafts.append(list(drafts))
        self.forced_rows = []
        n, masks = len(output_ids), []
        for i in range(len(drafts) + 1):
            allowed = self.allowed(n + i)
            masks.append(pack_mask(allowed))
            if i == len(drafts):
                break
            if allowed.sum() == 1:
                self.forced_rows.append(i)
                drafts[i] = int(np.flatnonzero(allowed)[0])
            if not allowed[drafts[i]]:
                break
        return masks


def test_adaptive_verification_chooses_a_constrained_window_after_its_grammar_walked_it():
    """Before the verify policy chooses, a constrained request's whole window must be walked
    by its grammar, once: the policy must see its cap cut to the drafts the grammar allows
    and confidence 1.0 at the rows the grammar forces (0 past the cap), the tile must carry
    the repaired drafts, and the plan the first rows' masks of that walk (no second walk)."""
    from dspark_loop.engine.verify.policy import VerifyChoice
    from tests.unit.engine.random_policy import RandomPolicy

    class WholeWindows(RandomPolicy):  # verifies every draft it may
        def choose(self, conf, cap, partition, sampled=None, constrained=None, prompt_rows=None):
            choice = VerifyChoice(cap.copy(), np.ones(len(cap), bool))
            self.calls.append((conf.copy(), cap.copy(), partition.copy(), choice))
            return choice

    policy = WholeWindows(seed=0)
    sched = make_scheduler(spec_k=7, policy=policy)
    (bound,) = make_requests(sched, 1, prompt_len=4, max_tokens=20)
    c = PartlyForcing()
    bound.constraint = c
    sched.add(bound)
    mesh = make_mesh(sched)
    run_step(sched, mesh)  # the prefill
    ok = allowed_tokens()
    n = len(bound.output_ids)
    # every draft right where the grammar allows two tokens, wrong where it forces one
    # (repaired), until draft 5, which it refuses
    drafts = [ok[(n + i) % len(ok)] if (n + i) % 3 != 1 else ok[0] for i in range(5)]
    drafts += [tiny_tokenizer().token_to_id("</think>")] * 2
    sched.partitions[0].set_drafts(bound, np.array(drafts, np.int32), np.full(7, 0.5, np.float32))
    asked = len(c.asked_drafts)
    step, _ = run_step(sched, mesh)
    assert len(c.asked_drafts) == asked + 1  # one walk, over the whole window
    conf, cap, _, choice = policy.calls[-1]
    assert cap.tolist() == [5]
    forced = [i for i in range(5) if (n + i) % 3 == 1]
    assert forced and conf[0].tolist() == [1.0 if i in forced else 0.5 for i in range(5)] + [0.0, 0.0]
    pplan = step.plan.partitions[0]
    rows = int(as_i8(pplan.decode.num_rows)[0])
    assert rows == 6  # the five drafts the grammar allows
    tile = np.frombuffer(pplan.decode.token_ids, np.int32).tolist()
    repaired = [ok[(n + i + 1) % len(ok)] if i in forced else d for i, d in enumerate(drafts)]
    assert tile[1:] == repaired[: rows - 1]
    assert [(m.req_id, m.row) for m in pplan.token_masks] == [(bound.req_id, i) for i in range(rows)]
    for m in pplan.token_masks:
        assert np.array_equal(unpack_mask(m.bits, 0, VOCAB), c.allowed(n + m.row))
