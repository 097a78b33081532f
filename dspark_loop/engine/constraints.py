"""Constraints: the output grammars' part of a step, for the Scheduler.

Per step, in order: walk_windows() (K=7, lockstep: constrained verify windows walked by
their grammars before the verify policy chooses), masks() (each partition's rows, inside
partition_step before the tile is built), late_masks() (the masks that follow a sent plan).
Between steps, needs_lockstep() tells the loop when the next plan must wait for the step in
flight. A constraint that fails ends only its request: every call returns such requests with
their messages, and the Scheduler fails them (engine/token_masks.py has the walks).
"""

from __future__ import annotations

import numpy as np

from dspark_loop.contract.protocol import TokenMask
from dspark_loop.engine.partition import Partition
from dspark_loop.engine.request import Request, Status
from dspark_loop.engine.scheduled_step import PartitionStep, ScheduledStep
from dspark_loop.engine.token_masks import fill_masks, token_masks, walk

Failed = list[tuple[Request, str]]  # requests whose constraint failed, with why


class Constraints:
    def __init__(self, spec_k: int) -> None:
        self.spec_k = spec_k
        self.num_live = 0  # live requests with a token constraint
        self._defer = False  # this step leaves one-row masks to late_masks()
        # this step's verify windows walked by their grammars before the verify policy
        # chose (req_id -> row masks): walk_windows, read by masks
        self._walked: dict[int, list[bytes]] = {}

    def begin_step(self, defer: bool) -> None:
        """A new plan: defer one-row requests' masks to late_masks() or not."""
        self._defer = defer
        self._walked = {}

    def walk_windows(self, partitions: list[Partition], reqs: list[Request], cap: np.ndarray, conf: np.ndarray) -> None:
        """Constrained requests' whole windows, walked by their grammars before the policy
        chooses (their forced tokens repair the drafts in the draft table): cap [R] becomes
        the drafts the grammar allows (a refused draft's row can never match: nothing past
        it is accepted), conf [R, K] 1.0 where a row allows one token (its draft, repaired,
        is accepted whenever the rows before it were). The row masks are kept for masks().
        A constraint that fails is left to masks() (cap 0: the request runs one row, its
        constraint fails again there and ends it).
        NOTE: lockstep only: planned ahead, a constrained request never verifies."""
        idx = [j for j, r in enumerate(reqs) if r.constraint is not None and cap[j] > 0]
        if not idx:
            return
        bound = [reqs[j] for j in idx]
        tables = [partitions[r.partition].drafts for r in bound]  # [leases, K] each
        assert all(t is not None for t in tables)  # K=7 partitions hold a draft table
        windows = [t[r.lease, : int(cap[j])].tolist() for t, j, r in zip(tables, idx, bound)]  # type: ignore[index]
        failed: Failed = []
        for j, req, table, window, rows in zip(idx, bound, tables, windows, walk(bound, windows, failed)):
            if rows is None or table is None:
                cap[j] = 0
                conf[j] = 0.0
                continue
            table[req.lease, : len(window)] = window  # the forced tokens, for the tile
            self._walked[req.req_id] = rows
            valid = len(rows) - 1  # rows 0..valid; draft `valid` (if any) is refused
            cap[j] = min(int(cap[j]), valid)
            conf[j, valid:] = 0.0
            forced = [i for i in getattr(req.constraint, "forced_rows", ()) if i < valid]
            conf[j, forced] = 1.0

    def masks(self, failed: Failed, part: Partition, pstep: PartitionStep) -> list[TokenMask]:
        """Inside partition_step, before the tile is built (a verify's forced tokens replace
        its drafts): the allowed-token masks of constrained requests' rows; the constraints
        that failed go to `failed` (their requests end once the plan is built)."""
        masks, bad, pstep.late_masked = token_masks(
            pstep, part.drafts if self.spec_k else None, self._defer, self._walked
        )
        failed.extend(bad)
        return masks

    def late_masks(self, step: ScheduledStep, failed: Failed) -> list[list[TokenMask]]:
        """The masks the step's plan left out (masks_follow), per partition: call it once the
        plan is sent and every earlier step is applied (each row follows its request's
        outputs). A request that ended meanwhile gets none (its row's token is never read);
        one whose constraint fails goes to `failed` (its row still runs, unread)."""
        per_part = []
        for pstep in step.partitions:
            live = [r for r in pstep.late_masked if r.status == Status.RUNNING]
            masks, bad = fill_masks(live) if live else ([], [])
            failed.extend(bad)
            per_part.append(masks)
        return per_part

    def needs_lockstep(self, flying: ScheduledStep) -> bool:
        """Whether the next step must wait for the unanswered step `flying`: a constrained
        request still running drafts in it, so its next step verifies drafts the grammar
        must walk (and repair) before the tile is built."""
        if not self.num_live or not self.spec_k:
            return False
        for pstep in flying.partitions:
            for req, _, sample in pstep.prefills:
                if req.constraint is not None and sample and req.draft_next and req.status == Status.RUNNING:
                    return True
            dn = pstep.draft_next  # [R] or None: every decode request drafts
            for j, req in enumerate(pstep.decode_reqs):
                if req.constraint is not None and (dn is None or dn[j]) and req.status == Status.RUNNING:
                    return True
        return False
