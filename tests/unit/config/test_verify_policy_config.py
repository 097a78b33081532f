"""--speculative-config's adaptive verification keys and the policy launch builds from them."""

from __future__ import annotations

import json

from dspark_loop.config.json_flags import speculative_config
from dspark_loop.config.server_config import ServerConfig
from dspark_loop.engine.verify.adaptive import AdaptiveVerify
from dspark_loop.engine.verify.cost_table import CostTable
from dspark_loop.engine.verify.policy import FullVerify
from dspark_loop.verify_setup import verify_policy


def config(tmp_path, spec: dict):
    return ServerConfig(model=str(tmp_path), speculative=speculative_config(json.dumps(spec)))


def test_adaptive_verification_is_on_by_default_at_k7_and_off_when_asked(tmp_path):
    """At K=7 a drafter with a confidence head (or one whose tensors cannot be read) must get
    the adaptive policy unless the config says false, which gives the fixed chain; K=0 never
    verifies, so it gets the fixed chain whatever the key says."""
    assert isinstance(verify_policy(config(tmp_path, {"num_speculative_tokens": 7})), AdaptiveVerify)
    off = {"num_speculative_tokens": 7, "enable_adaptive_verification": False}
    assert isinstance(verify_policy(config(tmp_path, off)), FullVerify)
    k0 = {"num_speculative_tokens": 0, "enable_adaptive_verification": True}
    assert isinstance(verify_policy(config(tmp_path, k0)), FullVerify)


def test_a_cost_model_file_is_the_tables_start_up_profile(tmp_path):
    """ "cost_model": FILE (a saved start-up profile) must become the cost table's prior,
    which the policy reads for every cell it has not measured."""
    path = tmp_path / "cost.json"
    profiled = CostTable.profile(lambda n, rows, drafting: 0.01 + 0.001 * rows + 0.005 * drafting, 16)
    profiled.save(str(path), {"checkpoint": "tiny", "topology": "tp1", "backend": "cpu"})
    spec = {"num_speculative_tokens": 7, "enable_adaptive_verification": True, "cost_model": str(path)}
    policy = verify_policy(config(tmp_path, spec))
    assert policy.table.prior is not None
    assert policy.table.costs(4, 0)[1, 4 * 7] == 0.01 + 0.001 * 128 + 0.005  # 16 requests x 8 rows, a pass


def write_safetensors_header(path, names):
    header = json.dumps({n: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]} for n in names}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0\0\0")


def test_a_drafter_without_a_confidence_head_defaults_to_the_fixed_chain(tmp_path):
    """Adaptive verification chooses from the confidence head: a checkpoint whose drafter
    has none must default to the fixed chain, and one that has it to the adaptive policy."""
    write_safetensors_header(tmp_path / "model.safetensors", ["mtp.2.head.weight"])
    assert isinstance(verify_policy(config(tmp_path, {"num_speculative_tokens": 7})), FullVerify)
    write_safetensors_header(tmp_path / "model.safetensors", ["mtp.2.confidence_head.proj.weight"])
    assert isinstance(verify_policy(config(tmp_path, {"num_speculative_tokens": 7})), AdaptiveVerify)


def test_the_checkpoints_position_temperatures_reach_the_policy(tmp_path):
    """config.json's dspark_confidence_temperatures (sequential temperature scaling) must be
    applied by the policy; a list of the wrong length is refused at start."""
    from types import SimpleNamespace

    import pytest

    temps = [0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3]
    policy = verify_policy(
        config(tmp_path, {"num_speculative_tokens": 7}), SimpleNamespace(raw={"dspark_confidence_temperatures": temps})
    )
    assert policy.acceptance.temperatures.tolist() == temps
    with pytest.raises(ValueError, match="dspark_confidence_temperatures"):
        verify_policy(
            config(tmp_path, {"num_speculative_tokens": 7}),
            SimpleNamespace(raw={"dspark_confidence_temperatures": [1.0]}),
        )
