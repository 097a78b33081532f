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


def test_per_position_temperatures_calibrate_each_position_on_its_own():
    """Sequential temperature scaling must fit each draft position separately: positions
    whose confidences are over- and under-confident by different amounts must each come
    out calibrated (ECE per position down), and a position without events keeps T = 1."""
    rng = np.random.default_rng(0)
    c_all, y_all, p_all = [], [], []
    for j, t in enumerate((0.5, 2.0)):  # position 0 under-, position 1 over-confident
        z = rng.normal(0.0, 2.0, 4000)
        y = rng.random(4000) < 1 / (1 + np.exp(-z))
        c_all.append(1 / (1 + np.exp(-z * t)))  # reported logit = true logit * t
        y_all.append(y)
        p_all.append(np.full(4000, j))
    c, y, posn = np.concatenate(c_all), np.concatenate(y_all), np.concatenate(p_all)
    temps = calibration.fit_position_temperatures(c, y, posn, 3)
    assert abs(temps[0] - 0.5) < 0.1 and abs(temps[1] - 2.0) < 0.3 and temps[2] == 1.0
    before = calibration.ece_per_position(c, y, posn, 2)
    after = calibration.ece_per_position(c, y, posn, 2, temps)
    assert all(a < b / 2 for a, b in zip(after, before))


def test_a_position_with_too_few_train_events_keeps_temperature_one():
    """A draft position with fewer than MIN_EVENTS events must keep T = 1 even when its
    few confidences are badly miscalibrated; the others must still be fit."""
    rng = np.random.default_rng(1)
    n_few = calibration.MIN_EVENTS - 1
    z = rng.normal(0.0, 2.0, 4000 + n_few)
    y = rng.random(len(z)) < 1 / (1 + np.exp(-z))
    c = 1 / (1 + np.exp(-3 * z))  # over-confident everywhere
    posn = np.concatenate([np.zeros(4000, int), np.ones(n_few, int)])
    temps = calibration.fit_position_temperatures(c, y, posn, 2)
    assert temps[1] == 1.0 and 2.5 < temps[0] < 3.5
