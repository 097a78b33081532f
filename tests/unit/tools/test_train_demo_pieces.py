"""tools/train_demo's pure pieces: the corpus rule, the calibration statistics."""

from __future__ import annotations

import numpy as np

from tools.train_demo import calibration
from tools.train_demo.corpus import CorpusFile, corpus_hash, split, stdlib_files


def test_corpus_is_the_stdlib_without_tests_and_split_by_a_fixed_path_rule():
    """The corpus must hold stdlib modules but no test files or site-packages, and the
    held-out set must be a fixed function of the path (~5% of files)."""
    files = stdlib_files()
    paths = {f.relpath for f in files}
    assert "os.py" in paths and "json/decoder.py" in paths
    assert not any(p.startswith(("test/", "site-packages/")) or "/test_" in p or "/tests/" in p for p in paths)
    train, held = split(files)
    assert 0.01 < len(held) / len(files) < 0.12 and not {f.relpath for f in train} & {f.relpath for f in held}
    assert CorpusFile("os.py", "").held_out == CorpusFile("os.py", "other text").held_out


def test_corpus_hash_names_paths_and_contents():
    """The corpus hash must change when a file's text or its path changes."""
    a = [CorpusFile("a.py", "x = 1\n")]
    assert corpus_hash(a) != corpus_hash([CorpusFile("a.py", "x = 2\n")])
    assert corpus_hash(a) != corpus_hash([CorpusFile("b.py", "x = 1\n")])


def test_events_count_only_drafts_the_chain_reached():
    """A draft counts only if every earlier draft matched; it survives if it matches too."""
    labels = np.array([[5, 6, 7, 8, 9, 10, 11]])
    drafts = np.array([[5, 6, 0, 8, 9, 10, 11]])  # third draft wrong: later matches never count
    conf = np.full((1, 7), 0.5, np.float32)
    _, y, pos = calibration.events(drafts, conf, labels)
    assert pos.tolist() == [0, 1, 2] and y.tolist() == [True, True, False]
    acc = calibration.acceptance(drafts, labels)
    assert acc["mean_accepted_len"] == 3.0 and acc["acceptance_per_position"][:3] == [1.0, 1.0, 0.0]


def test_temperature_fit_recovers_an_overconfident_head_and_lowers_ece():
    """Confidences sigmoid(z) for events drawn at sigmoid(z/2) must fit T near 2 and
    calibrate to a lower ECE."""
    rng = np.random.default_rng(0)
    z = rng.normal(0, 3, 20000)
    y = rng.random(20000) < 1 / (1 + np.exp(-z / 2))
    c = 1 / (1 + np.exp(-z))
    t = calibration.fit_temperature(c, y)
    assert 1.8 < t < 2.2
    assert calibration.ece(calibration.scaled(c, t), y) < 0.02 < calibration.ece(c, y)
