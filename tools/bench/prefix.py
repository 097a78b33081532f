"""Time to first token of a multi-turn chat with its prefix cached vs not cached.

    python -m tools.bench.prefix [--turns 4] [--system-repeat 12] [--reply-tokens 8]
        [--model DIR] [--flags "--block-size 8 --max-num-batched-tokens 256"]

Starts the server twice on the same checkpoint (default: a fresh tiny one), once as is
and once with --no-enable-prefix-caching, one after the other so they never share the
CPU. Each runs the same conversation through /v1/chat/completions (streamed, thinking
off, ignore_eos): a long system prompt, then every turn appends the previous answer and
a short new question. TTFT is the time from sending a turn to its first chunk (the role
chunk, sent with the first generated token). Prints per-turn TTFTs, the cached prompt
tokens, and the ratio of the later turns' mean TTFTs (no cache / cache). Runs from a
repository checkout (it uses the e2e harness in tests/e2e: run it with
`python -m` from the repository root, which puts the root on the import path). No pass/fail.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import tempfile
import time

from tools.bench import harness

SYSTEM = (
    "You are the support assistant of a small travel agency. Answer briefly, cite the "
    "booking rules when they apply, and never invent prices or dates. "
)
QUESTIONS = [
    "Can I move my Paris trip to next week?",
    "What about the hotel?",
    "And the train tickets?",
    "Is there a fee?",
    "Can I add a night in Lyon?",
    "Who do I call if the train is late?",
    "Thanks, anything else to know?",
]


def run_conversation(url: str, turns: int, system_repeat: int, reply_tokens: int) -> list[dict]:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    # NOTE: one short unmeasured request first: a rank's first forward pays one-off costs.
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi."}], max_tokens=2, reasoning_effort="none"
    )
    messages = [{"role": "system", "content": SYSTEM * system_repeat}]
    rows = []
    for t in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
        t0 = time.perf_counter()
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=reply_tokens,
            stream=True,
            stream_options={"include_usage": True},
            reasoning_effort="none",
            extra_body={"ignore_eos": True},
        )
        ttft, text, usage = None, [], None
        for chunk in stream:
            if ttft is None:
                ttft = time.perf_counter() - t0
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
            if chunk.usage is not None:
                usage = chunk.usage
        messages.append({"role": "assistant", "content": "".join(text)})
        rows.append(
            {
                "ttft_s": ttft,
                "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": usage.prompt_tokens_details.cached_tokens,
                "text": "".join(text),
            }
        )
    return rows


def bench(ckpt: str, flags: list[str], args) -> list[dict]:
    from dspark_testing.server_process import ServerProcess

    server = ServerProcess(["--model", ckpt, "--log-level", "warning", *flags], timeout_s=900)
    try:
        return run_conversation(server.url, args.turns, args.system_repeat, args.reply_tokens)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser("prefix", __doc__)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-repeat", type=int, default=12, help="copies of the system sentence")
    ap.add_argument("--reply-tokens", type=int, default=8)
    ap.add_argument(
        "--flags",
        default="--block-size 8 --max-model-len 4096 --max-num-batched-tokens 256",
        help="server flags for both runs",
    )
    args = ap.parse_args(argv)
    flags = shlex.split(args.flags)
    with tempfile.TemporaryDirectory(prefix="dspark-bench-prefix-") as tmp:
        ckpt = args.model or harness.tiny_checkpoint(tmp)
        print("... prefix caching on", flush=True)
        cached = bench(ckpt, flags, args)
        print("... prefix caching off", flush=True)
        plain = bench(ckpt, [*flags, "--no-enable-prefix-caching"], args)
    rows = [
        {**a, "turn": t, "ttft_uncached_s": b["ttft_s"], "same_text": str(a["text"] == b["text"])}
        for t, (a, b) in enumerate(zip(cached, plain), 1)
    ]
    harness.table(
        rows,
        [
            ("turn", "turn", "d"),
            ("prompt", "prompt_tokens", "d"),
            ("cached", "cached_tokens", "d"),
            ("ttft cache (s)", "ttft_s", ".3f"),
            ("ttft no cache (s)", "ttft_uncached_s", ".3f"),
            ("same text", "same_text", ""),
        ],
    )
    later_a = statistics.mean(r["ttft_s"] for r in cached[1:])
    later_b = statistics.mean(r["ttft_s"] for r in plain[1:])
    print(
        f"turns 2..{args.turns}: mean TTFT {later_a:.3f}s cached vs {later_b:.3f}s uncached; "
        f"ratio (uncached / cached) = {later_b / later_a:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
