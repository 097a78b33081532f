"""lm-evaluation-harness against a real server: its local-completions model runs a
loglikelihood (multiple-choice) task and a generate_until task from a local data file, and
the loglikelihoods it reads from our echo + logprobs answers equal transformers'."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_testing.tie_rule import lowest_index_ties

lm_eval = pytest.importorskip("lm_eval")

DOCS = [
    {"question": "The capital of the moon is", "choices": [" cheese", " rock", " dust"], "answer": 1},
    {"question": "Two plus two equals", "choices": [" four", " five"], "answer": 0},
    {"question": "Water is made of", "choices": [" hydrogen and oxygen", " gold"], "answer": 0},
]

LL_TASK = """task: dspark_ll
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""

GEN_TASK = """task: dspark_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: ["."]
  max_gen_toks: 6
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_tasks")
    data = d / "docs.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (d / "dspark_ll.yaml").write_text(LL_TASK.format(data=data))
    (d / "dspark_gen.yaml").write_text(GEN_TASK.format(data=data))
    return str(d)


# NOTE: slow: lm-eval's own import and task loading dominate (~100 s on 2 busy cores). The
# default suite checks what it reads, echo + logprobs equal to transformers' log_softmax:
# test_sampling_served.py::test_echoed_prompt_and_sampled_logprobs_equal_transformers_log_softmax
@pytest.mark.slow
def test_lm_eval_loglikelihoods_equal_transformers_and_generate_until_runs(server1, tiny_ckpt, tasks_dir, reference):
    """Both tasks must run to a metric; every (context, continuation) loglikelihood lm-eval
    got from the server must equal the sum of transformers' log_softmax over the
    continuation tokens (fp32 rounding), and is_greedy must match the reference argmax."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    model_args = {
        "base_url": server1.url + "/v1/completions",
        "tokenizer": tiny_ckpt,
        "tokenizer_backend": "huggingface",
        "tokenized_requests": True,
        "max_length": 512,
        "model": "tiny",
        "num_concurrent": 1,
        "max_retries": 1,
    }
    out = simple_evaluate(
        model="local-completions",
        model_args=model_args,
        tasks=["dspark_ll", "dspark_gen"],
        task_manager=TaskManager(include_path=tasks_dir),
        log_samples=True,
    )
    assert "acc,none" in out["results"]["dspark_ll"]
    assert "exact_match,none" in out["results"]["dspark_gen"]
    assert len(out["samples"]["dspark_gen"]) == len(DOCS)
    from lm_eval.api.registry import get_model

    lm = get_model("local-completions")(**model_args)
    checked = 0
    for sample in out["samples"]["dspark_ll"]:
        for (context, continuation), (ll, greedy) in zip(sample["arguments"], [r[0] for r in sample["resps"]]):
            ctx_ids, cont_ids = lm._encode_pair(context, continuation)
            seq = ctx_ids + cont_ids
            with torch.no_grad(), lowest_index_ties():
                logits = reference.model(torch.tensor([seq])).logits[0].double()
            lp = torch.log_softmax(logits, dim=-1)
            rows = range(len(ctx_ids) - 1, len(seq) - 1)
            want = sum(float(lp[r, seq[r + 1]]) for r in rows)
            assert abs(float(ll) - want) < 1e-3 * len(cont_ids), (context, continuation, ll, want)
            assert bool(greedy) == all(int(lp[r].argmax()) == seq[r + 1] for r in rows)
            checked += 1
    assert checked == sum(len(d["choices"]) for d in DOCS)
