"""The built-in training text for the tiny tokenizer: English, code, chat markup, unicode.

Generated from a few word lists with a fixed-seed random.Random so the corpus (and the
tokenizer trained on it) is the same on every machine; no file or network is read.
"""

from __future__ import annotations

import random

SUBJECTS = [
    "the model",
    "a request",
    "the scheduler",
    "every rank",
    "the server",
    "our cache",
    "the drafter",
    "a user",
    "this engine",
    "the tokenizer",
    "my friend",
    "the team",
    "a small test",
    "the old cat",
    "the river",
    "each block",
    "the compiler",
]
VERBS = [
    "reads",
    "writes",
    "sends",
    "finds",
    "keeps",
    "drops",
    "builds",
    "checks",
    "answers",
    "returns",
    "counts",
    "moves",
    "waits for",
    "opens",
    "closes",
    "accepts",
    "rejects",
]
OBJECTS = [
    "the next token",
    "a long prompt",
    "three blocks",
    "the whole batch",
    "a new lease",
    "the final answer",
    "some memory",
    "the first page",
    "a quick reply",
    "every step",
    "the stream",
    "ten requests",
    "the last row",
    "a green apple",
    "the morning news",
]
TAILS = [
    "before noon.",
    "again and again.",
    "without a sound.",
    "in one pass.",
    "on time.",
    "when it can.",
    "for the second time.",
    "and then stops.",
    "very quickly.",
    "today.",
]
QUESTIONS = [
    "What is the capital of France?",
    "How many tokens fit in one block?",
    "Can you explain speculative decoding?",
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "Please summarise the report in two lines.",
    "Which number is larger, 9.11 or 9.9?",
    "Translate 'good morning' to French.",
]
CODE = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Block:\n    def __init__(self, size: int) -> None:\n        self.size = size\n",
    "if (x > 0 && y < 10) { return x * y; } else { return -1; }\n",
    'import json\ndata = json.loads(\'{"a": [1, 2, 3], "b": null}\')\n',
    "SELECT name, count(*) FROM users WHERE age >= 18 GROUP BY name;\n",
    'fn main() { let v: Vec<u32> = (0..8).collect(); println!("{:?}", v); }\n',
    "x = torch.zeros(4, 8)  # [rows, dim]\nassert x.shape == (4, 8)\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n',
    "while (i < n) { sum += a[i]; i++; }\n",
]
CHAT = [
    '<tool_result>{"temperature": 21}</tool_result>',
    "<think>The user wants a short answer.</think>The answer is 42.",
    'tool_calls invoke name="search" parameter name="query" string="true"',
    "## Tools\n### Available Tool Schemas\nYou MUST strictly follow the format.",
    "Reasoning Effort: high. Think step by step, then answer.",
]
UNICODE = [
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "机器学习模型需要大量的数据和计算。",
    "深度求索发布了新的语言模型。",
    "请用中文回答这个问题。",
    "日本語の文章も少し含めます。",
    "こんにちは、元気ですか？",
    "한국어 문장도 조금 있습니다.",
    "Привет, как дела? Всё хорошо.",
    "Ça va très bien, merci beaucoup!",
    "Größe, Straße, Übung, naïve café, señor año.",
    "Emoji: 😀 😂 🎉 🚀 ❤️ 👍 🔥 ✨ 🤖 🌍",
    "Math: α + β = γ, ∑ x² ≤ ∞, π ≈ 3.14159.",
    "Arrows → ← ↑ ↓ and boxes ■ □ ▲ ▼ ★ ☆.",
    "数字 123 和字母 abc 混在一起。",
]


def corpus_lines(num_sentences: int = 900, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(num_sentences):
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}"
        lines.append(s[0].upper() + s[1:])
        if i % 5 == 0:
            lines.append(rng.choice(QUESTIONS))
        if i % 4 == 0:
            lines.append(rng.choice(CODE))
        if i % 6 == 0:
            lines.append(rng.choice(CHAT))
        if i % 3 == 0:
            lines.append(rng.choice(UNICODE))
        if i % 7 == 0:
            lines.append(f"{rng.randint(0, 99999)} + {rng.randint(0, 999)} = {rng.randint(0, 100999)}")
    return lines
