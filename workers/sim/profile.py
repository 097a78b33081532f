"""A device cost profile: a TOML file of figures, each `{ value = ..., source = "..." }`
(where the number comes from, or "assumption: ..."). Shipped ones live in profiles/ and
are named without the extension (`--device-profile npu-tile`); any other path is a file.

    [hardware]    memory_bytes, hbm_bytes_per_s, flops_per_s, link_bytes_per_s, collective_latency_s
    [weights]     expert_bytes_per_param, dense_bytes_per_param, kv_bytes_per_value, reserved_bytes
    [step]        fixed_s, per_layer_s, tile_requests, prefill_pad_tokens, drafter_dispatches
    [acceptance]  greedy (7 survivals), sampled (7), spread, calibration_error, seed
    [tokens]      eos_rate
    [noise]       jitter, seed

cost.py turns them and the checkpoint's shape into a step time. A bad file raises
ProfileError naming the field.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import tomllib

from dspark_loop.contract.protocol import DSPARK_K

PROFILE_DIR = os.path.join(os.path.dirname(__file__), "profiles")
BIG = float("inf")

# field -> (kind, low, high): "float" / "int" in [low, high], "curve": DSPARK_K survivals in
# [0, 1], non-increasing
FIELDS = {
    "hardware": {
        "memory_bytes": ("float", 1, BIG),
        "hbm_bytes_per_s": ("float", 1, BIG),
        "flops_per_s": ("float", 1, BIG),
        "link_bytes_per_s": ("float", 1, BIG),
        "collective_latency_s": ("float", 0, 1),
    },
    "weights": {
        "expert_bytes_per_param": ("float", 0.1, 8),
        "dense_bytes_per_param": ("float", 0.1, 8),
        "kv_bytes_per_value": ("int", 1, 8),
        "reserved_bytes": ("float", 0, BIG),
    },
    "step": {
        "fixed_s": ("float", 0, 10),
        "per_layer_s": ("float", 0, 1),
        "tile_requests": ("int", 0, 4096),
        "prefill_pad_tokens": ("int", 0, 1 << 20),
        "drafter_dispatches": ("int", 0, 16),
    },
    "acceptance": {
        "greedy": ("curve", 0, 1),
        "sampled": ("curve", 0, 1),
        "spread": ("float", 0, 1),
        "calibration_error": ("float", -1, 1),
        "seed": ("int", 0, (1 << 63) - 1),
    },
    "tokens": {"eos_rate": ("float", 0, 1)},
    "noise": {"jitter": ("float", 0, 1), "seed": ("int", 0, (1 << 63) - 1)},
}


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class Profile:
    name: str
    path: str
    values: dict  # "section.field" -> value

    def __getitem__(self, key: str):
        return self.values[key]


def profile_path(name_or_file: str) -> str:
    """A shipped profile's name (npu-tile) or a file path -> the file."""
    if os.sep in name_or_file or name_or_file.endswith(".toml"):
        return name_or_file
    return os.path.join(PROFILE_DIR, f"{name_or_file}.toml")


def shipped_profiles() -> list[str]:
    return sorted(f[: -len(".toml")] for f in os.listdir(PROFILE_DIR) if f.endswith(".toml"))


def load_profile(name_or_file: str) -> Profile:
    path = profile_path(name_or_file)
    if not os.path.isfile(path):
        raise ProfileError(f"no device profile {name_or_file!r} (a file, or one of {', '.join(shipped_profiles())})")
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: not TOML: {e}") from None
    values = {}
    for section, fields in FIELDS.items():
        table = doc.get(section)
        if not isinstance(table, dict):
            raise ProfileError(f"{path}: field {section}: missing table [{section}]")
        extra = sorted(set(table) - set(fields))
        if extra:  # NOTE: before the missing ones: a misspelt field is both, and this says which
            raise ProfileError(f"{path}: field {section}.{extra[0]}: unknown (known: {', '.join(fields)})")
        for name, spec in fields.items():
            values[f"{section}.{name}"] = _field(path, f"{section}.{name}", table.get(name), spec)
    return Profile(str(doc.get("name", os.path.basename(path))), path, values)


def _field(path: str, key: str, entry, spec):
    kind, low, high = spec
    where = f"{path}: field {key}"
    if not isinstance(entry, dict) or "value" not in entry:
        raise ProfileError(f'{where}: missing (write {key.split(".")[1]} = {{ value = ..., source = "..." }})')
    source = entry.get("source")
    if not isinstance(source, str) or not source.strip():
        raise ProfileError(f'{where}: needs a source (where the number comes from, or "assumption: ...")')
    v = entry["value"]
    if kind == "curve":
        ok = isinstance(v, list) and len(v) == DSPARK_K and all(isinstance(x, (int, float)) for x in v)
        if not ok or not all(0 <= x <= 1 for x in v) or any(b > a for a, b in zip(v, v[1:])):
            raise ProfileError(f"{where}: must be {DSPARK_K} survivals in [0, 1], non-increasing (got {v!r})")
        return [float(x) for x in v]
    if kind == "int" and (isinstance(v, bool) or not isinstance(v, int)):
        raise ProfileError(f"{where}: must be an integer (got {v!r})")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ProfileError(f"{where}: must be a number (got {v!r})")
    if not low <= v <= high:
        raise ProfileError(f"{where}: must be in [{low}, {high}] (got {v!r})")
    return v if kind == "int" else float(v)
