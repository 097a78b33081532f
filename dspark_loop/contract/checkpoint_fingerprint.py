"""A checkpoint's fingerprint: what every node of a run must agree on before it serves.

    sha256( config.json as canonical JSON (sorted keys, no whitespace)
            + "\\0" + the sorted tensor names, one per line )

Instant: only config.json and the safetensors headers (or the index) are read, never the
weights, so the same checkpoint copied to another host, or rewritten with its JSON keys in
another order, has the same fingerprint, while another conversion (other tensors) or another
config does not. A weight changed in place keeps its fingerprint. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os

from dspark_loop.contract.checkpoint_names import checkpoint_tensor_names

SHORT_LEN = 12  # hex digits shown in messages


def checkpoint_fingerprint(model_dir: str) -> str:
    """Hex sha256 of the config and the tensor names; raises OSError/ValueError when the
    directory has no readable config.json."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    names = sorted(checkpoint_tensor_names(model_dir) or ())
    digest = hashlib.sha256(canonical.encode())
    digest.update(b"\0" + "\n".join(names).encode())
    return digest.hexdigest()


def short(fingerprint: str) -> str:
    return fingerprint[:SHORT_LEN] or "(none)"
