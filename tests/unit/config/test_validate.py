"""Start-up validation: the seeds' Flash rules, the general topology rules, DSpark K."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dspark_loop.config.cli import load_config
from dspark_loop.config.server_config import GenerateDefaults, ServerConfig, SpeculativeConfig, fill_defaults
from dspark_loop.config.startup_rules import ConfigError, is_flash, validate
from dspark_loop.contract.model_config import ModelConfig
from tests.unit.config.models import flash_model, tiny_config_dict, tiny_model, write_checkpoint_stub

FLASH_16 = dict(dp=4, tp=4, ep=16, block_size=32, max_model_len=1024, max_num_seqs=8)


def problems(model, **fields) -> list[str]:
    cfg = fill_defaults(ServerConfig(**fields))
    try:
        validate(cfg, model)
    except ConfigError as e:
        return e.problems
    return []


def test_the_seeds_two_flash_deployments_are_valid():
    """dp4/ep16/tp4 on 16 devices and dp2/ep8/tp4 on 8, block 32, K 0 or 7, must pass."""
    model = flash_model()
    assert is_flash(model)
    for k in (0, 7):
        spec = SpeculativeConfig("dspark", k)
        assert problems(model, **FLASH_16, speculative=spec) == []
        assert problems(model, dp=2, tp=4, ep=8, max_num_seqs=128, speculative=spec) == []


FLASH_VIOLATIONS = [
    (dict(FLASH_16, tp=2), "--tp must be 4 for DeepSeek-V4-Flash DSpark (got 2)"),
    (dict(FLASH_16, ep=4, dp=1, devices=(0, 1, 2, 3)), "--ep must be 8 or 16 for DeepSeek-V4-Flash DSpark (got 4)"),
    (dict(FLASH_16, dp=2), "--dp must be ep/4 = 4 for DeepSeek-V4-Flash DSpark with --ep 16 (got 2)"),
    (dict(FLASH_16, devices=tuple(range(8))), "--devices must list exactly --ep 16 devices (got 8)"),
    (dict(FLASH_16, block_size=128), "--block-size must be 32 for DeepSeek-V4-Flash DSpark (got 128)"),
    (dict(FLASH_16, max_num_seqs=257), "--max-num-seqs must be at most 64 per TP group = 256 with --dp 4 (got 257)"),
    (
        dict(FLASH_16, max_model_len=1048577),
        "--max-model-len must be at most min(1048576, max_position_embeddings) = 1048576 (got 1048577)",
    ),
    (
        dict(FLASH_16, speculative=SpeculativeConfig("dspark", 3)),
        "--speculative-config num_speculative_tokens must be 0 or 7: DSpark drafts a fixed block "
        "of DSPARK_K = 7 tokens (got 3)",
    ),
]


@pytest.mark.parametrize("fields,message", FLASH_VIOLATIONS, ids=[m.split(" must")[0] for _, m in FLASH_VIOLATIONS])
def test_each_flash_rule_violated_alone_gives_exactly_its_message(fields, message):
    """Breaking one production rule must report exactly that rule's message."""
    assert problems(flash_model(), **fields) == [message]


def test_flash_context_is_capped_by_the_checkpoint_positions_too():
    """max-model-len must not exceed a Flash checkpoint's own max_position_embeddings."""
    model = flash_model(max_position_embeddings=65536)
    assert problems(model, **dict(FLASH_16, max_model_len=65537)) == [
        "--max-model-len must be at most min(1048576, max_position_embeddings) = 65536 (got 65537)"
    ]


def test_every_violation_is_collected_not_just_the_first():
    """Several broken rules must all be listed in one ConfigError."""
    found = problems(flash_model(), tp=2, dp=2, ep=4, block_size=64)
    assert found == [
        "--tp must be 4 for DeepSeek-V4-Flash DSpark (got 2)",
        "--ep must be 8 or 16 for DeepSeek-V4-Flash DSpark (got 4)",
        "--block-size must be 32 for DeepSeek-V4-Flash DSpark (got 64)",
    ]


def test_k7_needs_the_drafter_config_keys_and_names_the_missing_ones():
    """K=7 on a checkpoint without dspark_* keys must name each missing key."""
    [msg] = problems(flash_model(with_drafter=False), **FLASH_16, speculative=SpeculativeConfig("dspark", 7))
    assert msg.startswith("--speculative-config num_speculative_tokens=7 needs the checkpoint's DSpark drafter")
    for key in ("dspark_target_layer_ids", "dspark_noise_token_id", "dspark_markov_rank"):
        assert key in msg


def test_k7_needs_the_three_mtp_stages_in_the_checkpoint_files(tmp_path):
    """K=7 with dspark_* keys but only mtp.0 tensors must name mtp.1 and mtp.2 as missing."""
    path = write_checkpoint_stub(
        str(tmp_path / "ckpt"), tiny_config_dict(), ["embed.weight", "mtp.0.norm.weight", "mtp.0.wq.weight"]
    )
    cfg = fill_defaults(ServerConfig(model=path, speculative=SpeculativeConfig("dspark", 7)))
    with pytest.raises(ConfigError) as exc:
        validate(cfg, tiny_model())
    [msg] = exc.value.problems
    assert "drafter stage tensors mtp.1, mtp.2" in msg and "mtp.0" not in msg.split("tensors")[1]
    full = write_checkpoint_stub(str(tmp_path / "full"), tiny_config_dict(), [f"mtp.{i}.norm.weight" for i in range(3)])
    validate(replace(cfg, model=full), tiny_model())


