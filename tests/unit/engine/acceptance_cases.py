"""The shared table of linear-chain acceptance cases; every layer that applies acceptance
(host acceptance, the engine loop at K=7, integration tests) reuses it.

Drafts are 7 tokens; predictions are the target's 8 (one per verify row). The chain keeps
predictions[0..m] where m is the number of leading drafts equal to their prediction.
Finish truncation then cuts the accepted list at EOS / max_tokens (EOS_ID below).
"""

from __future__ import annotations

from dataclasses import dataclass

EOS_ID = 1
D = (10, 11, 12, 13, 14, 15, 16)  # the drafts every case starts from


@dataclass(frozen=True)
class AcceptanceCase:
    name: str
    drafts: tuple[int, ...]
    predictions: tuple[int, ...]
    num_accepted: int  # 1..8
    kept: tuple[int, ...]  # tokens appended after finish truncation
    finish_reason: str | None = None
    num_output_before: int = 0
    max_tokens: int = 1000


def _mismatch_at(i: int) -> AcceptanceCase:
    # drafts 0..i-1 match, prediction i differs from draft i
    preds = D[:i] + (90 + i,) + D[i + 1 :] + (99,)
    return AcceptanceCase(f"mismatch at draft {i}", D, preds, i + 1, D[:i] + (90 + i,))


CASES = [
    AcceptanceCase("perfect match: 7 drafts + bonus", D, D + (99,), 8, D + (99,)),
    AcceptanceCase("first row mismatch: only the target's token", D, (50,) + D[1:] + (99,), 1, (50,)),
    *[_mismatch_at(i) for i in range(7)],
    AcceptanceCase(
        "a later lucky match after a mismatch does not count", D, (10, 77, 12, 13, 14, 15, 16, 99), 2, (10, 77)
    ),
    AcceptanceCase(
        "EOS inside the accepted list ends it there",
        (10, 11, EOS_ID, 13, 14, 15, 16),
        (10, 11, EOS_ID, 13, 14, 15, 16, 99),
        8,
        (10, 11, EOS_ID),
        "stop",
    ),
    AcceptanceCase(
        "EOS as the target's own token at the mismatch",
        D,
        (10, 11, EOS_ID, 13, 14, 15, 16, 99),
        3,
        (10, 11, EOS_ID),
        "stop",
    ),
    AcceptanceCase(
        "max_tokens inside the accepted list",
        D,
        D + (99,),
        8,
        (10, 11, 12),
        "length",
        num_output_before=5,
        max_tokens=8,
    ),
    AcceptanceCase(
        "max_tokens exactly at the bonus token",
        D,
        D + (99,),
        8,
        D + (99,),
        "length",
        num_output_before=2,
        max_tokens=10,
    ),
]
