"""The trained demo shipped in the package (dspark_loop/demo): intact, the default model,
lossless at K=7 on held-out prompts, and it writes readable text."""

from __future__ import annotations

import json
import os
import string
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from dspark_loop.config.default_model import (
    DEMO_DIR,
    DEMO_MANIFEST,
    default_model_dir,
    demo_is_complete,
)
from dspark_loop.engine.outputs import SamplingParams
from tests.integration.dspark.harness import run
from tools.train_demo.ship import file_sha256

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def manifest() -> dict:
    assert demo_is_complete(), f"the trained demo is missing or damaged under {DEMO_DIR}"
    with open(os.path.join(DEMO_DIR, DEMO_MANIFEST), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def prompts(manifest) -> dict[str, list[int]]:
    tok = Tokenizer.from_file(os.path.join(DEMO_DIR, "tokenizer.json"))
    texts = manifest["heldout_prompts"][:4]
    assert len(texts) == 4
    return {f"h{i}": [0] + tok.encode(t, add_special_tokens=False).ids for i, t in enumerate(texts)}


@pytest.fixture(scope="module")
def k0_batched(prompts):
    return run(DEMO_DIR, 0, prompts, {r: SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True) for r in prompts})


def test_manifest_hashes_match_the_shipped_files(manifest):
    """Every file the manifest lists must have its recorded size and sha256, the weights
    must stay within 25 MB, and the manifest must say how the model was made."""
    for name, meta in manifest["files"].items():
        path = os.path.join(DEMO_DIR, name)
        assert os.path.getsize(path) == meta["bytes"] and file_sha256(path) == meta["sha256"], name
    assert manifest["files"]["model.safetensors"]["bytes"] <= 25 * 10**6
    assert len(manifest["corpus_hash"]) == 64 and manifest["commands"]
    assert manifest["target"]["heldout_loss"] < manifest["target"]["heldout_loss_init"]


def test_the_server_default_is_the_shipped_demo_without_torch():
    """Without --model the server must pick the shipped demo, and choosing it must not
    import torch (nothing is built at start-up)."""
    code = (
        "import sys; from dspark_loop.config.default_model import default_model_dir;"
        "print(default_model_dir()); assert 'torch' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    assert out.stdout.strip() == DEMO_DIR == default_model_dir()


def test_k7_greedy_equals_k0_on_heldout_prompts_single_and_batched(prompts, k0_batched):
    """K=7 must give K=0's tokens, token for token, for held-out prompts run alone and
    batched, and the trained drafter must get more than one token per verify."""
    params = {r: SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True) for r in prompts}
    k7 = run(DEMO_DIR, 7, prompts, params)
    assert k7.tokens == k0_batched.tokens
    assert k7.summary["mean_accepted_len"] > 1.5
    alone = {"h1": prompts["h1"]}
    assert run(DEMO_DIR, 0, alone, {"h1": params["h1"]}).tokens["h1"] == k0_batched.tokens["h1"]
    assert run(DEMO_DIR, 7, alone, {"h1": params["h1"]}).tokens["h1"] == k0_batched.tokens["h1"]


def test_completions_of_heldout_prompts_are_readable(k0_batched):
    """Served completions must be text: no U+FFFD and at least 95% printable ASCII."""
    printable = set(string.printable)
    for rid, text in k0_batched.texts.items():
        assert text and "\ufffd" not in text, (rid, text)
        assert sum(ch in printable for ch in text) >= 0.95 * len(text), (rid, text)
