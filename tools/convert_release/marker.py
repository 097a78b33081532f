"""The marker file OUT/convert_release.json: what was converted, from which source, and how
far a run got, so `--resume` continues after a kill and finishes byte-identical.

    {"converter": 1, "format": "w8a8", "source_sha256": "...", "block": [128, 128],
     "shards": {"model-00001-of-00004.safetensors": {"bytes": N, "tensors": T}, ...},
     "complete": false}

A shard is written as `.NAME.partial`, fsynced, renamed to NAME, and only then recorded
here (the marker is replaced atomically), so a recorded shard is whole; anything else is
redone. `complete` turns true after config.json, the tokenizer and the index are written
(config.json is written last among the model files, so a loader never sees a half
conversion). The source hash covers config.json and every shard's name, size and header:
the identity of the checkpoint, in milliseconds, without reading the weights.
"""

from __future__ import annotations

import hashlib
import json
import os

from tools.convert_release.errors import ReleaseError

MARKER_FILE = "convert_release.json"
PARTIAL_PREFIX = "."
PARTIAL_SUFFIX = ".partial"
VERSION = 1


def source_hash(config_path: str, shards: dict) -> str:
    """sha256 over config.json's bytes and each shard's (name, size, header bytes)."""
    h = hashlib.sha256()
    with open(config_path, "rb") as f:
        h.update(f.read())
    for name in sorted(shards):
        shard = shards[name]
        h.update(f"\0{name}\0{shard.size}\0".encode())
        h.update(shard.header_bytes)
    return h.hexdigest()


def partial_path(out_dir: str, file_name: str) -> str:
    return os.path.join(out_dir, PARTIAL_PREFIX + file_name + PARTIAL_SUFFIX)


class Marker:
    def __init__(self, out_dir: str, fmt: str, source_sha256: str, block: tuple[int, int]) -> None:
        self.out_dir = out_dir
        self.state = {
            "converter": VERSION,
            "format": fmt,
            "source_sha256": source_sha256,
            "block": list(block),
            "shards": {},
            "complete": False,
        }

    @property
    def path(self) -> str:
        return os.path.join(self.out_dir, MARKER_FILE)

    @classmethod
    def start(cls, out_dir: str, fmt: str, source_sha256: str, block: tuple[int, int], resume: bool) -> Marker:
        """A fresh marker in an empty OUT, or the one a killed run left (--resume)."""
        marker = cls(out_dir, fmt, source_sha256, block)
        exists = os.path.isdir(out_dir) and os.listdir(out_dir)
        if not exists:
            os.makedirs(out_dir, exist_ok=True)
            marker.save()
            return marker
        if not resume:
            raise ReleaseError(
                f"OUT {out_dir} is not empty; pass --resume to continue an interrupted "
                f"conversion, or choose a new directory"
            )
        if not os.path.isfile(marker.path):
            raise ReleaseError(
                f"--resume: OUT {out_dir} has no {MARKER_FILE}, so it is not a conversion this tool started"
            )
        with open(marker.path, encoding="utf-8") as f:
            old = json.load(f)
        for key, flag in (("format", "--format"), ("source_sha256", "SRC"), ("block", "SRC")):
            if old.get(key) != marker.state[key]:
                raise ReleaseError(
                    f"--resume: OUT was converted with {key}={old.get(key)!r}, this run "
                    f"has {marker.state[key]!r} (a different {flag})"
                )
        marker.state["shards"] = {
            name: rec for name, rec in old.get("shards", {}).items() if _whole(out_dir, name, rec)
        }
        marker.state["complete"] = bool(old.get("complete")) and len(marker.state["shards"]) == len(old["shards"])
        for name in os.listdir(out_dir):  # a killed run's half-written shard
            if name.startswith(PARTIAL_PREFIX) and name.endswith(PARTIAL_SUFFIX):
                os.remove(os.path.join(out_dir, name))
        return marker

    def is_done(self, file_name: str) -> bool:
        return file_name in self.state["shards"]

    def record_shard(self, file_name: str, num_bytes: int, num_tensors: int) -> None:
        self.state["shards"][file_name] = {"bytes": num_bytes, "tensors": num_tensors}
        self.save()

    def finish(self) -> None:
        self.state["complete"] = True
        self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.state, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def _whole(out_dir: str, name: str, rec: dict) -> bool:
    path = os.path.join(out_dir, name)
    return os.path.isfile(path) and os.path.getsize(path) == rec.get("bytes")
