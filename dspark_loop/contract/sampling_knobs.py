"""SamplingKnobs: the one home of the knobs that shape a request's next-token distribution.

    API body (schemas.GenerationFields, optional, vLLM's names)
      --checked, defaults filled (api/generation/sampling_ranges.py)-->  SamplingKnobs
    engine      SamplingParams.knobs
    wire        SamplingSpec.knobs (sent once, at admission)
    ranks       SamplingRows: one tensor per knob over the step's logit rows
                (workers/sampling/rows.py, built from the knobs' own field list)

A new knob is a field here (with its neutral value), its range rule in sampling_ranges.py,
its request field in GenerationFields, and the rank-side processor that applies it.
Neutral values switch a knob off; all neutral is plain greedy.
"""

from __future__ import annotations

import msgspec

GREEDY_BELOW = 1e-5  # a temperature below this is greedy (vLLM's _SAMPLING_EPS: x/T would overflow)


class SamplingKnobs(msgspec.Struct, array_like=True, frozen=True, kw_only=True):
    temperature: float = 0.0  # < GREEDY_BELOW: greedy
    top_p: float = 1.0  # 1: off
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1: off

    @property
    def is_random(self) -> bool:
        """Gumbel-max sampling (else the argmax)."""
        return self.temperature >= GREEDY_BELOW

    @property
    def has_penalty(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


GREEDY = SamplingKnobs()
KNOB_NAMES: tuple[str, ...] = SamplingKnobs.__struct_fields__
