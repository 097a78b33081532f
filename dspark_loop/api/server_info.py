"""ServerInfoRoutes: what a router reads of this server (identity, topology, load), under the
names smg (the Shepherd Model Gateway, formerly sglang-router) and SGLang/vLLM workers use.

    GET /version                          {"version"} (vLLM's route: smg then files us as vLLM-like)
    GET /server_info   /get_server_info   SGLang's field names for the model and the topology, + ours
    GET /model_info    /get_model_info    SGLang's model card
    GET /loads  /v1/loads  /get_load      SGLang's load report: one entry per DP partition

smg 1.13 asks, at registration, /v1/models, /version and /server_info; its load monitor then
polls /loads?model=NAME (falling back to /v1/loads, then /metrics) every
--load-monitor-interval seconds; the load-aware policies (power_of_two, least_load,
cache_aware's balance and overload thresholds) act on what these answers say.

Nothing here owns state: each answer reads the config, the engine's cache_stats() (page
pools and queues per partition, tokens held) and the gate's active count, O(partitions).
Open like /health and /metrics (auth.py) unless the operator passes --protect-router-info.
"""

from __future__ import annotations

import importlib.metadata
import time

import msgspec
from aiohttp import web

from dspark_loop.api.gate import AdmissionGate
from dspark_loop.config.server_config import ServerConfig
from dspark_loop.contract.cache_layout import CacheLayout
from dspark_loop.contract.model_config import ModelConfig

# the routes this module answers (auth.py keeps them open unless told otherwise)
ROUTER_INFO_PATHS = (
    "/version",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
    "/loads",
    "/v1/loads",
    "/get_load",
)


def router_routes() -> list[tuple]:
    """openapi.py's ROUTES rows for these routes (401 only with --protect-router-info)."""
    rows: list[tuple[str, str, type]] = [("/version", "This server's version (vLLM's route)", VersionInfo)]
    rows += [(p, "Model, topology and K (SGLang's names)", ServerInfo) for p in ("/server_info", "/get_server_info")]
    rows += [(p, "The model card (SGLang's names)", ModelInfo) for p in ("/model_info", "/get_model_info")]
    rows += [
        (p, "Load per DP partition (SGLang's /v1/loads)", LoadReport) for p in ("/loads", "/v1/loads", "/get_load")
    ]
    return [("get", path, summary, None, struct, None, (401,)) for path, summary, struct in rows]


def package_version() -> str:
    try:
        return importlib.metadata.version("dspark-loop")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class VersionInfo(msgspec.Struct):
    version: str


class ServerInfo(msgspec.Struct):
    """SGLang's /server_info names where one fits (smg reads model_path, served_model_name,
    tp_size, dp_size, context_length, max_total_tokens, max_running_requests, version)."""

    model_path: str
    served_model_name: str
    version: str
    status: str  # /health's word: ok | not_ready | draining | restarting | dead
    context_length: int  # = max_model_len
    max_model_len: int
    max_running_requests: int  # --max-num-seqs, over all partitions
    max_total_tokens: int | None  # KV capacity in tokens, all partitions (None until the ranks are up)
    dp_size: int
    tp_size: int
    ep_size: int
    pp_size: int
    nnodes: int
    num_speculative_tokens: int  # K: 7 with DSpark, 0 without
    speculative_algorithm: str | None
    block_size: int
    enable_prefix_caching: bool
    is_embedding: bool
    disaggregation_mode: str
    backend: str  # --backend: cpu | npu | cuda
    platform: str | None  # --platform, as given (None: not given)


class ModelInfo(msgspec.Struct):
    model_path: str
    tokenizer_path: str
    served_model_name: str
    is_generation: bool
    model_type: str
    architectures: list[str]
    max_model_len: int
    has_image_understanding: bool
    has_audio_understanding: bool


class PartitionLoad(msgspec.Struct):
    """One DP partition, as SGLang reports one DP rank (smg's SchedulerLoadSnapshot), + pages."""

    dp_rank: int
    num_running_reqs: int
    num_waiting_reqs: int
    num_total_reqs: int
    num_used_tokens: int  # tokens held by the partition's live requests (prompt + output so far)
    num_waiting_uncached_tokens: int  # tokens the waiting requests have still to compute
    max_total_num_tokens: int  # KV capacity in tokens: the scarcest full-history family
    token_usage: float  # pages in use / pages, all families (vllm:kv_cache_usage_perc)
    max_running_requests: int
    pages_used: list[int]  # per cache family (the order of "families")
    pages_free: list[int]


class LoadReport(msgspec.Struct):
    """SGLang's /v1/loads body (what smg parses) plus the server-wide figures."""

    timestamp: str
    dp_rank_count: int
    loads: list[PartitionLoad]
    load: int  # running + waiting requests (legacy routers read one number)
    status: str
    num_running_reqs: int
    num_waiting_reqs: int
    num_active_requests: int  # admitted over HTTP and not yet finished (what a drain waits for)
    num_tokens_in_flight: int
    families: list[str]


