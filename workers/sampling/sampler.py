"""One token per logit row: greedy or Gumbel-max, over vocab-sharded logits.

    greedy row  (T < 1e-5)  argmax(penalised logits)                  == the greedy path
    random row              argmax over kept ids of (filtered x / T + G(seed, choice, pos, id))

Gumbel-max: with G_i iid Gumbel(0, 1), argmax_i(x_i + G_i) is distributed as softmax(x), so
the token is an exact sample of the filtered distribution, and a pure function of the
row's logits and noise coordinates. Each rank takes the max over its vocab slice and the
group reduces with the lowest-id tie rule (Comm.argmax_tp), exactly like greedy: the full
logits are never gathered.
"""

from __future__ import annotations

import torch

from workers.comm import Comm
from workers.sampling.gumbel_max import perturbed
from workers.sampling.processors import PenaltyRows, apply_penalties, filter_logits
from workers.sampling.rows import SamplingRows


def sample(
    logits: torch.Tensor, rows: SamplingRows, comm: Comm, vocab_offset: int, penalties: PenaltyRows | None = None
) -> torch.Tensor:
    """logits [L, V/tp] fp32 (constraint masks already at -inf) -> tokens [L] int64 (global ids).

    penalties: the rows with a penalty and their counts (None: no row has one).
    A collective: every rank of the TP group calls it with its slice of the same rows."""
    local_vocab = logits.shape[1]
    vocab_size = local_vocab * comm.shard.tp_size
    if penalties is not None:
        logits = apply_penalties(logits, rows, penalties)
    random = rows.is_random  # [L]
    tokens = torch.zeros(rows.num_rows, dtype=torch.int64, device=logits.device)
    greedy, rand = (~random).nonzero()[:, 0], random.nonzero()[:, 0]
    if len(greedy):
        tokens[greedy] = comm.argmax_tp(logits[greedy], vocab_offset)
    if len(rand):
        sub = rows.select(rand)
        x = filter_logits(logits[rand], sub, vocab_size, comm)  # [m, V/tp]
        # NOTE: x + G only where it can win (gumbel_max.py): the same argmax, a fraction of the noise
        tokens[rand] = comm.argmax_tp(perturbed(x, sub.seed, sub.choice, sub.position, vocab_offset), vocab_offset)
    return tokens
