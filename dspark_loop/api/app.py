"""create_app: the aiohttp application and its routes.

    GET  /health              200 {"status":"ok"} | 503 not_ready | draining | restarting | dead
    GET  /v1/models           the served model (OpenAI list); 503 engine_not_ready while starting
    GET  /v1/models/{id}      its card (OpenAI retrieve); 404 model_not_found for another id
    POST /v1/completions      completions.py
    POST /v1/chat/completions chat_completions.py
    POST /tokenize /detokenize tokenize.py
    GET  /metrics /metrics/json   when a Metrics object is given (the JSON adds the
                              engine's page pools under "engine" once it runs)
    GET  /openapi.json        OpenAPI 3.1 of these routes (openapi.py)
    GET  /version /server_info /model_info /loads (+ aliases)   what a router reads (server_info.py)

The routes reach the engine through an AdmissionGate (gate.py, app[GATE_KEY]); with
API keys (auth.py) the model's routes need `Authorization: Bearer KEY`.
"""

from __future__ import annotations

import time

from aiohttp import web

from dspark_loop.api.auth import api_key_middleware
from dspark_loop.api.chat.completions import ChatCompletionsRoute
from dspark_loop.api.context import ServingContext
from dspark_loop.api.errors import error_middleware, not_ready, retry_after
from dspark_loop.api.gate import AdmissionGate
from dspark_loop.api.generation.completions import CompletionsRoute
from dspark_loop.api.openapi import openapi_document
from dspark_loop.api.prompt import PromptEncoder
from dspark_loop.api.server_info import ServerInfoRoutes
from dspark_loop.api.sse import WRITE_TIMEOUT_KEY
from dspark_loop.api.tokenize import TokenizeRoutes
from dspark_loop.config.server_config import ServerConfig, served_name_for
from dspark_loop.contract.model_config import ModelConfig
from dspark_loop.engine.interfaces import EngineClient

MAX_BODY_BYTES = 64 * 2**20  # a 1M-token prompt as ids fits
CONTEXT_KEY = web.AppKey("ctx", ServingContext)
GATE_KEY = web.AppKey("gate", AdmissionGate)


def create_app(
    engine: EngineClient, tokenizer, cfg: ServerConfig, model_cfg: ModelConfig, metrics=None
) -> web.Application:
    encoder = PromptEncoder(tokenizer, model_cfg.bos_token_id, model_cfg.vocab_size)
    name = cfg.served_model_name or served_name_for(cfg.model)
    gate = AdmissionGate(engine, cfg.max_queued_requests)
    ctx = ServingContext(gate, encoder, name, cfg.generate, cfg.model, cfg.default_chat_template_kwargs)
    auth = api_key_middleware(cfg.api_keys, cfg.protect_router_info)
    app = web.Application(middlewares=[error_middleware, *([auth] if auth else [])], client_max_size=MAX_BODY_BYTES)
    app[CONTEXT_KEY] = ctx
    app[GATE_KEY] = gate
    app[WRITE_TIMEOUT_KEY] = cfg.stream_write_timeout_s
    completions = CompletionsRoute(ctx)
    chat = ChatCompletionsRoute(ctx)
    tokenize = TokenizeRoutes(ctx)
    created = int(time.time())

    async def health(request: web.Request) -> web.Response:
        if gate.draining:
            return web.json_response({"status": "draining"}, status=503)
        if engine.dead_reason is not None:
            return web.json_response({"status": "dead", "reason": engine.dead_reason}, status=503)
        if engine.restarting is not None:  # both pass: a client may retry after the header's seconds
            return web.json_response(
                {"status": "restarting", "reason": engine.restarting}, status=503, headers=retry_after()
            )
        if not engine.ready:
            return web.json_response({"status": "not_ready"}, status=503, headers=retry_after())
        return web.json_response({"status": "ok"})

    def model_card() -> dict:
        if not engine.ready and engine.dead_reason is None and engine.restarting is None:
            raise not_ready()  # still starting (errors.not_ready says why)
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "dspark_loop",
            "root": cfg.model or name,
            "parent": None,
            "max_model_len": engine.max_model_len,
            "permission": [],
        }

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [model_card()]})

    async def model(request: web.Request) -> web.Response:
        ctx.check_model(request.match_info["model"])
        return web.json_response(model_card())

    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)  # OpenAI's retrieve (ids may hold a "/")
    app.router.add_post("/v1/completions", completions.handle)
    app.router.add_post("/v1/chat/completions", chat.handle)
    app.router.add_post("/tokenize", tokenize.tokenize)
    app.router.add_post("/detokenize", tokenize.detokenize)
    ServerInfoRoutes(gate, cfg, model_cfg, name).register(app)
    spec: list[dict] = []  # built on first use, when every route is registered

    async def openapi(request: web.Request) -> web.Response:
        if not spec:
            served = {
                (rt.method.lower(), rt.resource.canonical)
                for rt in request.app.router.routes()
                if rt.resource is not None  # every route added with add_get/add_post has one
            }
            spec.append(
                openapi_document(
                    name,
                    api_keys=bool(cfg.api_keys),
                    served=served,
                    vocab_size=encoder.vocab_size,
                    protect_router_info=cfg.protect_router_info,
                    max_model_len=engine.max_model_len,
                )
            )
        return web.json_response(spec[0])

    app.router.add_get("/openapi.json", openapi)
    if metrics is not None:
        add_metrics_routes(app, metrics, engine)
    return app


def add_metrics_routes(app: web.Application, metrics, engine: EngineClient | None = None) -> None:
    """metrics: render_prometheus() -> str and snapshot() -> dict (dspark_loop.observe.metrics);
    engine (optional): cache_stats() -> dict, served as the snapshot's "engine" key."""

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(
            text=metrics.render_prometheus(),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Format": "prometheus-0.0.4"},
        )

    async def as_json(request: web.Request) -> web.Response:
        snap = metrics.snapshot()
        stats = engine.cache_stats() if engine is not None else None  # None until the ranks are up
        if stats is not None:
            snap = {**snap, "engine": stats}
        return web.json_response(snap)

    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/metrics/json", as_json)