def health_word(gate: AdmissionGate) -> str:
    """/health's status word (app.py's health route, without the HTTP status)."""
    if gate.draining:
        return "draining"
    if gate.dead_reason is not None:
        return "dead"
    if gate.restarting is not None:
        return "restarting"
    return "ok" if gate.ready else "not_ready"


class ServerInfoRoutes:
    def __init__(self, gate: AdmissionGate, cfg: ServerConfig, model_cfg: ModelConfig, name: str):
        self.gate = gate
        self.cfg = cfg
        self.model_cfg = model_cfg
        self.name = name
        self.version = package_version()
        layout = CacheLayout.for_model(model_cfg, cfg.block_size)
        self.tokens_per_page = [f.tokens_per_page for f in layout.families]
        self.full_history = [not f.ring for f in layout.families]

    def register(self, app: web.Application) -> None:
        app.router.add_get("/version", self.version_route)
        for path in ("/server_info", "/get_server_info"):
            app.router.add_get(path, self.server_info_route)
        for path in ("/model_info", "/get_model_info"):
            app.router.add_get(path, self.model_info_route)
        for path in ("/loads", "/v1/loads", "/get_load"):
            app.router.add_get(path, self.loads_route)

    # ---- answers ------------------------------------------------------------------------
    def token_capacity(self, totals: list[int]) -> int:
        """Tokens one partition's pages can hold: the scarcest full-history family."""
        caps = [n * t for n, t, full in zip(totals, self.tokens_per_page, self.full_history) if full]
        return min(caps) if caps else 0

    def server_info(self) -> ServerInfo:
        cfg = self.cfg
        stats = self.gate.cache_stats()
        capacity = None
        if stats is not None:
            capacity = sum(self.token_capacity(p["total"]) for p in stats["partitions"])
        k = cfg.num_speculative_tokens
        return ServerInfo(
            model_path=cfg.model or self.name,
            served_model_name=self.name,
            version=self.version,
            status=health_word(self.gate),
            context_length=self.gate.max_model_len,
            max_model_len=self.gate.max_model_len,
            max_running_requests=cfg.max_num_seqs or 0,
            max_total_tokens=capacity,
            dp_size=cfg.dp or 1,
            tp_size=cfg.tp or 1,
            ep_size=cfg.world_size,
            pp_size=1,
            nnodes=cfg.nnodes,
            num_speculative_tokens=k,
            speculative_algorithm="DSPARK" if k else None,
            block_size=cfg.block_size,
            enable_prefix_caching=cfg.enable_prefix_caching,
            is_embedding=False,
            disaggregation_mode="null",
            backend=cfg.backend,
            platform=cfg.platform,
        )

    def model_info(self) -> ModelInfo:
        raw = self.model_cfg.raw
        path = self.cfg.model or self.name
        return ModelInfo(
            model_path=path,
            tokenizer_path=path,
            served_model_name=self.name,
            is_generation=True,
            model_type=str(raw.get("model_type", "deepseek_v4")),
            architectures=[str(a) for a in raw.get("architectures", [])],
            max_model_len=self.gate.max_model_len,
            has_image_understanding=False,
            has_audio_understanding=False,
        )

    def loads(self) -> LoadReport:
        stats = self.gate.cache_stats()
        dp = self.cfg.dp or 1
        per_partition_seqs = (self.cfg.max_num_seqs or 0) // dp
        loads = []
        families: list[str] = []
        if stats is not None:  # None until the ranks are up: no partition to report yet
            families = list(stats["families"])
            for i, p in enumerate(stats["partitions"]):
                used = [t - f for t, f in zip(p["total"], p["free"])]
                pages = sum(p["total"])
                loads.append(
                    PartitionLoad(
                        dp_rank=i,
                        num_running_reqs=p["num_running"],
                        num_waiting_reqs=p["num_waiting"],
                        num_total_reqs=p["num_running"] + p["num_waiting"],
                        num_used_tokens=p.get("num_tokens", 0),
                        num_waiting_uncached_tokens=p.get("num_waiting_tokens", 0),
                        max_total_num_tokens=self.token_capacity(p["total"]),
                        token_usage=sum(used) / pages if pages else 0.0,
                        max_running_requests=per_partition_seqs,
                        pages_used=used,
                        pages_free=list(p["free"]),
                    )
                )
        running = sum(p.num_running_reqs for p in loads)
        waiting = self.gate.num_waiting if stats is not None else 0
        return LoadReport(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            dp_rank_count=len(loads) or dp,
            loads=loads,
            load=running + waiting,
            status=health_word(self.gate),
            num_running_reqs=running,
            num_waiting_reqs=waiting,
            num_active_requests=self.gate.num_active,
            num_tokens_in_flight=sum(p.num_used_tokens for p in loads),
            families=families,
        )

    # ---- routes -------------------------------------------------------------------------
    async def version_route(self, request: web.Request) -> web.Response:
        return _json(VersionInfo(self.version))

    async def server_info_route(self, request: web.Request) -> web.Response:
        return _json(self.server_info())

    async def model_info_route(self, request: web.Request) -> web.Response:
        return _json(self.model_info())

    async def loads_route(self, request: web.Request) -> web.Response:
        return _json(self.loads())


def _json(body: msgspec.Struct) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


ROUTER_ROUTES = router_routes()
