"""step_start: the steady state's starts (one comprehension over a partition whose running
requests all decoded in the unanswered step) are plan_position()'s, request by request."""

import random

import numpy as np
import pytest

from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.engine.request import make_request
from dspark_loop.engine.scheduled_step import PartitionStep
from dspark_loop.engine.step_start import _flights, _steady_starts, plan_position

MAX_MODEL_LEN = 200


def decoding(i: int, rng: random.Random):
    """A running request near the edges the rules look at: its length limit, the position
    ceiling (every window ends within 30 positions of it)."""
    params = SamplingParams(max_tokens=rng.randint(1, 40), ignore_eos=True)
    req = make_request(GenerateRequest(f"r{i}", list(range(3, 3 + rng.randint(170, 195))), params), MAX_MODEL_LEN, (1,))
    req.req_id = i
    req.output_ids = [5] * rng.randint(0, req.length_at - 1)
    req.num_computed = req.num_tokens - 1
    req.plan_pos = req.num_computed
    return req


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("spec_k", [0, 7])
def test_steady_starts_are_plan_positions_request_by_request(seed, spec_k):
    rng = random.Random(seed)
    reqs = [decoding(i, rng) for i in range(rng.randint(1, 40))]
    reqs[0].output_ids = [5] * (reqs[0].length_at - 1)  # the unanswered step surely ends it
    reqs[0].num_computed = reqs[0].num_tokens - 1
    fly = PartitionStep(decode_reqs=reqs)
    fly.decode_rows = np.array([rng.choice([1, 1 + rng.randint(1, 7)]) if spec_k else 1 for _ in reqs], np.int8)
    fly.decode_req_ids = np.array([r.req_id for r in reqs], np.int32)
    if spec_k and rng.random() < 0.5:
        fly.draft_next = np.array([rng.random() < 0.7 for _ in reqs], bool)
    flights = _flights(fly)
    want = [plan_position(r, flights[r.req_id], spec_k, MAX_MODEL_LEN, True) for r in reqs]
    assert _steady_starts(reqs, fly, spec_k, MAX_MODEL_LEN) == want
    assert want[0][0] == -1
