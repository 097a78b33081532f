"""The start-up rules a ServerConfig must obey for its checkpoint.

`validate(cfg, model)` (after fill_defaults) raises one ConfigError listing every violated
rule, each naming its flag. Two rule sets: the production Flash shape (hidden 4096, 43
layers, 256 experts) gets exactly the seeds' rules (tp 4, ep 8/16, dp = ep/4, block 32,
...); any other checkpoint (tests, the embedded default) may use any consistent topology
down to one rank. The rules about hosts are node_rules.py's. Torch-free.
"""

from __future__ import annotations

from dspark_loop.config.node_rules import devices_rule, node_rules
from dspark_loop.config.server_config import SEQS_PER_GROUP, ServerConfig
from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.checkpoint_names import checkpoint_tensor_names
from dspark_loop.contract.model_config import DRAFT_STAGES, ModelConfig
from dspark_loop.contract.protocol import DSPARK_K
from dspark_loop.engine.verify.cost_table import CostTable

FLASH_SHAPE = dict(hidden_size=4096, num_hidden_layers=43, n_routed_experts=256)
MAX_CONTEXT = 1048576
DRAFTER_KEYS = ("dspark_target_layer_ids", "dspark_noise_token_id", "dspark_markov_rank")
POSITIVE_FIELDS = (
    "dp",
    "tp",
    "ep",
    "max_model_len",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "long_prefill_token_threshold",
    "nnodes",
)


