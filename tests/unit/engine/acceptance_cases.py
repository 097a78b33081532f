"""The shared table of linear-chain acceptance cases; every layer that applies acceptance
(host acceptance, the engine loop at K=7, integration tests) reuses it.

Drafts are 7 tokens; predictions are the target's 8 (one per verify row). The chain keeps
predictions[0..m] where m is the number of leading drafts equal to their prediction.
Finish truncation then cuts the accepted list at EOS / max_tokens (EOS_ID below).
A case with verify_len l < 7 is an adaptive short window: only rows 0..l are sent, so only
drafts 0..l-1 and predictions 0..l exist (the rest of the tuples is ignored).
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
    verify_len: int = 7  # drafts verified (1 + verify_len rows)


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
    *[
        AcceptanceCase(
            f"short window of {n}: all match, the bonus is row {n}'s", D, D + (99,), n + 1, D[: n + 1], verify_len=n
        )
        for n in range(1, 7)
    ],
    AcceptanceCase("window of 0: one row, the target's own token", D, D + (99,), 1, (10,), verify_len=0),
    AcceptanceCase(
        "short window: a mismatch inside it ends the chain",
        D,
        (10, 11, 50) + D[3:] + (99,),
        3,
        (10, 11, 50),
        verify_len=4,
    ),
    AcceptanceCase(
        "short window: a mismatch past it is never seen",
        D,
        (10, 11, 12, 60) + D[4:] + (99,),
        4,
        (10, 11, 12, 60),
        verify_len=3,
    ),
    AcceptanceCase(
        "short window: EOS at its bonus row ends the request",
        D,
        (10, 11, EOS_ID) + D[3:] + (99,),
        3,
        (10, 11, EOS_ID),
        "stop",
        verify_len=2,
    ),
]
