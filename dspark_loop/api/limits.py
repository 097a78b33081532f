"""The request limits the schemas declare and the validators enforce (one definition)."""

MAX_N = 128  # choices per request (n, best_of)
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
SEED_RANGE = (-(1 << 63), 1 << 64)  # a seed is any signed or unsigned 64-bit integer
