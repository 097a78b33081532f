"""ScriptedRunner: a test double that answers scripted prompts with scripted tokens.

Selected only by tests: DSPARK_TEST_RUNNER=dspark_testing.scripted_runner:ScriptedRunner and
DSPARK_TEST_SCRIPT=/path/script.json, a list of entries

    {"key": "What is 2+2?<｜Assistant｜><think>", "output": "r</think>4"}   (or "output_ids")

A request whose prompt text (special tokens included) ends with a key gets that entry's
output tokens, then EOS forever, in place of the model's greedy predictions (the longest
matching key wins). Every other request, and the forward itself, runs the real model, so
the collectives, caches and timings are untouched. Limits: prompts are matched on the
tokens the ranks are sent, so a prefix-cache hit that covers the key hides it (run
scripted servers with --no-enable-prefix-caching); a request re-admitted after preemption
re-prefills its outputs too and is no longer recognised; at K=7 the rank-side drafter
still sees the model's own tokens (use K=0).
"""

from __future__ import annotations

import json
import os

import numpy as np
from tokenizers import Tokenizer

from dspark_loop.contract.protocol import PartitionPlan, RankConfig, as_i8, as_i32
from workers.runner import ModelRunner

SCRIPT_ENV = "DSPARK_TEST_SCRIPT"


def load_script(path: str, tokenizer: Tokenizer) -> list[tuple[str, list[int]]]:
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    script = []
    for e in entries:
        ids = e["output_ids"] if "output_ids" in e else tokenizer.encode(e["output"], add_special_tokens=False).ids
        script.append((e["key"], [int(t) for t in ids]))
    return sorted(script, key=lambda kv: -len(kv[0]))  # longest key first


class ScriptedRunner(ModelRunner):
    def __init__(self, cfg: RankConfig, *args, **kwargs) -> None:
        super().__init__(cfg, *args, **kwargs)
        self.tokenizer = Tokenizer.from_file(os.path.join(cfg.model, "tokenizer.json"))
        path = os.environ.get(SCRIPT_ENV)
        self.script = load_script(path, self.tokenizer) if path else []
        self.eos_id = self.cfg.eos_token_id
        self._seen: dict[int, list[int]] = {}  # req_id -> prompt tokens prefilled so far
        self._active: dict[int, tuple[list[int], int]] = {}  # req_id -> (output ids, prompt_len)

    def scripted_token(self, req_id: int, index: int) -> int:
        ids = self._active[req_id][0]
        return ids[index] if 0 <= index < len(ids) else self.eos_id

    def _match(self, prompt_ids: list[int]) -> list[int] | None:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        for key, ids in self.script:
            if text.endswith(key):
                return ids
        return None

    def execute(self, part: PartitionPlan, late_masks=None) -> np.ndarray:
        for req_id in part.freed_req_ids:
            self._seen.pop(req_id, None)
            self._active.pop(req_id, None)
        for chunk in part.prefills:
            self._seen.setdefault(chunk.req_id, []).extend(as_i32(chunk.token_ids).tolist())
        tokens = np.array(super().execute(part, late_masks), dtype=np.int32)  # [L]
        row = 0
        for chunk in part.prefills:
            if not chunk.sample:
                continue
            ids = self._match(self._seen.pop(chunk.req_id, []))
            if ids is not None:
                prompt_len = chunk.start_pos + len(as_i32(chunk.token_ids))
                self._active[chunk.req_id] = (ids, prompt_len)
                tokens[row] = self.scripted_token(chunk.req_id, 0)
            row += 1
        d = part.decode
        if d is not None:
            starts = as_i32(d.start_pos).tolist()
            for req_id, start, n in zip(as_i32(d.req_ids).tolist(), starts, as_i8(d.num_rows).tolist()):
                if req_id in self._active:
                    prompt_len = self._active[req_id][1]
                    for j in range(n):  # row j at position start+j predicts position start+j+1
                        tokens[row + j] = self.scripted_token(req_id, start + j + 1 - prompt_len)
                row += n
        return tokens
