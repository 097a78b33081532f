"""Times our paged forward beside transformers on the same random weights (CPU).

    python -m tools.bench.model [--requests 8] [--prefill 256] [--context 128] [--reps 5]
        [--model tiny|DIR] [--threads N] [--profile TOP]

Measures one decode step of R requests (1 row each, then 8-row verify tiles), one prefill
of N tokens, and transformers' cached decode per token (batch 1); prints the ratios.
--model tiny: the tiny random checkpoint (tools.make_checkpoint's) (default: a transformers-built one).
--profile TOP: torch.profiler's TOP ops by self CPU time for each case, and aten ops per step.
Times are the median of --reps; also the thread CPU time (min), steadier on a shared machine.
No assertions: numbers only.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import numpy as np
import torch

from dspark_loop.contract.protocol import BlockUpdate, RankConfig, i32
from tools.bench import harness
from workers.runner import ModelRunner
from workers.staging import Segment


def make_reference(path: str, layers: int, hidden: int):
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    kinds = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
    cfg = DeepseekV4Config(
        vocab_size=4096,
        hidden_size=hidden,
        moe_intermediate_size=hidden // 2,
        num_attention_heads=8,
        head_dim=64,
        q_lora_rank=hidden // 2,
        partial_rotary_factor=0.25,
        n_routed_experts=16,
        num_experts_per_tok=4,
        o_groups=4,
        o_lora_rank=64,
        index_n_heads=4,
        index_head_dim=32,
        index_topk=16,
        sliding_window=64,
        num_hidden_layers=layers,
        layer_types=[kinds[min(i, 1) + (i > 1 and i % 2 == 0)] for i in range(layers)],
        mlp_layer_types=["hash_moe"] + ["moe"] * (layers - 1),
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
    )
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model


def timed(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_timed(fn, reps: int) -> float:
    """The least thread CPU time of reps calls (time.thread_time: preemption does not count)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return min(times)


def profile(name: str, fn, top: int, reps: int = 5) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fn()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
    events = prof.key_averages()
    print(f"\n== {name}: {sum(e.count for e in events) / reps:.0f} aten ops per step ==")
    print(events.table(sort_by="self_cpu_time_total", row_limit=top))


def load_reference(model: str | None, a):
    """(checkpoint dir, transformers model): a built one, the tiny checkpoint, or a directory."""
    if model is None:
        path = tempfile.mkdtemp(prefix="bench_model_")
        return path, make_reference(path, a.layers, a.hidden)
    if model == "tiny":
        model = harness.tiny_checkpoint()
    from transformers import DeepseekV4ForCausalLM

    return model, DeepseekV4ForCausalLM.from_pretrained(model, dtype=torch.float32).eval()


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(
        "model", __doc__, model_help="'tiny' or a checkpoint directory (default: a transformers-built one, made here)"
    )
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--context", type=int, default=128, help="tokens already cached per decode request")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--profile", type=int, default=0, metavar="TOP", help="print the TOP ops per case")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    path, ref = load_reference(a.model, a)
    vocab = ref.config.vocab_size
    block = 32
    runner = ModelRunner(RankConfig(model=path, block_size=block, num_blocks=4096), quiet=True)
    rng = np.random.default_rng(0)
    total = a.context + a.prefill + 16
    for req in range(a.requests + 1):
        for fam in runner.layout.families:
            n = fam.num_pages(total)
            runner.tables.apply(BlockUpdate(req, fam.index, 0, i32(range(req * n, (req + 1) * n))))
    ctx = rng.integers(2, vocab, a.context).astype(np.int32)
    runner.forward([Segment(r, 0, ctx, len(ctx), np.array([len(ctx) - 1])) for r in range(a.requests)])

    def decode(rows: int):
        segs = [
            Segment(r, a.context, rng.integers(2, vocab, rows).astype(np.int32), rows, np.arange(rows))
            for r in range(a.requests)
        ]
        return lambda: runner.forward(segs)

    prompt = rng.integers(2, vocab, a.prefill).astype(np.int32)
    prefill = [Segment(a.requests, 0, prompt, len(prompt), np.array([len(prompt) - 1]))]
    cases = {
        f"decode 1 row x {a.requests}": decode(1),
        f"verify 8 rows x {a.requests}": decode(8),
        f"prefill {a.prefill}": lambda: runner.forward(prefill),
    }
    if a.profile:
        for name, fn in cases.items():
            profile(name, fn, a.profile)
    t_dec1, t_dec8, t_pre = (timed(fn, a.reps) for fn in cases.values())
    for name, fn in cases.items():
        print(f"ours  {name}: thread CPU {cpu_timed(fn, a.reps) * 1e3:.2f} ms/step (min)")

    from transformers import DynamicCache

    with torch.no_grad():
        cache = DynamicCache(config=ref.config)
        out = ref(torch.from_numpy(ctx[None].astype(np.int64)), cache=cache, use_cache=True)
        tok = torch.tensor([[5]])

        def hf_step():
            nonlocal out
            out = ref(tok, cache=out.cache, use_cache=True)

        t_hf = timed(hf_step, a.reps)
        t_hf_pre = timed(lambda: ref(torch.from_numpy(prompt[None].astype(np.int64))), a.reps)

    c = ref.config
    print(f"model: {c.num_hidden_layers} layers, hidden {c.hidden_size}; {a.requests} requests at context {a.context}")
    print(f"ours  decode 1 row x {a.requests}:  {t_dec1 * 1e3:8.2f} ms/step  {t_dec1 / a.requests * 1e3:7.2f} ms/token")
    print(
        f"ours  verify 8 rows x {a.requests}: {t_dec8 * 1e3:8.2f} ms/step  "
        f"{t_dec8 / (8 * a.requests) * 1e3:7.2f} ms/row"
    )
    print(f"ours  prefill {a.prefill}:           {t_pre * 1e3:8.2f} ms")
    print(f"hf    cached decode (batch 1): {t_hf * 1e3:8.2f} ms/token")
    print(f"hf    prefill {a.prefill}:           {t_hf_pre * 1e3:8.2f} ms")
    print(
        f"ratio ours per-token decode / hf: {t_dec1 / a.requests / t_hf:.2f}; ours prefill / hf: {t_pre / t_hf_pre:.2f}"
    )


if __name__ == "__main__":
    main()
