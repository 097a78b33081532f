"""Command-line flags: defaults, and every bad value exits 2 naming its flag."""

from __future__ import annotations

import pytest

from dspark_loop.config.cli import build_parser, parse_args
from dspark_loop.config.server_config import CPU_KV_CACHE_MEMORY

BAD_FLAGS = [
    (["--port", "70000"], "--port"),
    (["--port", "http"], "--port"),
    (["--tp", "0"], "--tp"),
    (["--dp", "-2"], "--dp"),
    (["--ep", "two"], "--ep"),
    (["--devices", "0,1,x"], "--devices"),
    (["--devices", "0,1,1"], "--devices"),
    (["--devices", ""], "--devices"),
    (["--backend", "tpu"], "--backend"),
    (["--dtype", "float16"], "--dtype"),
    (["--max-model-len", "0"], "--max-model-len"),
    (["--block-size", "-32"], "--block-size"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--max-num-batched-tokens", "1.5"], "--max-num-batched-tokens"),
    (["--long-prefill-token-threshold", "0"], "--long-prefill-token-threshold"),
    (["--speculative-config", "{bad"], "--speculative-config"),
    (["--speculative-config", "[7]"], "--speculative-config"),
    (["--speculative-config", '{"method":"eagle","num_speculative_tokens":7}'], "--speculative-config"),
    (["--speculative-config", '{"num_speculative_tokens":-1}'], "--speculative-config"),
    (["--speculative-config", '{"num_speculative_tokens":7,"draft":1}'], "--speculative-config"),
    (["--speculative-config", '{"num_speculative_tokens":7,"enable_adaptive_verification":1}'], "--speculative-config"),
    (["--speculative-config", '{"num_speculative_tokens":7,"cost_model":3}'], "--speculative-config"),
    (["--generate-config", '{"max_new_tokens":8,"beam":2}'], "--generate-config"),
    (["--generate-config", '{"max_new_tokens":0}'], "--generate-config"),
    (["--generate-config", '{"stop":[1]}'], "--generate-config"),
    (["--generate-config", '{"ignore_eos":"yes"}'], "--generate-config"),
    (["--generate-config", "not json"], "--generate-config"),
    (["--default-chat-template-kwargs", '{"thinking":"no"}'], "--default-chat-template-kwargs"),
    (["--default-chat-template-kwargs", '{"add_generation_prompt":true}'], "--default-chat-template-kwargs"),
    (["--default-chat-template-kwargs", "[]"], "--default-chat-template-kwargs"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--log-level", "loud"], "--log-level"),
    (["--loop", "tokio"], "--loop"),
    (["--kv-cache-memory", "lots"], "--kv-cache-memory"),
    (["--kv-cache-memory", "2XB"], "--kv-cache-memory"),
    (["--num-blocks", "0"], "--num-blocks"),
    (["--debug-tap", "localhost"], "--debug-tap"),
    (["--model", "/nonexistent/checkpoint"], "--model"),
    (["--served-model-name", " "], "--served-model-name"),
]


@pytest.mark.parametrize("argv,flag", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flag_value_exits_2_naming_the_flag(argv, flag, capsys):
    """A bad value must exit with status 2 and an argparse error line naming the flag."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {flag}" in err, err


def test_no_flags_mean_the_embedded_default_on_one_cpu_rank():
    """Without flags the config must be one CPU rank in float32 with the seeds' defaults."""
    cfg = parse_args([])
    assert cfg.model is None and cfg.served_model_name == "default-v1"
    assert (cfg.dp, cfg.tp, cfg.ep, cfg.devices) == (1, 1, 1, (0,))
    assert (cfg.backend, cfg.dtype, cfg.host, cfg.port) == ("cpu", "float32", "127.0.0.1", 8000)
    assert (cfg.max_model_len, cfg.block_size, cfg.max_num_seqs) == (1024, 32, 64)
    assert (cfg.max_num_batched_tokens, cfg.long_prefill_token_threshold) == (8192, 8192)
    assert cfg.num_speculative_tokens == 0 and cfg.enable_prefix_caching
    assert cfg.kv_cache_memory == CPU_KV_CACHE_MEMORY
    assert cfg.event_loop == "auto"


def test_the_seeds_command_line_parses_as_written(tmp_path):
    """The deployment page's command  must parse to its values."""
    (tmp_path / "dsv4-flash-w8a8").mkdir()
    (tmp_path / "dsv4-flash-w8a8" / "config.json").write_text("{}")
    cfg = parse_args(
        [
            "--model",
            str(tmp_path / "dsv4-flash-w8a8"),
            "--served-model-name",
            "dsv4-flash-w8a8",
            "--devices",
            ",".join(map(str, range(16))),
            "--dp",
            "4",
            "--ep",
            "16",
            "--tp",
            "4",
            "--block-size",
            "32",
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "8192",
            "--long-prefill-token-threshold",
            "128",
            "--speculative-config",
            '{"method":"dspark","num_speculative_tokens":7}',
            "--no-enable-prefix-caching",
            "--port",
            "8000",
        ]
    )
    assert (cfg.dp, cfg.ep, cfg.tp, len(cfg.devices)) == (4, 16, 4, 16)
    assert (cfg.max_num_seqs, cfg.long_prefill_token_threshold, cfg.num_speculative_tokens) == (8, 128, 7)
    assert cfg.enable_prefix_caching is False


def test_values_are_parsed_into_their_units():
    """Sizes, generate defaults, prompts and the tap address must parse exactly."""
    cfg = parse_args(
        [
            "--kv-cache-memory",
            "1.5GiB",
            "--prompt",
            "a",
            "--prompt",
            "b",
            "--max-tokens",
            "5",
            "--log-level",
            "DEBUG",
            "--generate-config",
            '{"max_new_tokens":9,"stop":"END","temperature":0,"seed":1}',
            "--debug-tap",
            "tcp://127.0.0.1:5599",
            "--dtype",
            "bfloat16",
            "--num-blocks",
            "12",
        ]
    )
    assert cfg.kv_cache_memory == 3 * 2**29
    assert cfg.prompts == ("a", "b") and cfg.max_tokens == 5 and cfg.log_level == "debug"
    assert (cfg.generate.max_new_tokens, cfg.generate.stop, cfg.generate.seed) == (9, ("END",), 1)
    assert cfg.debug_tap == "tcp://127.0.0.1:5599" and cfg.dtype == "bfloat16" and cfg.num_blocks == 12


@pytest.mark.parametrize(
    "argv,topology",
    [
        (["--tp", "2", "--dp", "2"], (2, 2, 4, (0, 1, 2, 3))),
        (["--ep", "4"], (4, 1, 4, (0, 1, 2, 3))),
        (["--ep", "4", "--tp", "2"], (2, 2, 4, (0, 1, 2, 3))),
        (["--devices", "4,5"], (2, 1, 2, (4, 5))),
        (["--devices", "0,1,2,3", "--dp", "1"], (1, 4, 4, (0, 1, 2, 3))),
        (["--tp", "2"], (1, 2, 2, (0, 1))),
    ],
)
def test_missing_topology_values_are_filled_in(argv, topology):
    """Given some of dp/tp/ep/devices, the rest must follow devices == ep == dp*tp."""
    cfg = parse_args(argv)
    assert (cfg.dp, cfg.tp, cfg.ep, cfg.devices) == topology
    assert cfg.max_num_seqs == 64 * cfg.dp


def test_prefix_caching_is_on_by_default_and_the_help_says_so(capsys):
    """--help must describe prefix caching as implemented and on by default."""
    help_text = build_parser().format_help()
    assert "--enable-prefix-caching" in help_text and "on by default" in help_text
    assert "later release" not in help_text
