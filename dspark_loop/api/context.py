"""ServingContext: what every route needs (engine, prompt encoder, served name, defaults)."""

from __future__ import annotations

import itertools
import uuid

from dspark_loop.api.errors import ApiError, context_length_exceeded, model_not_found, not_ready, retry_after
from dspark_loop.api.gate import AdmissionGate
from dspark_loop.api.generation.defaults import KEYS, sampling_defaults
from dspark_loop.api.prompt import PromptEncoder
from dspark_loop.config.server_config import GenerateDefaults


class ServingContext:
    def __init__(
        self,
        engine: AdmissionGate,  # the engine as the routes see it
        encoder: PromptEncoder,
        model_name: str,
        defaults: GenerateDefaults,
        model_path: str | None = None,
        chat_template_kwargs: dict | None = None,
    ):
        self.engine = engine
        self.encoder = encoder
        self.model_name = model_name
        self.defaults = defaults
        self.model_path = model_path
        self.chat_template_kwargs = chat_template_kwargs or {}  # --default-chat-template-kwargs
        # generation_config.json's sampling defaults under --generate-config's
        overrides = {k: getattr(defaults, k) for k in KEYS}
        self.sampling_defaults = sampling_defaults(model_path, overrides)
        self._prefix = uuid.uuid4().hex[:12]
        self._counter = itertools.count()

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def new_request_id(self, kind: str = "cmpl") -> str:
        # NOTE: a per-process random prefix + a counter: unique across restarts and requests.
        return f"{kind}-{self._prefix}{next(self._counter):08x}"

    def check_model(self, model: str | None) -> None:
        """None means the served model (as vLLM); any other name is a 404."""
        if model is not None and model != self.model_name:
            raise model_not_found(model)

    def check_ready(self) -> None:
        if self.engine.dead_reason is not None:
            raise ApiError(503, f"The engine is dead: {self.engine.dead_reason}", code="engine_dead")
        if self.engine.restarting is not None:
            raise ApiError(
                503,
                "The ranks are restarting after a failure; retry shortly.",
                code="engine_restarting",
                headers=retry_after(),
            )
        if not self.engine.ready:
            raise not_ready()

    def check_context(self, prompt_len: int) -> None:
        if prompt_len >= self.max_model_len:
            raise context_length_exceeded(prompt_len, self.max_model_len)
