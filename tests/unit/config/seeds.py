"""The seeds' two command lines, as their pages print them (the deployment page's "Start the
Server" and the serving dev notes' "Topology and selection"), and the seeds' verify request."""

from __future__ import annotations

import shlex

# The deployment page, "Start the Server"
DEPLOYMENT_PAGE = r"""pypto-serving \
  --model /path/to/dsv4-flash-w8a8 \
  --served-model-name dsv4-flash-w8a8 \
  --platform a2a3 \
  --devices 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 \
  --dp 4 --ep 16 --tp 4 \
  --block-size 32 --max-model-len 1024 --max-num-seqs 8 \
  --max-num-batched-tokens 8192 --long-prefill-token-threshold 128 \
  --speculative-config '{"method":"dspark","num_speculative_tokens":0}' \
  --no-enable-prefix-caching \
  --ring-heap 2147483648,2147483648,4294967296,8589934592 \
  --port 8000"""

# The serving dev notes, "Topology and selection"
DEV_NOTES_PAGE = r"""python -m pypto_serving.cli \
  --model /data/models/dsv4-flash-0731-dspark-w8a8 \
  --backend npu --platform a2a3 \
  --devices 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 \
  --dp 4 --ep 16 --tp 4 \
  --block-size 32 --max-model-len 1024 --max-num-seqs 8 \
  --max-num-batched-tokens 8192 --long-prefill-token-threshold 128 \
  --speculative-config '{"method":"dspark","num_speculative_tokens":0}' \
  --no-enable-prefix-caching \
  --ring-heap 2147483648,2147483648,4294967296,8589934592 \
  --port 8000"""

PAGES = {"deployment": DEPLOYMENT_PAGE, "dev-notes": DEV_NOTES_PAGE}
ENTRIES = ("pypto-serving", "python -m pypto_serving.cli")


def seeds_argv(page: str, model_dir: str, k: int) -> list[str]:
    """The page's flags (its program name dropped: ours is `python -m dspark_loop`),
    --model -> model_dir, num_speculative_tokens -> k."""
    text = page
    for entry in ENTRIES:
        if text.startswith(entry):
            text = text[len(entry) :]
    argv = shlex.split(text.replace("\\\n", " "))  # the shell's line continuations
    argv[argv.index("--model") + 1] = model_dir
    spec = argv.index("--speculative-config") + 1
    argv[spec] = argv[spec].replace('"num_speculative_tokens":0', f'"num_speculative_tokens":{k}')
    return argv


# The deployment page, "Verify": the request both K must answer alike
VERIFY_REQUEST = {"model": "dsv4-flash-w8a8", "prompt": "Huawei is", "max_tokens": 32, "temperature": 0}
