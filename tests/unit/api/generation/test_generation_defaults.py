"""Request defaults from generation_config.json, with --generate-config on top."""

import json

from dspark_loop.api.generation.defaults import sampling_defaults


def write(tmp_path, obj):
    (tmp_path / "generation_config.json").write_text(json.dumps(obj))
    return str(tmp_path)


def test_a_sampling_checkpoint_gives_its_defaults_and_overrides_win(tmp_path):
    """do_sample true: temperature/top_p/top_k/min_p/repetition_penalty come from the file;
    the --generate-config values replace them; top_k -1 means off."""
    d = write(tmp_path, {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": -1, "eos_token_id": 1})
    got = sampling_defaults(d)
    assert (got.knobs.temperature, got.knobs.top_p, got.knobs.top_k) == (0.6, 0.95, 0)
    got = sampling_defaults(d, {"temperature": 0.3, "min_p": 0.05, "max_new_tokens": 9})
    assert (got.knobs.temperature, got.knobs.top_p, got.knobs.min_p) == (0.3, 0.95, 0.05)


def test_a_greedy_checkpoint_stays_greedy_and_no_file_means_vllms_defaults(tmp_path):
    """do_sample false (the tiny checkpoints) must give temperature 0 whatever it lists; no
    file at all gives vLLM's defaults (temperature 1)."""
    assert sampling_defaults(write(tmp_path, {"do_sample": False, "temperature": 1.0})).knobs.temperature == 0.0
    assert sampling_defaults(str(tmp_path / "nowhere")).knobs.temperature == 1.0
