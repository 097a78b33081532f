"""Golden references: tiny random transformers DeepseekV4ForCausalLM models that exercise
every path (non-zero sinks, ape, gate biases, random tid2eid, a decisive head), saved with
save_pretrained and loaded back through our own loader."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dspark_loop.contract.protocol import BlockUpdate, RankConfig, i32
from dspark_testing.tie_rule import lowest_index_ties
from workers.runner import ModelRunner
from workers.staging import Segment

BLOCK_SIZE = 8
NUM_BLOCKS = 96

CONFIGS = {
    # sliding, CSA and HCA layers; hash + routed MoE; tiny window and ratios so ~100-300
    # token prompts emit many compressed entries and the indexer's top-k really selects.
    "mixed": dict(
        layer_types=[
            "sliding_attention",
            "compressed_sparse_attention",
            "heavily_compressed_attention",
            "compressed_sparse_attention",
        ],
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        sliding_window=8,
        index_topk=4,
    ),
    # HCA first, two hash layers, ratio 16, a larger window and top-k.
    "hca16": dict(
        layer_types=["heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention"],
        mlp_layer_types=["hash_moe", "hash_moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        sliding_window=16,
        index_topk=6,
    ),
}


def make_config(**overrides):
    from transformers import DeepseekV4Config

    base = dict(
        vocab_size=512,
        hidden_size=64,
        moe_intermediate_size=32,
        num_attention_heads=4,
        head_dim=32,
        q_lora_rank=32,
        partial_rotary_factor=0.25,
        n_routed_experts=8,
        num_experts_per_tok=2,
        o_groups=2,
        o_lora_rank=16,
        index_n_heads=2,
        index_head_dim=16,
        hc_mult=4,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    )
    base.update(overrides)
    base["num_hidden_layers"] = len(base["layer_types"])
    return DeepseekV4Config(**base)


def make_reference(seed: int, **overrides):
    """A random model whose every parameter is non-trivial and whose head is decisive."""
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    cfg = make_config(**overrides)
    model = DeepseekV4ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "position_bias")):
                p.normal_(0, 0.5)
            elif name.endswith("hc_base") or name.endswith(".base"):
                p.normal_(0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.3)
            elif name.endswith("tid2eid"):
                b.copy_(torch.randint(0, cfg.n_routed_experts, b.shape))
        # NOTE: a decisive head (logits spread by several units): random models otherwise
        # sit on near-ties, and any correct change of summation order flips greedy tokens.
        model.lm_head.weight.mul_(60.0)
    return model


@torch.no_grad()
def reference_logits(model, token_ids) -> torch.Tensor:
    with lowest_index_ties():
        return model(torch.tensor([list(token_ids)])).logits[0].float()  # [n, V]


@torch.no_grad()
def reference_greedy(model, prompt, num_new: int) -> list[int]:
    """transformers' cached decode, one token at a time, with the tie rule."""
    from transformers import DynamicCache

    with lowest_index_ties():
        cache = DynamicCache(config=model.config)
        out = model(torch.tensor([list(prompt)]), cache=cache, use_cache=True)
        toks = []
        for _ in range(num_new):
            t = int(out.logits[0, -1].argmax())
            toks.append(t)
            out = model(torch.tensor([[t]]), cache=out.cache, use_cache=True)
        return toks


@dataclass
class Ref:
    name: str
    model: object
    path: str
    vocab_size: int


def make_ref(tmp_path_factory, name: str, seed: int) -> Ref:
    model = make_reference(seed, **CONFIGS[name])
    path = str(tmp_path_factory.mktemp(name))
    model.save_pretrained(path)
    return Ref(name, model, path, model.config.vocab_size)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def ref(request, tmp_path_factory) -> Ref:
    return make_ref(tmp_path_factory, request.param, seed=1234 + sorted(CONFIGS).index(request.param))


@pytest.fixture(scope="module")
def mixed_ref(tmp_path_factory) -> Ref:
    return make_ref(tmp_path_factory, "mixed", seed=1234)


class Driver:
    """Drives a ModelRunner by hand: maps pages, runs segments, decodes greedily."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.next_block = [0] * len(runner.layout.families)
        self.mapped: dict[int, list[int]] = {}

    def map(self, req_id: int, num_tokens: int) -> None:
        """Pages for positions [0, num_tokens) of every family (fresh blocks)."""
        have = self.mapped.setdefault(req_id, [0] * len(self.next_block))
        for fam in self.runner.layout.families:
            need = fam.num_pages(num_tokens) - have[fam.index]
            if need <= 0:
                continue
            ids = range(self.next_block[fam.index], self.next_block[fam.index] + need)
            self.next_block[fam.index] += need
            self.runner.tables.apply(BlockUpdate(req_id, fam.index, have[fam.index], i32(ids)))
            have[fam.index] += need

    def prefill(self, req_id: int, tokens, start: int = 0, sample: bool = True):
        self.map(req_id, start + len(tokens))
        seg = Segment(
            req_id,
            start,
            np.asarray(tokens, np.int32),
            len(tokens),
            np.array([len(tokens) - 1] if sample else [], np.int64),
        )
        return self.runner.forward([seg])

    def run(self, segments):
        for s in segments:
            self.map(s.req_id, s.start_pos + len(s.token_ids))
        return self.runner.forward(segments)


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(2, vocab, n).tolist()


def new_runner(path: str, shard=None, comm=None, hadamard: bool = True, **rank_options) -> ModelRunner:
    """rank_options: RankConfig fields (dtype, num_blocks, ...)."""
    rank_options.setdefault("num_blocks", NUM_BLOCKS)
    cfg = RankConfig(model=path, block_size=BLOCK_SIZE, **rank_options)
    return ModelRunner(cfg, shard, comm, quiet=True, hadamard=hadamard)
