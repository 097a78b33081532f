"""The local byte-level BPE tokenizer: exact special tokens, exact vocab size, lossless."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from dspark_loop.contract.model_config import ModelConfig

SPECIALS = {
    "<｜begin▁of▁sentence｜>": 0,
    "<｜end▁of▁sentence｜>": 1,
    "<｜User｜>": 2,
    "<｜Assistant｜>": 3,
    "<think>": 4,
    "</think>": 5,
    "｜DSML｜": 6,
    "<｜place▁holder▁no▁799｜>": 7,
}
TEXTS = [
    "Hello, world! The scheduler reads 3 blocks in one pass.",
    "  leading spaces, trailing tabs\t\n\nand blank lines\n",
    "def add(a, b):\n    return a + b  # [rows, dim]\n",
    "你好，世界！深度求索。日本語もあります。한국어",
    "emoji 😀🎉🚀 ❤️ 👍🏽 and rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 plus \u0000 control",
    "<｜User｜>What is 9.11 - 9.9?<｜Assistant｜><think>hmm</think>0.21<｜end▁of▁sentence｜>",
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n</｜DSML｜invoke>',
]


@pytest.fixture(scope="module")
def tok(tiny_ckpt) -> Tokenizer:
    return Tokenizer.from_file(f"{tiny_ckpt}/tokenizer.json")


@pytest.mark.parametrize("text", TEXTS)
def test_every_string_round_trips(tok, text):
    """decode(encode(s)) must give back s exactly: ASCII, whitespace, CJK, emoji, markup."""
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_ids_at_fixed_positions(tok):
    """Each DeepSeek marker must encode to exactly its one id, also inside running text."""
    for text, want in SPECIALS.items():
        assert tok.encode(text, add_special_tokens=False).ids == [want]
        assert tok.id_to_token(want) == text
        ids = tok.encode(f"a{text}b", add_special_tokens=False).ids
        assert want in ids and len(ids) == 3


def test_encoding_never_adds_bos(tok):
    """Prompts are tokenised as-is: even add_special_tokens=True must not prepend BOS."""
    assert 0 not in tok.encode("hello", add_special_tokens=True).ids


def test_vocab_size_equals_config(tiny_ckpt, tok, make_ckpt):
    """Every id the head can emit must decode: tokenizer vocab == config vocab_size."""
    assert tok.get_vocab_size(with_added_tokens=True) == ModelConfig.from_dir(tiny_ckpt).vocab_size
    other = make_ckpt(seed=0, vocab_size=2000)  # more than the corpus can merge: padded
    t2 = Tokenizer.from_file(f"{other}/tokenizer.json")
    assert t2.get_vocab_size(with_added_tokens=True) == 2000
    assert all(t2.id_to_token(i) is not None for i in range(2000))


def test_multibyte_text_has_learned_tokens(tok):
    """Merges must cover multi-byte text (CJK), not only raw bytes."""
    text = "你好，世界！"
    assert len(tok.encode(text, add_special_tokens=False).ids) < len(text.encode("utf-8"))


def test_tokenizer_config_names_bos_eos_and_disables_auto_bos(tiny_ckpt):
    """tokenizer_config.json must name bos/eos/pad and set add_bos_token false."""
    with open(f"{tiny_ckpt}/tokenizer_config.json", encoding="utf-8") as f:
        cfg = json.load(f)
    assert cfg["bos_token"] == "<｜begin▁of▁sentence｜>"
    assert cfg["eos_token"] == cfg["pad_token"] == "<｜end▁of▁sentence｜>"
    assert cfg["add_bos_token"] is False
    with open(f"{tiny_ckpt}/generation_config.json", encoding="utf-8") as f:
        gen = json.load(f)
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["do_sample"]) == (0, 1, False)


def test_transformers_fast_tokenizer_reads_the_directory(tiny_ckpt):
    """AutoTokenizer must load the directory offline and agree with tokenizers."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_ckpt)
    assert hf.bos_token_id == 0 and hf.eos_token_id == 1
    assert hf.decode(hf.encode(TEXTS[3], add_special_tokens=False)) == TEXTS[3]
