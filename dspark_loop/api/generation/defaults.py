"""Request defaults from the checkpoint's generation_config.json, as vLLM reads them, with
--generate-config on top (vLLM's --override-generation-config).

    generation_config.json    temperature, top_p, top_k, min_p, repetition_penalty
    --generate-config JSON    the same keys (and seed), winning over the file

NOTE: one departure from vLLM: a file with `do_sample` false (or absent, transformers'
default) gives greedy defaults, whatever temperature it lists. transformers itself ignores
temperature then; the tiny checkpoints say do_sample false, temperature 1.0, and a request
that leaves temperature out must stay greedy there (vLLM would sample at 1.0).
"""

from __future__ import annotations

import json
import logging
import os

from dspark_loop.api.generation.sampling_ranges import DEFAULT_TEMPERATURE, SamplingDefaults
from dspark_loop.contract.sampling_knobs import SamplingKnobs

log = logging.getLogger(__name__)
FILE_NAME = "generation_config.json"
KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")


def read_generation_config(model_dir: str | None) -> dict:
    """The sampling keys of model_dir/generation_config.json ({} when absent or unreadable)."""
    if not model_dir:
        return {}
    path = os.path.join(model_dir, FILE_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("ignoring %s: %s", path, e)
        return {}
    if not isinstance(raw, dict):
        return {}
    if not raw.get("do_sample", False):
        return {"temperature": 0.0}
    return {k: raw[k] for k in KEYS if k in raw and k != "seed" and raw[k] is not None}


def sampling_defaults(model_dir: str | None, overrides: dict | None = None) -> SamplingDefaults:
    """Checkpoint defaults, then the non-None overrides (--generate-config)."""
    values = read_generation_config(model_dir)
    values.update({k: v for k, v in (overrides or {}).items() if k in KEYS and v is not None})
    if values.get("top_k", 0) < 0:
        values["top_k"] = 0  # -1 = off, as vLLM
    seed = values.pop("seed", None)
    return SamplingDefaults(SamplingKnobs(**{"temperature": DEFAULT_TEMPERATURE, **values}), seed)
