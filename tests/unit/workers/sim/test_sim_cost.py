"""The cost model against step times computed by hand, the tile's flat cost, and the
gpu-h200 profile against SGLang's published V4-Flash runs."""

from __future__ import annotations

import dataclasses

import pytest

from dspark_loop.contract.model_config import ModelConfig
from tools.checkpoint_config import build_config, resolve_size
from workers.sim.cost import CostModel, GroupLoad
from workers.sim.profile import load_profile

# The tiny checkpoint's shape, by hand (tools/checkpoint_config.py "tiny"):
#   attention per layer  64*32 + 32*(8*32) + 64*32 + 16*(8*32) + 4*16*64 = 20480
#   indexer wq_b per CSA layer (layers 1, 3, 5)   32*4*16 = 2048
#   shared expert per layer   3*64*32 = 6144;  head 1024*64 = 65536
DENSE = 6 * 20480 + 3 * 2048 + 6 * 6144 + 65536  # 231424 params on one rank
EXPERTS = 6 * 16 * 6144  # 589824 routed params
ROUTED_FLOPS = 2 * 6 * 2 * 6144  # one row through top-2 experts in 6 layers


def profile(**over):
    """npu-tile with the figures the hand computations below use."""
    p = load_profile("npu-tile")
    values = dict(p.values)
    values.update(
        {
            "step.fixed_s": 1e-3,
            "step.per_layer_s": 1e-4,
            "step.tile_requests": 0,
            "step.prefill_pad_tokens": 0,
            "step.drafter_dispatches": 0,
            "hardware.flops_per_s": 1e30,
            "hardware.hbm_bytes_per_s": 1e30,
            "hardware.collective_latency_s": 0.0,
            "weights.dense_bytes_per_param": 1.0,
            "weights.expert_bytes_per_param": 1.0,
        }
    )
    values.update({k.replace("__", "."): v for k, v in over.items()})
    return dataclasses.replace(p, values=values)


def tiny_model(sim_ckpt) -> ModelConfig:
    return ModelConfig.from_dir(sim_ckpt)


def one_row(ctx: int = 0) -> list[GroupLoad]:
    return [GroupLoad(decode_ctx=[ctx], decode_rows=1)]


def test_a_compute_bound_step_is_fixed_plus_layers_plus_flops(sim_ckpt):
    """1 row at 1e12 flop/s: 1 ms + 6 x 0.1 ms + (2 x 231424 + 147456) / 1e12 s."""
    cost = CostModel(profile(hardware__flops_per_s=1e12), tiny_model(sim_ckpt), 1, 1, 0)
    assert cost.step_seconds(one_row()) == pytest.approx(1e-3 + 6e-4 + (2 * DENSE + ROUTED_FLOPS) / 1e12)


def test_a_memory_bound_step_reads_the_dense_weights_and_the_experts_its_rows_touch(sim_ckpt):
    """1 row at 1 GB/s: dense 231424 B + 1/8 of the experts (top-2 of 16) 73728 B, / 1e9."""
    cost = CostModel(profile(hardware__hbm_bytes_per_s=1e9), tiny_model(sim_ckpt), 1, 1, 0)
    assert cost.step_seconds(one_row()) == pytest.approx(1e-3 + 6e-4 + (DENSE + EXPERTS / 8) / 1e9)


def test_kv_reads_follow_the_window_csa_topk_hca_and_indexer(sim_ckpt):
    """ctx 64, window 16, top-k 8: keys 16 (sliding) + 3 x (16 + 8) (CSA) + 2 x (16 + 4) (HCA)
    = 128 of 32 bf16 values, + the CSA indexer's 3 x 16 keys of 16 values: 9728 bytes."""
    cost = CostModel(profile(), tiny_model(sim_ckpt), 1, 1, 0)
    assert cost.kv_read_bytes([64]) == 128 * 32 * 2 + 3 * 16 * 16 * 2


def test_a_fixed_tile_costs_the_same_for_one_live_request_as_for_a_full_tile(sim_ckpt):
    """tile_requests 4 at K=7: 1 and 4 live requests both compute 4 x 8 rows; 5 take two tiles."""
    cost = CostModel(profile(hardware__flops_per_s=1e9, step__tile_requests=4), tiny_model(sim_ckpt), 1, 1, 7)

    def step(n):
        return cost.step_seconds([GroupLoad(decode_ctx=[0] * n, decode_rows=8 * n)])

    assert step(1) == step(4) < step(5)
    per_row = (2 * DENSE + ROUTED_FLOPS) / 1e9
    assert step(4) == pytest.approx(1e-3 + 6e-4 + 32 * per_row)
    assert step(5) == pytest.approx(1e-3 + 6e-4 + 64 * per_row)


def flash() -> ModelConfig:
    config = build_config(resolve_size("flash", {}), dtype="bfloat16", w8a8=False, with_drafter=True)
    return ModelConfig.from_dict(config)


def test_gpu_h200_matches_sglang_on_4_h200s():
    """SGLang PR 33109, V4-Flash on 4 x H200: ~1.72 ms a token at 1 stream target-only, and
    ~4,872 output tok/s per GPU at 256 streams with DSpark (5.4 tokens a verify)."""
    p, m = load_profile("gpu-h200"), flash()
    one = CostModel(p, m, 4, 4, 0).step_seconds([GroupLoad(decode_ctx=[2048], decode_rows=1)])
    assert one == pytest.approx(1.72e-3, rel=0.05)
    full = CostModel(p, m, 4, 4, 7).step_seconds([GroupLoad(decode_ctx=[2048] * 256, decode_rows=2048, anchors=256)])
    assert 256 * 5.4 / full / 4 == pytest.approx(4872, rel=0.1)


def test_npu_tile_steps_cost_the_same_at_1_and_256_requests():
    """The seeds' 64 x 8 tile: 16 ranks at dp4 compute the full tile whatever is live (the
    requests' KV reads aside)."""
    cost = CostModel(load_profile("npu-tile"), flash(), 16, 4, 7)

    def step(n):
        groups = [GroupLoad() for _ in range(4)]
        for i in range(n):
            g = groups[i % 4]
            g.decode_ctx.append(0)
            g.decode_rows += 8
            g.anchors += 1
        return cost.step_seconds(groups)

    assert step(1) == pytest.approx(step(256), rel=1e-9)


def test_jitter_is_a_pure_function_of_the_step_id_and_sim_speed_divides(sim_ckpt):
    """demo-cpu's jitter: a step id always gets the same time, ids differ, the mean stays the
    profile's; --sim-speed 10 makes every step 10x shorter."""
    from dspark_loop.contract.protocol import DecodeBatch, PartitionPlan, RankConfig, StepPlan, i8, i32
    from workers.sim.runner import SimRunner

    def runner(speed):
        return SimRunner(RankConfig(model=sim_ckpt, backend="sim", device_profile="demo-cpu", sim_speed=speed))

    part = PartitionPlan(decode=DecodeBatch(i32([1]), i32([5]), i8([1]), i32([42])))

    def times(r, ids):
        out = []
        for i in ids:
            r.see_plan(StepPlan(i, [part]))
            out.append(r.step_seconds())
        return out

    plain, fast = runner(1.0), runner(10.0)
    a, b = times(plain, range(200)), times(plain, range(200))
    assert a == b and len(set(a)) > 100
    base = plain.cost.step_seconds(plain.step_loads())
    assert sum(a) / len(a) == pytest.approx(base, rel=0.05)
    assert times(fast, range(5)) == pytest.approx([t / 10 for t in a[:5]])
