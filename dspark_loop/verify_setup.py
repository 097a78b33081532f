"""The verify policy a server's configuration asks for: the fixed K=7 chain, or adaptive
verification with its cost table's prior (a cost_model file) and the checkpoint's
confidence temperatures; and whether the server profiles its costs at start-up."""

from __future__ import annotations

from dspark_loop.config.server_config import ServerConfig
from dspark_loop.config.startup_rules import has_confidence_head
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.adaptive import AdaptiveVerify
from dspark_loop.engine.verify.cost_table import CostTable
from dspark_loop.engine.verify.policy import FullVerify, VerifyPolicy


def adaptive_verification(cfg: ServerConfig) -> bool:
    """--speculative-config enable_adaptive_verification; unset: on when K=7 and the
    checkpoint's drafter has a confidence head."""
    spec = cfg.speculative
    if not spec.num_speculative_tokens:
        return False
    if spec.enable_adaptive_verification is not None:
        return spec.enable_adaptive_verification
    return has_confidence_head(cfg.model)


def verify_policy(cfg: ServerConfig, model: ModelConfig | None = None) -> VerifyPolicy:
    """AdaptiveVerify (with the start-up cost table when one is given, and the checkpoint's
    per-position confidence temperatures, config.json dspark_confidence_temperatures, when
    it has them) or the fixed chain."""
    if not adaptive_verification(cfg):
        return FullVerify()
    return adaptive_policy(cfg.speculative.cost_model, model)


def profiles_at_startup(cfg: ServerConfig) -> bool:
    """Whether the server times dummy steps (or reads their cache) before serving: adaptive
    verification without a cost_model file, --verify-profile not off (verify_costs.py)."""
    return adaptive_verification(cfg) and not cfg.speculative.cost_model and cfg.verify_profile != "off"


def adaptive_policy(cost_model: str | None, model: ModelConfig | None) -> AdaptiveVerify:
    """AdaptiveVerify as the server builds it (also tools/bench/adaptive): the cost table's
    prior from cost_model when given, the checkpoint's confidence temperatures when it has them."""
    temps = model.raw.get("dspark_confidence_temperatures") if model is not None else None
    if temps is not None and (len(temps) != DSPARK_K or min(temps) <= 0):
        raise ValueError(f"config.json dspark_confidence_temperatures must be {DSPARK_K} positive numbers: {temps}")
    return AdaptiveVerify(CostTable.from_file(cost_model) if cost_model else None, temperatures=temps)
