"""A small byte-level BPE built in memory with the tokenizers library (no downloads)."""
from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS = "<bos>", "<eos>"
CORPUS = [
    "the quick brown fox jumps over the lazy dog. hello world! stop here, STOP now.",
    "héllo wörld, ça va? naïve café. 日本語のテキスト。中文也可以。 emoji: 😀 🚀 ✨",
    "def main():\n    return 42\n# END of file\n<|done|> done. The end.",
]


@functools.lru_cache(maxsize=1)
def make_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


def eos_id() -> int:
    return make_tokenizer().token_to_id(EOS)


def bos_id() -> int:
    return make_tokenizer().token_to_id(BOS)
