"""The drafter's constrained rollouts (redraft --constrained-share, evaluate --constrained):
JSON documents under random schemas, picked by the target under the server's grammar masks."""

from __future__ import annotations

import json
import os

import jsonschema
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from dspark_loop.api.chat.render import EOS
from dspark_loop.contract.model_config import ModelConfig
from tests.integration.train_demo.conftest import load
from tools.train_demo import drafter, rollout, schemas
from tools.train_demo.anchors import anchors
from tools.train_demo.evaluate import streams
from tools.train_demo.redraft_ship import verdict
from workers.drafter_weights import load_drafter
from workers.weights import load_model

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def constrained(smoke_run):
    """The smoke target and 4 constrained rollouts (greedy and T = 0.8) under 2 small schemas
    (documents short enough to end within the smoke rollouts' 24 tokens)."""
    model = os.path.join(smoke_run, "model")
    cfg = ModelConfig.from_dir(model)
    target = load_model(model, cfg, quiet=True)
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    pool = [
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        {"type": "object", "properties": {"kind": {"enum": ["int", "str"]}}, "required": ["kind"]},
    ]
    factories = [schemas.constraint_factory(tok, cfg.vocab_size, s) for s in pool]
    held = streams(model, True)[2]
    ro = rollout.sampled(target, cfg, held, 4, [0.0, 0.8], np.random.default_rng(2), True, factories=factories)
    return cfg, target, tok, pool, ro, load_drafter(model, cfg)


def test_constrained_rollouts_are_documents_of_their_schema_picked_inside_their_masks(constrained):
    """Every generated token must lie inside the mask recorded for it, the prompt's masks
    must allow everything, and each rollout's text must be documents of its own schema:
    every one its EOS ended validates, the last one is a prefix of the next."""
    cfg, _, tok, pool, ro, _ = constrained
    N, L = ro.tokens.shape
    P = ro.prompt_len
    allowed = ro.allowed_at(np.arange(N)[:, None], np.arange(L)[None, :], cfg.vocab_size).numpy()  # [N, L, V]
    assert allowed[:, :P].all()
    picked = np.take_along_axis(allowed, ro.tokens[:, :, None], axis=-1)[..., 0]  # [N, L]
    assert picked[:, P:].all()
    assert not allowed[:, P:].all(axis=-1).any()  # a grammar governed every generated token
    eos = tok.token_to_id(EOS)
    ended = 0
    for r in range(N):
        gen = ro.tokens[r, P:].tolist()
        while eos in gen:
            doc, gen = gen[: gen.index(eos)], gen[gen.index(eos) + 1 :]
            jsonschema.validate(json.loads(tok.decode(doc)), pool[r % len(pool)])
            ended += 1
        assert tok.decode(gen)[:1] in ("", "{")
    assert ended >= 1


def test_the_schema_pool_is_seeded_and_every_schema_compiles(smoke_run):
    model = os.path.join(smoke_run, "model")
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    pool = schemas.schema_pool(0, 8)
    assert pool == schemas.schema_pool(0, 8) and pool != schemas.schema_pool(1, 8)
    for s in pool:
        assert 2 <= len(s["properties"]) <= 5 and s["required"] == list(s["properties"])
        c = schemas.constraint_factory(tok, ModelConfig.from_dir(model).vocab_size, s)()
        assert c.accept(tok.token_to_id("{")) or c.accept(tok.encode('{"').ids[0])


def test_the_drafters_target_distribution_is_masked_for_constrained_rollouts(constrained):
    """draft_loss must match the drafter to the target's distribution over the grammar
    mask: with a rollout's masks widened to everything the loss must change."""
    from dataclasses import replace

    _, target, _, _, ro, net = constrained
    seq, pos = anchors(ro, np.random.default_rng(3), 8)
    with torch.no_grad():
        masked, _ = drafter.draft_loss(net, target, ro, seq, pos)
        free, _ = drafter.draft_loss(net, target, replace(ro, allowed=None), seq, pos)
    assert masked.item() != pytest.approx(free.item(), rel=1e-4)


def test_joined_rollouts_keep_each_parts_masks_and_free_ones_allow_everything(smoke_run, constrained):
    cfg, target, _, _, ro, _ = constrained
    free = rollout.sampled(
        target, cfg, streams(os.path.join(smoke_run, "model"), True)[2], 2, [0.7], np.random.default_rng(1), True
    )
    both = rollout.concat([free, ro])
    assert len(both.tokens) == 2 + len(ro.tokens)
    assert (both.allowed[:2] == 0xFF).all() and np.array_equal(both.allowed[2:], ro.allowed)
    assert np.array_equal(both.temperature[2:], ro.temperature) and both.temperature[0] == pytest.approx(0.7)


def test_redraft_with_a_constrained_share_fine_tunes_the_shipped_drafter(smoke_run, tmp_path):
    """redraft --constrained-share 0.5 --from-model: half the rollouts constrained (masks
    recorded), and the figures say so."""
    from tools.train_demo.__main__ import main

    model = os.path.join(smoke_run, "model")
    argv = ["redraft", "--model", model, "--out", str(tmp_path), "--smoke", "--quiet", "--seed", "3"]
    assert main(argv + ["--from-model", "--constrained-share", "0.5"]) == 0
    ro = torch.load(str(tmp_path / "redraft" / "rollouts.pt"), weights_only=False)["train"]
    governed = (ro.allowed[:, ro.prompt_len :] != 0xFF).any(axis=(1, 2))  # [N] a grammar picked its tokens
    assert governed.sum() == len(governed) // 2
    info = load(str(tmp_path / "redraft" / "drafter.json"))
    assert info["constrained_share"] == 0.5 and info["from_model"] is True


def test_redraft_refuses_a_share_outside_0_1(smoke_run, tmp_path, capsys):
    from tools.train_demo.__main__ import main

    with pytest.raises(SystemExit):
        main(
            ["redraft", "--model", os.path.join(smoke_run, "model"), "--out", str(tmp_path), "--constrained-share", "1"]
        )
    assert "--constrained-share" in capsys.readouterr().err


def test_a_constrained_redraft_ships_on_json_gains_without_free_losses():
    before = {"T=0": {"mean_accepted_len": 6.0}, "json T=0": {"mean_accepted_len": 2.0}}
    gain = {"T=0": {"mean_accepted_len": 5.9}, "json T=0": {"mean_accepted_len": 3.0}}
    assert verdict(before, gain, "constrained")[0] is True
    lost = {"T=0": {"mean_accepted_len": 5.5}, "json T=0": {"mean_accepted_len": 3.0}}
    assert verdict(before, lost, "constrained")[0] is False
    flat = {"T=0": {"mean_accepted_len": 6.0}, "json T=0": {"mean_accepted_len": 2.05}}
    assert verdict(before, flat, "constrained")[0] is False
    assert verdict(before, flat, "sampled")[0] is True  # json figures are only reported there
