"""Resumable training state and checkpoint directories.

DIR/<stage>/state.pt     model + optimizer + step + rng, rewritten atomically every few steps
DIR/<stage>/model/       a servable checkpoint directory (config.json, model.safetensors,
                         tokenizer, generation_config.json), weights rounded to bf16
"""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import save_file

from dspark_loop.checkpoint.config import generation_config


def save_state(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_state(path: str) -> dict | None:
    return torch.load(path, weights_only=False) if os.path.exists(path) else None


def bf16_round(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Float tensors -> bfloat16 (what ships); integer tensors (tid2eid) unchanged."""
    return {
        k: (v.detach().to(torch.bfloat16) if v.dtype.is_floating_point else v.detach()).contiguous()
        for k, v in state.items()
    }


def write_model_dir(out: str, config: dict, tensors: dict[str, torch.Tensor], tokenizer_dir: str) -> str:
    """A servable checkpoint directory, written aside and renamed into place."""
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), {"format": "pt"})
    for name, obj in (("config.json", config), ("generation_config.json", generation_config())):
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(tmp, name))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