class ConfigError(ValueError):
    """Start-up configuration that cannot run; the message lists every violated rule."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def is_flash(model: ModelConfig) -> bool:
    return all(getattr(model, k) == v for k, v in FLASH_SHAPE.items())


def validate(cfg: ServerConfig, model: ModelConfig) -> None:
    """Raise ConfigError naming every rule `cfg` breaks for this checkpoint (after fill_defaults)."""
    # NOTE: the size rules divide by these; with a non-positive one only that is reported.
    problems = _positive_rules(cfg)
    if not problems:
        problems = _flash_rules(cfg, model) if is_flash(model) else _general_rules(cfg, model)
        problems += _common_rules(cfg, model) + node_rules(cfg)
    if problems:
        raise ConfigError(problems)


def _flash_rules(cfg: ServerConfig, model: ModelConfig) -> list[str]:
    out = []
    flash = "DeepSeek-V4-Flash DSpark"
    if cfg.tp != 4:
        out.append(f"--tp must be 4 for {flash} (got {cfg.tp})")
    if cfg.ep not in (8, 16):
        out.append(f"--ep must be 8 or 16 for {flash} (got {cfg.ep})")
    elif cfg.dp != cfg.ep // 4:
        out.append(f"--dp must be ep/4 = {cfg.ep // 4} for {flash} with --ep {cfg.ep} (got {cfg.dp})")
    out += devices_rule(cfg)
    if cfg.block_size != 32:
        out.append(f"--block-size must be 32 for {flash} (got {cfg.block_size})")
    cap = SEQS_PER_GROUP * cfg.dp
    if cfg.max_num_seqs > cap:
        out.append(
            f"--max-num-seqs must be at most 64 per TP group = {cap} with --dp {cfg.dp} (got {cfg.max_num_seqs})"
        )
    ctx = min(MAX_CONTEXT, model.max_position_embeddings)
    if cfg.max_model_len > ctx:
        out.append(
            f"--max-model-len must be at most min(1048576, max_position_embeddings) = {ctx} (got {cfg.max_model_len})"
        )
    return out


def _general_rules(cfg: ServerConfig, model: ModelConfig) -> list[str]:
    out = []
    out += devices_rule(cfg)
    if cfg.ep != cfg.dp * cfg.tp:
        out.append(f"--ep must equal --dp x --tp = {cfg.dp} x {cfg.tp} = {cfg.dp * cfg.tp} (got {cfg.ep})")
    heads, groups = model.num_attention_heads, model.o_groups
    if heads % cfg.tp or groups % cfg.tp:
        out.append(f"--tp {cfg.tp} must divide the checkpoint's num_attention_heads ({heads}) and o_groups ({groups})")
    if model.n_routed_experts % cfg.ep:
        out.append(f"--ep {cfg.ep} must divide the checkpoint's n_routed_experts ({model.n_routed_experts})")
    bs = cfg.block_size
    if bs & (bs - 1):
        out.append(f"--block-size must be a power of two (got {bs})")
    else:
        try:
            CacheLayout.for_model(model, bs)
        except ValueError as e:
            out.append(f"--block-size {bs} does not fit the checkpoint's cache pages: {e}")
    if cfg.max_model_len > model.max_position_embeddings:
        out.append(
            f"--max-model-len must be at most the checkpoint's max_position_embeddings = "
            f"{model.max_position_embeddings} (got {cfg.max_model_len})"
        )
    return out


def _positive_rules(cfg: ServerConfig) -> list[str]:
    return [
        f"--{name.replace('_', '-')} must be a positive integer (got {value})"
        for name in POSITIVE_FIELDS
        if not isinstance(value := getattr(cfg, name), int) or value < 1
    ]


def _common_rules(cfg: ServerConfig, model: ModelConfig) -> list[str]:
    out = []
    banks = cfg.weight_bank_size
    if banks is not None and not 1 <= banks <= model.num_hidden_layers:
        out.append(
            f"--weight-bank-size must be 1..num_hidden_layers = {model.num_hidden_layers} (all layers resident) "
            f"(got {banks})"
        )
    if cfg.max_num_seqs < cfg.dp:
        out.append(
            f"--max-num-seqs must be at least --dp = {cfg.dp}: one request per cache partition (got {cfg.max_num_seqs})"
        )
    spec = cfg.speculative
    k = spec.num_speculative_tokens
    if spec.method != "dspark":
        out.append(f'--speculative-config method must be "dspark" (got {spec.method!r})')
    if k not in (0, DSPARK_K):
        out.append(
            f"--speculative-config num_speculative_tokens must be 0 or {DSPARK_K}: "
            f"DSpark drafts a fixed block of DSPARK_K = {DSPARK_K} tokens "
            f"(got {k})"
        )
    if spec.cost_model is not None:
        try:
            CostTable.from_file(spec.cost_model)
        except (OSError, ValueError) as e:
            out.append(f"--speculative-config cost_model {spec.cost_model}: {e}")
    if k == DSPARK_K:
        missing = missing_drafter_parts(model, cfg.model)
        if missing:
            out.append(
                f"--speculative-config num_speculative_tokens={DSPARK_K} needs the checkpoint's "
                f"DSpark drafter; missing: {', '.join(missing)}"
            )
        elif model.dspark is not None and (problem := model.dspark.block_size_problem()):
            out.append(f"--speculative-config num_speculative_tokens={DSPARK_K}: {problem}")
    return out


def has_confidence_head(model_dir: str | None) -> bool:
    """Whether the checkpoint's drafter carries a confidence head (what adaptive
    verification chooses from); True when the tensor names cannot be read."""
    names = checkpoint_tensor_names(model_dir) if model_dir else None
    return names is None or any(n.endswith("confidence_head.proj.weight") for n in names)


def missing_drafter_parts(model: ModelConfig, model_dir: str | None) -> list[str]:
    """What K=DSPARK_K needs and the checkpoint lacks: config keys and the drafter stages'
    tensors (mtp.0 .. mtp.{num_stages-1}; dspark_num_stages, else num_nextn_predict_layers)."""
    missing = [f"{k} in config.json" for k in DRAFTER_KEYS if k not in model.raw]
    names = checkpoint_tensor_names(model_dir) if model_dir else None
    if names is not None:
        num_stages = model.dspark.num_stages if model.dspark is not None else DRAFT_STAGES
        stages = [f"mtp.{i}" for i in range(num_stages) if not any(n.startswith(f"mtp.{i}.") for n in names)]
        if stages:
            missing.append(f"drafter stage tensors {', '.join(stages)}")
    return missing
