"""FakeEngine scripts for the chat route: reply with a given text, token by token, the way
the engine does for chat (special tokens kept as text)."""

from __future__ import annotations

from dspark_loop.engine.outputs import GenerateRequest, RequestOutput
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.api.fake_engine import FakeEngine


def text_reply(text: str, reason: str = "stop", *, cached: int = 0, stop_reason=None):
    """A script: `text`'s tokens one per delta; the last carries `reason`."""

    def script(g: GenerateRequest) -> list[RequestOutput]:
        tok = tiny_tokenizer()
        ids = tok.encode(text, add_special_tokens=False).ids
        outs, sent = [], ""
        for i, t in enumerate(ids):
            last = i == len(ids) - 1
            # NOTE: like the engine's detokenizer, hold back a character split over tokens.
            so_far = tok.decode(ids[: i + 1], skip_special_tokens=False)
            if so_far.endswith("\ufffd") and not last:
                so_far = sent
            delta, sent = so_far[len(sent) :], so_far
            outs.append(
                RequestOutput(
                    g.request_id,
                    [t],
                    delta,
                    finished=last,
                    finish_reason=reason if last else None,
                    num_prompt_tokens=len(g.prompt_token_ids),
                    num_output_tokens=i + 1,
                    num_cached_tokens=cached,
                    stop_reason=stop_reason if last else None,
                )
            )
        return outs

    return script


def chat_engine(text: str = "Hello.", reason: str = "stop", **kw) -> FakeEngine:
    return FakeEngine(script=text_reply(text, reason, **kw), max_model_len=4096)
