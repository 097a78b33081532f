"""SamplingRows: one step's sampling parameters, one entry per logit row.

A request's parameters arrive once (at admission); each step the rank expands them to its
logit rows (a 1-row step, a sampling prefill chunk's last row, or the 8 rows of a verify
tile). `position` is the absolute position of the token the row SAMPLES (the row's input
position + 1): the noise coordinate, the same for a K=0 step and the verify row that
predicts that token, and for the drafter's proposal of it.

One tensor per knob of dspark_loop.contract.sampling_knobs.SamplingKnobs (neutral values
switch a processor off; all neutral is greedy), plus the noise's coordinates: seed, choice
and position. NOTE: a knob added to SamplingKnobs without its tensor here is refused at
import (the assertion below), so the rank can never drop one silently.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import msgspec
import torch

from dspark_loop.contract.sampling_knobs import GREEDY_BELOW, KNOB_NAMES, SamplingKnobs


@dataclass
class SamplingRows:
    temperature: torch.Tensor  # [L] fp32
    top_k: torch.Tensor  # [L] int64, 0 = off
    top_p: torch.Tensor  # [L] fp32, 1 = off
    min_p: torch.Tensor  # [L] fp32, 0 = off
    presence_penalty: torch.Tensor  # [L] fp32
    frequency_penalty: torch.Tensor  # [L] fp32
    repetition_penalty: torch.Tensor  # [L] fp32
    seed: torch.Tensor  # [L] int64 (any 64-bit value)
    choice: torch.Tensor  # [L] int64 (n > 1: the choice's index)
    position: torch.Tensor  # [L] int64, absolute position of the sampled token

    NEUTRAL = {**msgspec.structs.asdict(SamplingKnobs()), "seed": 0, "choice": 0, "position": 0}

    @classmethod
    def make(cls, num_rows: int, device: str | torch.device = "cpu", **values) -> SamplingRows:
        """Neutral rows (greedy, no filter, no penalty, seed 0) with `values` overriding
        (each a scalar or a length-L sequence)."""
        neutral = cls.NEUTRAL
        unknown = set(values) - set(neutral)
        if unknown:
            raise TypeError(f"unknown sampling fields {sorted(unknown)}")
        out = {}
        for name, default in neutral.items():
            dtype = torch.int64 if isinstance(default, int) else torch.float32
            v = values.get(name, default)
            t = torch.as_tensor(v, dtype=dtype, device=device)
            out[name] = t.expand(num_rows).clone() if t.dim() == 0 else t
            if out[name].shape != (num_rows,):
                raise ValueError(f"{name}: expected {num_rows} values, got {tuple(out[name].shape)}")
        return cls(**out)

    def select(self, rows: torch.Tensor) -> SamplingRows:
        """The rows at indices rows [m] (long)."""
        return SamplingRows(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    @property
    def num_rows(self) -> int:
        return int(self.temperature.shape[0])

    @property
    def is_random(self) -> torch.Tensor:  # [L] bool: Gumbel rows (the rest are greedy)
        return self.temperature >= GREEDY_BELOW

    @property
    def has_penalty(self) -> torch.Tensor:  # [L] bool
        return (self.presence_penalty != 0) | (self.frequency_penalty != 0) | (self.repetition_penalty != 1)


assert {f.name for f in fields(SamplingRows)} == set(SamplingRows.NEUTRAL), "one tensor per SamplingKnobs field"
assert set(KNOB_NAMES) <= set(SamplingRows.NEUTRAL)
