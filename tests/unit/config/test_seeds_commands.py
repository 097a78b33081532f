"""The seeds' two command lines, pasted as their pages print them, start under our entry.

Only the program name changes (`pypto-serving`, `python -m pypto_serving.cli` -> ours) and
--model points at a tiny W8A8 checkpoint with the DSpark drafter; every other flag and
value is the page's, run through the parser and the start-up rules (config.validate).
"""

from __future__ import annotations

import pytest

from dspark_loop.config.cli import load_config, parse_args
from dspark_loop.config.rank_config import rank_config
from dspark_loop.contract.protocol import DEFAULT_RING_HEAP
from tests.unit.config.seeds import PAGES, seeds_argv

GIB = 2**30


@pytest.fixture(scope="module")
def w8a8_ckpt(tmp_path_factory) -> str:
    from tools.make_checkpoint import make_checkpoint

    out = tmp_path_factory.mktemp("seeds") / "dsv4-flash-w8a8"
    return make_checkpoint(str(out), size="tiny", w8a8=True, with_drafter=True, quiet=True)


@pytest.mark.parametrize("k", [0, 7])
@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_seeds_command_line_passes_the_parser_and_the_start_up_rules(page, k, w8a8_ckpt):
    """Each page's command, verbatim but for the program and the checkpoint, must load at
    K=0 and K=7 with the page's values, its runtime sizing handed on to every rank."""
    cfg, model = load_config(seeds_argv(PAGES[page], w8a8_ckpt, k))
    assert (cfg.dp, cfg.ep, cfg.tp, cfg.devices) == (4, 16, 4, tuple(range(16)))
    assert (cfg.block_size, cfg.max_model_len, cfg.max_num_seqs) == (32, 1024, 8)
    assert (cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold) == (8192, 128)
    assert (cfg.num_speculative_tokens, cfg.enable_prefix_caching, cfg.port) == (k, False, 8000)
    assert cfg.platform == "a2a3"
    assert cfg.ring_heap == (2 * GIB, 2 * GIB, 4 * GIB, 8 * GIB) == DEFAULT_RING_HEAP
    assert cfg.backend == ("npu" if page == "dev-notes" else "cpu")
    ranks = rank_config(cfg)
    assert (ranks.ring_heap, ranks.spec_k, ranks.world_size) == (cfg.ring_heap, k, 16)


def test_one_ring_heap_size_serves_every_scope_depth():
    """--ring-heap with one integer must size all four scope depths alike."""
    assert parse_args(["--ring-heap", "4096"]).ring_heap == (4096,) * 4
    assert parse_args([]).ring_heap == DEFAULT_RING_HEAP and parse_args([]).platform is None


@pytest.mark.parametrize("text", ["0", "1,2", "1,2,3,4,5", "1,2,x,4", "-1", "1,,2,3", "2GiB", ""])
def test_a_ring_heap_that_is_not_one_or_four_positive_integers_exits_2(text, capsys):
    """The seeds' rule: one positive integer or four comma-separated ones, else exit 2
    naming --ring-heap."""
    with pytest.raises(SystemExit) as e:
        parse_args(["--ring-heap", text])
    assert e.value.code == 2
    assert "argument --ring-heap: must be one positive integer or 4" in capsys.readouterr().err


def test_an_unknown_platform_exits_2_naming_the_choices(capsys):
    """--platform must be one of the seeds' platform names."""
    with pytest.raises(SystemExit) as e:
        parse_args(["--platform", "a3"])
    assert e.value.code == 2
    assert "argument --platform: invalid choice: 'a3'" in capsys.readouterr().err


def test_a_weight_bank_larger_than_the_model_is_a_start_up_error(w8a8_ckpt, capsys):
    """--weight-bank-size (the dev notes' all-layer resident banks) must be 1..num_hidden_layers."""
    cfg, model = load_config(["--model", w8a8_ckpt, "--weight-bank-size", str(6)])
    assert cfg.weight_bank_size == model.num_hidden_layers == 6
    with pytest.raises(SystemExit) as e:
        load_config(["--model", w8a8_ckpt, "--weight-bank-size", "43"])
    assert e.value.code == 2
    assert "--weight-bank-size must be 1..num_hidden_layers = 6" in capsys.readouterr().err
