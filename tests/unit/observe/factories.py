"""Hand-built StepTraces and RequestStats for the observability tests."""

from dspark_loop.contract.protocol import PartitionTrace, StepTrace
from dspark_loop.engine.observer import RequestStats


def make_trace(step_id: int = 0, free_blocks=((10, 4),), **overrides) -> StepTrace:
    parts = [PartitionTrace(free_blocks=list(f)) for f in free_blocks]
    fields = dict(step_id=step_id, wall_time=1000.0 + step_id, partitions=parts)
    fields.update(overrides)
    return StepTrace(**fields)


def make_stats(request_id: str = "r0", **overrides) -> RequestStats:
    fields = dict(
        request_id=request_id,
        num_prompt_tokens=8,
        num_output_tokens=4,
        num_cached_tokens=0,
        finish_reason="stop",
        arrival_time=100.0,
        first_token_time=100.5,
        finish_time=101.0,
        inter_token_s=[],
    )
    fields.update(overrides)
    return RequestStats(**fields)


def prom_samples(text: str) -> dict[tuple[str, tuple], float]:
    """Parse exposition text with prometheus_client: {(sample name, labels w/o model_name): v}."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out
