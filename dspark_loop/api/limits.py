"""The request limits the schemas declare and the validators enforce (one definition)."""

MAX_N = 128  # choices per request (n, best_of)
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
SEED_RANGE = (-(1 << 63), 1 << 64)  # a seed is any signed or unsigned 64-bit integer
# Each generated token is searched for every stop string, on the event loop (~0.1 us a string
# a token): 64 keep a request's search near its share of the host's ~1 ms step at 256
# requests; 10,000 strings took 1 ms a token, a whole step's budget for one request.
MAX_STOP_STRINGS = 64
# A body at least this long is decoded and tokenised off the event loop (asyncio.to_thread):
# tokenising takes milliseconds per 100 KB, which would stall every other request's stream.
BIG_BODY_BYTES = 64 * 1024
