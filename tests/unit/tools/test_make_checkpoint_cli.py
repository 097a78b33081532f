"""The command line wraps make_checkpoint and rejects bad arguments plainly."""

from __future__ import annotations

import os

import pytest

from tools.make_checkpoint import main, make_checkpoint

from .conftest import read_config


def test_cli_writes_the_listed_files_and_one_summary_line(tmp_path, capsys):
    """The CLI must write the five files (and the marker with --w8a8), print one line."""
    assert main([str(tmp_path / "m"), "--seed", "4", "--w8a8", "--layers", "4", "--with-drafter"]) == 0
    assert sorted(os.listdir(tmp_path / "m")) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "w8a8.marker",
    ]
    assert read_config(str(tmp_path / "m"))["num_hidden_layers"] == 4
    assert len(capsys.readouterr().out.strip().splitlines()) == 1


def test_rewriting_replaces_the_directory_and_leaves_no_temporaries(tmp_path):
    """Writing over an existing checkpoint must replace it whole (atomic rename)."""
    make_checkpoint(str(tmp_path / "m"), w8a8=True, quiet=True)
    make_checkpoint(str(tmp_path / "m"), quiet=True)
    assert not os.path.exists(tmp_path / "m" / "w8a8.marker")
    assert os.listdir(tmp_path) == ["m"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": "huge"},
        {"dtype": "float16"},
        {"n_experts": 4},
        {"num_experts_per_tok": 99},
        {"compress_ratios": [0, 3, 0, 0, 0, 0]},
    ],
)
def test_bad_arguments_raise_value_error_and_write_nothing(tmp_path, kwargs):
    """Unknown sizes, dtypes, override names or inconsistent shapes must fail up front."""
    with pytest.raises(ValueError):
        make_checkpoint(str(tmp_path / "m"), quiet=True, **kwargs)
    assert not os.path.exists(tmp_path / "m")
