import numpy as np
import pytest

from dspark_loop.contract.acceptance import accept_chain
from dspark_loop.engine.finish_rules import FinishRules, truncate_at_finish
from tests.unit.engine.acceptance_cases import CASES, EOS_ID


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_accept_chain_keeps_the_matching_prefix_plus_one(case):
    """accept_chain must count the unbroken leading run of matching drafts, plus one."""
    got = accept_chain(np.array([case.drafts]), np.array([case.predictions]), np.array([case.verify_len]))
    assert got.tolist() == [case.num_accepted]
    if case.verify_len == 7:  # the fixed chain: no lengths
        assert accept_chain(np.array([case.drafts]), np.array([case.predictions])).tolist() == [case.num_accepted]


def test_accept_chain_is_vectorised_over_requests():
    """Each request's count must depend only on its own row (and its own window)."""
    drafts = np.array([c.drafts for c in CASES])  # [R, 7]
    preds = np.array([c.predictions for c in CASES])  # [R, 8]
    lens = np.array([c.verify_len for c in CASES])  # [R]
    assert accept_chain(drafts, preds, lens).tolist() == [c.num_accepted for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_short_window_ignores_whatever_lies_past_it(case):
    """Drafts and predictions past a request's verify length were never sent or computed:
    accept_chain must give the same count whatever they hold."""
    rng = np.random.default_rng(7)
    drafts, preds = np.array([case.drafts]), np.array([case.predictions])
    drafts[0, case.verify_len :] = rng.integers(0, 100, 7 - case.verify_len)
    preds[0, case.verify_len + 1 :] = rng.integers(0, 100, 7 - case.verify_len)
    assert accept_chain(drafts, preds, np.array([case.verify_len])).tolist() == [case.num_accepted]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_finish_truncation_cuts_the_accepted_list(case):
    """EOS and max_tokens must end the request at the first token that triggers them,
    even in the middle of an accepted list; that token is kept."""
    accepted = case.predictions[: case.num_accepted]
    rules = FinishRules(eos_token_ids=(EOS_ID,), max_tokens=case.max_tokens)
    kept, reason, _ = truncate_at_finish(accepted, case.num_output_before, 4, rules)
    assert tuple(kept) == case.kept
    assert reason == case.finish_reason


def test_eos_before_min_tokens_is_an_ordinary_token():
    """Before min_tokens outputs exist, EOS and stop ids must not finish the request."""
    rules = FinishRules(eos_token_ids=(EOS_ID,), stop_token_ids=(7,), min_tokens=3)
    kept, reason, _ = truncate_at_finish([EOS_ID, 7, EOS_ID, 5], 0, 4, rules)
    assert (kept, reason) == ([EOS_ID, 7, EOS_ID], "stop")


def test_ignore_eos_runs_to_max_tokens():
    """With ignore_eos the EOS token must not stop generation."""
    rules = FinishRules(eos_token_ids=(EOS_ID,), ignore_eos=True, max_tokens=2)
    assert truncate_at_finish([EOS_ID, EOS_ID, 3], 0, 4, rules)[:2] == ([EOS_ID, EOS_ID], "length")


def test_stop_token_id_is_reported_as_the_stop_reason():
    """A stop_token_ids hit must finish with "stop" and name the token."""
    rules = FinishRules(eos_token_ids=(EOS_ID,), stop_token_ids=(42,))
    assert truncate_at_finish([5, 42, 6], 0, 4, rules) == ([5, 42], "stop", 42)


def test_context_end_finishes_with_length():
    """Reaching max_model_len tokens (prompt + outputs) must finish with "length"."""
    rules = FinishRules(eos_token_ids=(EOS_ID,), max_model_len=10)
    assert truncate_at_finish([5, 6, 7, 8], 2, 6, rules)[:2] == ([5, 6], "length")
