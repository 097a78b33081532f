"""Factories for scheduler tests: requests, a fake mesh, a step driver; the tiny cache
layout and the scheduler factory come from dspark_testing.schedulers (re-exported)."""

from __future__ import annotations

from dspark_loop.engine.detokenize import Detokenizer, TokenText
from dspark_loop.engine.outputs import GenerateRequest, SamplingParams
from dspark_loop.engine.scheduler import Scheduler
from dspark_testing.schedulers import make_scheduler as make_scheduler
from dspark_testing.schedulers import tiny_layout as make_layout  # noqa: F401 -- re-exported
from dspark_testing.tiny_tokenizer import tiny_tokenizer
from tests.unit.engine.fake_mesh import FakeMesh

_TEXT: list[TokenText] = []


def token_text() -> TokenText:
    if not _TEXT:
        _TEXT.append(TokenText(tiny_tokenizer()))
    return _TEXT[0]


def allowed_tokens() -> list[int]:
    """Ordinary tokens (not special) the fake model may emit."""
    special = token_text().special_ids
    return [i for i in range(2, tiny_tokenizer().get_vocab_size()) if i not in special]


def make_mesh(sched: Scheduler, script=None) -> FakeMesh:
    return FakeMesh(sched.layout, len(sched.partitions), allowed_tokens(), script)


def prompt_ids(i: int, prompt_len: int) -> list[int]:
    allowed = allowed_tokens()
    return [allowed[(i * 7 + j * 3) % len(allowed)] for j in range(prompt_len)]


def make_requests(sched: Scheduler, n: int, prompt_len: int = 8, max_tokens: int = 16, first: int = 0, **params):
    reqs = []
    for i in range(first, first + n):
        sp = SamplingParams(max_tokens=max_tokens, **params)
        g = GenerateRequest(f"req-{i}", prompt_ids(i, prompt_len), sp)
        det = Detokenizer(token_text(), sp.stop, sp.include_stop_str_in_output)
        reqs.append(sched.make_request(g, det))
    return reqs


def run_step(sched: Scheduler, mesh: FakeMesh):
    step = sched.schedule()
    results = [] if step.is_empty else mesh.run(step.plan)
    return step, sched.update(step, results)


def run_to_completion(sched: Scheduler, mesh: FakeMesh, max_steps: int = 1000, check: bool = True) -> dict[str, list]:
    """request_id -> the RequestOutputs it received, in order."""
    got: dict[str, list] = {}
    for _ in range(max_steps):
        if not sched.has_work:
            return got
        _, outs = run_step(sched, mesh)
        for o in outs:
            got.setdefault(o.request_id, []).append(o)
        if check:
            sched.check_integrity()
    raise AssertionError("requests did not finish")


def tokens_of(outputs) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


def text_of(outputs) -> str:
    return "".join(o.new_text for o in outputs)
