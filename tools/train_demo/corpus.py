"""The training text: the Python standard library's own source, offline on every machine.

Files: every *.py under sysconfig's stdlib path, without tests (test/, tests/, idle_test/,
test_*.py), codec tables (encodings/), pydoc_data/, site-packages and caches. Split by
file: held-out when the first byte of sha256(relative path) is below HELD_OUT_BYTE (~5%),
else train. The corpus hash covers every (relative path, sha256 of the content) pair, so it
names the exact text trained on.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass

# NOTE: encodings/ (codec tables) and pydoc_data/ (one huge string) are data, not code.
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings", "pydoc_data"}
HELD_OUT_BYTE = 13  # of 256: ~5% of the files


@dataclass(frozen=True)
class CorpusFile:
    relpath: str
    text: str

    @property
    def held_out(self) -> bool:
        return hashlib.sha256(self.relpath.encode()).digest()[0] < HELD_OUT_BYTE


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def stdlib_files(root: str | None = None) -> list[CorpusFile]:
    """The corpus files in path order (the text decoded as UTF-8, bad bytes replaced)."""
    root = root or stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith("test_"):
                continue
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
            out.append(CorpusFile(os.path.relpath(path, root).replace(os.sep, "/"), text))
    out.sort(key=lambda f: f.relpath)
    return out


def corpus_hash(files: list[CorpusFile]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relpath}\0{hashlib.sha256(f.text.encode()).hexdigest()}\n".encode())
    return h.hexdigest()


def split(files: list[CorpusFile]) -> tuple[list[CorpusFile], list[CorpusFile]]:
    """(train, held_out)."""
    return [f for f in files if not f.held_out], [f for f in files if f.held_out]
