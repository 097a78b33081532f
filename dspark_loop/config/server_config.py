"""ServerConfig: what the server was asked to run, and the start-up rules it must obey.

`fill_defaults(cfg)` completes the topology and the sizes the user left out;
`validate(cfg, model)` checks the result against the checkpoint and raises one
ConfigError listing every violated rule, each naming its flag. Torch-free.

Two rule sets: the production Flash shape (hidden 4096, 43 layers, 256 experts) gets
exactly the seeds' rules (tp 4, ep 8/16, dp = ep/4, block 32, ...); any other checkpoint
(tests, the embedded default) may use any consistent topology down to one rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from dspark_loop.config.node_rules import devices_rule, node_rules
from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.checkpoint_names import checkpoint_tensor_names
from dspark_loop.contract.model_config import DRAFT_STAGES, ModelConfig
from dspark_loop.contract.protocol import DEFAULT_RING_HEAP, DSPARK_K, MAX_CHUNK
from dspark_loop.engine.step_cost import StepCost

FLASH_SHAPE = dict(hidden_size=4096, num_hidden_layers=43, n_routed_experts=256)
MAX_CONTEXT = 1048576
SEQS_PER_GROUP = 64  # requests per TP group in the decode tile
CPU_KV_CACHE_MEMORY = 256 * 2**20  # bytes per rank when --backend cpu and no flag
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
THINKING_KEYS = ("thinking", "enable_thinking")  # chat_template_kwargs that turn thinking on or off
GENERATE_KEYS = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "stop",
    "ignore_eos",
)


class ConfigError(ValueError):
    """Start-up configuration that cannot run; the message lists every violated rule."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "dspark"
    num_speculative_tokens: int = 0
    # K=7: choose verify lengths and drafter skips per request (engine/adaptive_verify.py);
    # None: on when the drafter has a confidence head (launch.adaptive_verification)
    enable_adaptive_verification: bool | None = None
    cost_model: str | None = None  # a pinned step cost model (engine/step_cost.py), JSON


@dataclass(frozen=True)
class GenerateDefaults:
    """--generate-config: request defaults for fields a request leaves out; the sampling ones
    override the checkpoint's generation_config.json (api/generation_defaults.py)."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class ServerConfig:
    model: str | None = None  # checkpoint directory; None = the embedded default
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    backend: str = "cpu"
    platform: str | None = None  # --platform (flag_types.PLATFORMS): the device the seeds' runtime targets
    devices: tuple[int, ...] | None = None
    dp: int | None = None
    tp: int | None = None
    ep: int | None = None
    dtype: str = "auto"
    max_model_len: int = 1024
    block_size: int = 32
    max_num_seqs: int | None = None
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int | None = None
    enable_prefix_caching: bool = True
    async_scheduling: bool = True  # plan step N+1 while the ranks run step N (K=0 and K=7)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    ring_heap: tuple[int, ...] = DEFAULT_RING_HEAP  # the ranks' runtime sizing (RankConfig.ring_heap)
    weight_bank_size: int | None = None  # decoder layers with resident weight banks; None: all
    generate: GenerateDefaults = field(default_factory=GenerateDefaults)
    # --default-chat-template-kwargs; None: not given (the embedded demo then serves with thinking off)
    default_chat_template_kwargs: dict | None = None
    prompts: tuple[str, ...] = ()  # --prompt: offline mode
    max_tokens: int = 16  # offline mode's max_tokens per prompt
    log_level: str = "info"
    event_loop: str = "auto"  # --loop: dspark_loop.event_loop.EVENT_LOOPS
    kv_cache_memory: int | None = None  # bytes per rank for KV pages
    num_blocks: int | None = None
    debug_tap: str | None = None
    nnodes: int = 1  # hosts in the run (nodes.py)
    node_rank: int = 0  # this host's place; node 0 serves HTTP and runs the engine
    dist_init_addr: str | None = None  # HOST:PORT of node 0's rendezvous (PORT+1: the mesh)
    dist_timeout_s: float = 600.0  # start-up wait for ranks / node 0; torch.distributed timeout
    # operating it (cli_ops.py); keys stay out of repr() so a logged config shows none
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    protect_router_info: bool = False  # True: /server_info, /loads ... need a key too (api/auth.py)
    max_queued_requests: int | None = None  # None: no limit
    shutdown_timeout_s: float = 30.0
    stream_write_timeout_s: float = 30.0  # 0: never abort a stalled stream
    stream_interval: int = 1  # a stream's chunk every N tokens (and at the end): api/generation/pacing.py
    max_rank_restarts: int = 3  # mesh restarts per RESTART_WINDOW_S; 0: a dead rank is final
    # --backend sim (cli_sim.py): the cost profile and the speed-up of its step times
    device_profile: str = ""
    sim_speed: float = 1.0

    @property
    def num_speculative_tokens(self) -> int:
        return self.speculative.num_speculative_tokens

    @property
    def world_size(self) -> int:
        return self.ep or 1

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes if self.world_size % self.nnodes == 0 else self.world_size


def fill_defaults(cfg: ServerConfig) -> ServerConfig:
    """Complete what the user left out: topology (devices == ep == dp*tp), dtype, sizes."""
    dp, tp, ep = cfg.dp, cfg.tp, cfg.ep
    known_ep = ep or (len(cfg.devices) * cfg.nnodes if cfg.devices else None)
    if known_ep is None and dp and tp:
        known_ep = dp * tp
    if tp is None:
        tp = known_ep // dp if known_ep and dp and known_ep % dp == 0 else 1
    if dp is None:
        dp = max(1, known_ep // tp) if known_ep else 1
    if ep is None:
        ep = known_ep or dp * tp
    # NOTE: with several nodes --devices lists this node's devices only.
    local = ep // cfg.nnodes if ep % cfg.nnodes == 0 else ep
    devices = cfg.devices if cfg.devices is not None else tuple(range(local))
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "float32" if cfg.backend == "cpu" else "bfloat16"
    mnbt = cfg.max_num_batched_tokens
    threshold = cfg.long_prefill_token_threshold
    if threshold is None:
        threshold = min(mnbt, MAX_CHUNK)
    kv_mem = cfg.kv_cache_memory
    if kv_mem is None and cfg.backend == "cpu" and cfg.num_blocks is None:
        kv_mem = CPU_KV_CACHE_MEMORY
    name = cfg.served_model_name or served_name_for(cfg.model)
    return replace(
        cfg,
        dp=dp,
        tp=tp,
        ep=ep,
        devices=tuple(devices),
        dtype=dtype,
        max_num_seqs=cfg.max_num_seqs or SEQS_PER_GROUP * dp,
        long_prefill_token_threshold=threshold,
        kv_cache_memory=kv_mem,
        served_model_name=name,
    )


def served_name_for(model_dir: str | None) -> str:
    if model_dir is None:
        from dspark_loop.config.default_model import DEFAULT_NAME

        return DEFAULT_NAME
    return os.path.basename(os.path.normpath(model_dir))


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
            StepCost.from_file(spec.cost_model)
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
