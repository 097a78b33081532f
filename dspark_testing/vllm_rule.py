"""vLLM's published rule for dynamic speculation lengths, as a VerifyPolicy (a baseline for
the policy simulator and benchmarks, not a server option):

- a cost table profiled once at start-up (median of dummy steps per batch shape, forced
  monotone), never refined;
- each step, every draft slot ranked by its survival (cumulative product of its
  confidences), and the global top B slots verified, B the argmax of expected tokens over
  the table's step time (one staircase over all requests);
- confidences scaled per position by an EMA (0.8 on the old value) of realised over
  predicted acceptance; the drafter always runs.

vLLM does not keep sampled tokens identical across verify lengths; here tokens never
depend on the policy, so only the speed is compared.
"""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.adaptive import solve
from dspark_loop.engine.verify.budget import survival
from dspark_loop.engine.verify.cost_table import CostTable, load_of
from dspark_loop.engine.verify.policy import StepFeedback, VerifyChoice

EMA = 0.8  # weight of the old value in the acceptance scale


class VllmRule:
    per_step = True
    learns = True

    def __init__(self, table: CostTable):
        self.table = table  # its prior is the start-up profile; nothing is observed into it
        self.scale = np.ones(DSPARK_K)  # [K] realised over predicted acceptance, per position

    def choose(self, conf, cap, partition, sampled=None, constrained=None, prompt_rows=None) -> VerifyChoice:
        cap = np.asarray(cap, np.int32)
        partition = np.asarray(partition, np.int64)
        conf = np.nan_to_num(np.asarray(conf, np.float64), nan=0.5)
        raw = survival(conf, cap)  # [R, K]
        surv = np.minimum.accumulate(np.minimum(raw * self.scale[None, :], 1.0), axis=1)
        n = np.bincount(partition, minlength=int(partition.max()) + 1 if len(cap) else 1)
        costs = np.stack([self.table.costs(int(b), 0) for b in load_of(n)])
        lens = solve(surv, cap, partition, n, np.zeros(len(n)), costs, 1).verify_len  # prompts unseen
        return VerifyChoice(lens, np.ones(len(cap), bool), raw)

    def drafts_prompt(self, cls: int) -> bool:
        return True

    def observe(self, feedback: StepFeedback) -> None:
        if feedback.windows is None:
            return
        raw, verify_len, accepted, _ = feedback.windows
        j = np.arange(DSPARK_K)[None, :]
        verified = j < verify_len[:, None]
        predicted = np.where(verified, raw, 0.0).sum(0)
        realised = (verified & (j < accepted[:, None])).sum(0)
        seen = predicted > 0
        self.scale[seen] = EMA * self.scale[seen] + (1 - EMA) * realised[seen] / predicted[seen]

    def stats(self) -> dict:
        return {"name": type(self).__name__, "scale": self.scale.tolist()}
