"""Hand-built StepPlans for the mesh tests: one prefill then decode rows per group."""

from dspark_loop.contract.protocol import DecodeBatch, PartitionPlan, PrefillChunk, StepPlan, i8, i32

PROMPT_LEN = 5


def req_ids_of(group: int) -> tuple[int, int]:
    return 100 + group, 200 + group


def prefill_plan(step_id: int, num_groups: int, req_id_override: int | None = None) -> StepPlan:
    parts = []
    for g in range(num_groups):
        a, b = req_ids_of(g)
        if req_id_override is not None:
            a = req_id_override
        parts.append(
            PartitionPlan(
                prefills=[
                    PrefillChunk(a, 0, i32(range(1, PROMPT_LEN + 1)), True),
                    PrefillChunk(b, 0, i32(range(1, PROMPT_LEN + 1)), True),
                ]
            )
        )
    return StepPlan(step_id, parts)


def decode_plan(step_id: int, num_groups: int) -> StepPlan:
    """Step s decodes request a (1 row) and b (8 rows) at position PROMPT_LEN - 1 + s."""
    pos = PROMPT_LEN - 1 + step_id
    parts = [
        PartitionPlan(
            decode=DecodeBatch(
                req_ids=i32(req_ids_of(g)), start_pos=i32([pos, pos]), num_rows=i8([1, 8]), token_ids=i32([7] * 9)
            )
        )
        for g in range(num_groups)
    ]
    return StepPlan(step_id, parts)


def expected_rows(step_id: int, group: int) -> list[tuple[int, int]]:
    """(req_id, position) of each returned token, in protocol order, for the plans above."""
    a, b = req_ids_of(group)
    if step_id == 0:
        return [(a, PROMPT_LEN - 1), (b, PROMPT_LEN - 1)]
    pos = PROMPT_LEN - 1 + step_id
    return [(a, pos)] + [(b, pos + k) for k in range(8)]
