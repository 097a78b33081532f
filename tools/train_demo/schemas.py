"""Random JSON schemas for the drafter's constrained rollouts (redraft --constrained-share):
what a structured-output user's requests look like to the drafter (response_format
json_schema), without any one schema's shape.

A schema is an object of 2-5 properties, keys drawn from KEYS, each value one of: a string
(maxLength 8-24), an integer (with or without bounds), a boolean, an enum of 2-4 words, an
array of 1-4 strings or integers, all required. Key order and types vary from schema to
schema, so the drafter learns JSON's punctuation and the target's habits under a grammar
mask (e.g. the demo target spells an unknown key letter by letter), not one document.
NOTE: tools.bench.demo.SCHEMA is not in the pool; its keys are common words and may be.
"""

from __future__ import annotations

import numpy as np

KEYS = (
    "id name path value count items mode flags size type title tags enabled version author "
    "encoding level offset limit args returns pure key data status kind source target file "
    "line text label index"
).split()
WORDS = "int str list None bool dict bytes float tuple set read write auto".split()


def random_schema(rng: np.random.Generator) -> dict:
    keys = rng.choice(KEYS, size=int(rng.integers(2, 6)), replace=False).tolist()
    props = {k: _value(rng) for k in keys}
    return {"type": "object", "properties": props, "required": keys}


def _value(rng: np.random.Generator) -> dict:
    kind = int(rng.integers(0, 6))
    if kind == 0:
        return {"type": "string", "maxLength": int(rng.integers(8, 25))}
    if kind == 1:
        return {"type": "integer"} if rng.random() < 0.5 else {"type": "integer", "minimum": 0, "maximum": 999}
    if kind == 2:
        return {"type": "boolean"}
    if kind == 3:
        return {"enum": rng.choice(WORDS, size=int(rng.integers(2, 5)), replace=False).tolist()}
    item = {"type": "string", "maxLength": 12} if rng.random() < 0.6 else {"type": "integer"}
    return {"type": "array", "items": item, "maxItems": int(rng.integers(1, 5))}


def schema_pool(seed: int, n: int) -> list[dict]:
    rng = np.random.default_rng([seed, 23])
    return [random_schema(rng) for _ in range(n)]


def constraint_factory(tokenizer, vocab_size: int, schema: dict):
    """() -> a fresh GrammarConstraint for one document under `schema` (the server's
    response_format json_schema path, api/structured)."""
    from dspark_loop.api.structured.build import format_constraint
    from dspark_loop.api.structured.output_format import OutputFormat

    fmt = OutputFormat(schema, "response_format")

    def make():
        return format_constraint(tokenizer, fmt, start_in_reasoning=False, vocab_size=vocab_size)

    return make
