"""ServerConfig: what the server was asked to run.

`fill_defaults(cfg)` completes the topology and the sizes the user left out; the rules the
result must obey are startup_rules.py's `validate(cfg, model)`. Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from dspark_loop.contract.protocol import DEFAULT_RING_HEAP, MAX_CHUNK

SEQS_PER_GROUP = 64  # requests per TP group in the decode tile
CPU_KV_CACHE_MEMORY = 256 * 2**20  # bytes per rank when --backend cpu and no flag
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


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "dspark"
    num_speculative_tokens: int = 0
    # K=7: choose verify lengths and drafter skips per request (engine/verify/adaptive.py);
    # None: on when the drafter has a confidence head (verify_setup.adaptive_verification)
    enable_adaptive_verification: bool | None = None
    cost_model: str | None = None  # a start-up cost table (engine/verify/cost_table.py), JSON


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
    verify_profile: str = "auto"  # auto | off | refresh: the start-up cost profile (dspark_loop/verify_costs.py)
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
    # an accelerator's share a rank may use (weights, KV pages); KV pages get what is left of
    # it after loading, the rest is the activations' headroom (vLLM's --gpu-memory-utilization)
    gpu_memory_utilization: float = 0.9
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
    stream_interval: int = 1  # a stream's chunk every N tokens (and at the end): engine/output_channel.py
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
