"""The golden reference for served tokens: transformers' DeepseekV4ForCausalLM in fp32.

    ref = GreedyReference(ckpt_dir)
    ref.generate(prompt_ids, num_new) -> list[int]   (memoised)

Greedy generate() with EOS switched off (the API's ignore_eos: EOS may be sampled and
generation goes on) and the engine's tie rule in every top-k: the lowest index wins.
"""

from __future__ import annotations

import copy

from dspark_testing.tie_rule import lowest_index_ties


class GreedyReference:
    def __init__(self, ckpt_dir: str):
        import torch
        from transformers import DeepseekV4ForCausalLM

        self.model = DeepseekV4ForCausalLM.from_pretrained(ckpt_dir, dtype=torch.float32).eval()
        self._memo: dict[tuple, list[int]] = {}

    def generation_config(self, num_new: int, pad_token_id: int | None = None):
        gc = copy.deepcopy(self.model.generation_config)
        gc.do_sample = False
        gc.eos_token_id = None  # the API's ignore_eos: EOS is a token like any other
        gc.pad_token_id = pad_token_id
        gc.max_new_tokens = num_new
        gc.min_new_tokens = None
        return gc

    def generate(self, prompt_ids: list[int], num_new: int) -> list[int]:
        key = (tuple(prompt_ids), num_new)
        if key not in self._memo:
            self._memo[key] = self.generate_batch([prompt_ids], num_new)[0]
        return self._memo[key]

    def generate_batch(self, prompts: list[list[int]], num_new: int) -> list[list[int]]:
        """Equal-length prompts only: this model's generate() is not padding-invariant."""
        import torch

        if len({len(p) for p in prompts}) != 1:
            raise ValueError("generate_batch needs prompts of one length (no padding)")
        ids = torch.tensor(prompts)
        with torch.no_grad(), lowest_index_ties():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=self.generation_config(num_new)
            )
        return out[:, ids.shape[1] :].tolist()