def test_k7_refuses_a_drafter_whose_block_is_not_dspark_k_drafts():
    """A checkpoint whose dspark_block_size differs from DSPARK_K must be refused at K=7, naming
    the field; K=0 never runs the drafter and must still accept it."""
    model = ModelConfig.from_dict({**tiny_config_dict(), "dspark_block_size": 5})
    assert problems(model, speculative=SpeculativeConfig("dspark", 7)) == [
        "--speculative-config num_speculative_tokens=7: the checkpoint's dspark_block_size is 5, but DSpark "
        "here drafts DSPARK_K = 7 tokens per block (dspark_block_size must be 7)"
    ]
    assert problems(model, speculative=SpeculativeConfig("dspark", 0)) == []


def test_k7_looks_for_as_many_mtp_stages_as_the_checkpoint_declares(tmp_path):
    """The drafter's stage count comes from config.json (dspark_num_stages): a 2-stage drafter
    must not be asked for mtp.2."""
    config = {**tiny_config_dict(), "dspark_num_stages": 2}
    path = write_checkpoint_stub(str(tmp_path / "two"), config, [f"mtp.{i}.norm.weight" for i in range(2)])
    cfg = fill_defaults(ServerConfig(model=path, speculative=SpeculativeConfig("dspark", 7)))
    validate(cfg, ModelConfig.from_dict(config))


GENERAL_VIOLATIONS = [
    (dict(ep=3, dp=3), "--ep 3 must divide the checkpoint's n_routed_experts (16)"),
    (dict(dp=2, tp=2, ep=2), "--ep must equal --dp x --tp = 2 x 2 = 4 (got 2)"),
    (dict(ep=2, devices=(0, 1, 2)), "--devices must list exactly --ep 2 devices (got 3)"),
    (dict(block_size=24), "--block-size must be a power of two (got 24)"),
    (
        dict(max_model_len=8193),
        "--max-model-len must be at most the checkpoint's max_position_embeddings = 8192 (got 8193)",
    ),
    (dict(dp=2, max_num_seqs=1), "--max-num-seqs must be at least --dp = 2: one request per cache partition (got 1)"),
    (
        dict(speculative=SpeculativeConfig("dspark", 4)),
        "--speculative-config num_speculative_tokens must be 0 or 7: DSpark drafts a fixed block "
        "of DSPARK_K = 7 tokens (got 4)",
    ),
    (
        dict(max_num_batched_tokens=0, long_prefill_token_threshold=8),
        "--max-num-batched-tokens must be a positive integer (got 0)",
    ),
]


@pytest.mark.parametrize("fields,message", GENERAL_VIOLATIONS, ids=[m.split(" must")[0] for _, m in GENERAL_VIOLATIONS])
def test_each_general_rule_violated_alone_gives_exactly_its_message(fields, message):
    """Small checkpoints: breaking one topology/size rule must report exactly that rule."""
    assert problems(tiny_model(), **fields) == [message]


@pytest.mark.parametrize(
    "fields",
    [
        dict(),
        dict(tp=2, dp=2),
        dict(ep=16),
        dict(tp=4, ep=8),
        dict(block_size=16),
        dict(block_size=64),
        dict(speculative=SpeculativeConfig("dspark", 7)),
    ],
)
def test_consistent_small_topologies_are_valid(fields):
    """Any consistent topology (down to one rank) must pass on the tiny checkpoint."""
    assert problems(tiny_model(), **fields) == []


def test_tp_must_divide_heads_and_output_groups():
    """A tp that does not divide the attention heads / o_groups must be refused (ep divides
    this checkpoint's 24 experts, so only the tp rule fires)."""
    assert problems(tiny_model(n_routed_experts=24), tp=3) == [
        "--tp 3 must divide the checkpoint's num_attention_heads (8) and o_groups (4)"
    ]


def test_block_size_must_tile_the_compressed_pages():
    """A block size the compressed families cannot tile must be refused via CacheLayout
    (ratio 12: a 32-token block and 120-token compressed pages do not nest)."""
    model = tiny_model(compress_rate_hca=12)
    assert problems(model, block_size=32) == [
        "--block-size 32 does not fit the checkpoint's cache pages: compress ratio 12 does not tile block size 32"
    ]
    assert problems(model, block_size=4) == []


def test_load_config_exits_2_listing_every_problem(tmp_path, capsys):
    """load_config must read the checkpoint, validate, and exit 2 listing each problem."""
    path = write_checkpoint_stub(str(tmp_path / "ckpt"), tiny_config_dict(with_drafter=False), ["w"])
    cfg, model = load_config(["--model", path, "--tp", "2", "--dp", "2"])
    assert (cfg.ep, cfg.served_model_name, model.vocab_size) == (4, "ckpt", 1024)
    with pytest.raises(SystemExit) as exc:
        load_config(["--model", path, "--tp", "3", "--speculative-config", '{"num_speculative_tokens":7}'])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--tp 3 must divide" in err and "dspark_noise_token_id" in err and "mtp.0" in err


def test_the_embedded_demo_serves_chat_with_thinking_off_unless_told_otherwise(tmp_path):
    """The embedded default's small model never closes a thinking section: without --model
    and without --default-chat-template-kwargs, chat defaults to thinking off; the flag, or
    any --model, leaves thinking on unless the flag says otherwise."""
    assert load_config([])[0].default_chat_template_kwargs == {"thinking": False}
    flag = ["--default-chat-template-kwargs", '{"thinking": true}']
    assert load_config(flag)[0].default_chat_template_kwargs == {"thinking": True}
    path = write_checkpoint_stub(str(tmp_path / "ckpt"), tiny_config_dict(with_drafter=False), ["w"])
    assert load_config(["--model", path])[0].default_chat_template_kwargs is None


def test_sampling_defaults_in_generate_config_are_accepted():
    """Sampling is served now: --generate-config temperature/top_p/top_k/min_p must pass."""
    g = GenerateDefaults(temperature=0.8, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1)
    assert problems(tiny_model(), generate=g) == []
