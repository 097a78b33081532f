"""Stage "calibrate": sequential (per-position) temperature scaling of an already-trained
checkpoint's confidence head, e.g. the shipped demo, in place.

    tokens      the corpus (the local standard library) through the checkpoint's own
                tokenizer.json, checked against manifest.json's corpus_hash when there is one
    rollouts    rebuilt as the drafter stage builds them (rollout.train_and_heldout, same seed)
    fit         calibration.position_calibration: T per draft position on train-rollout
                events, ECE per position before/after on held-out events, served drafts
    writes      config.json dspark_confidence_temperatures (read by the server), and when the
                directory has a manifest.json: its drafter figures, its command list and the
                changed files' bytes and sha256
"""

from __future__ import annotations

import json
import os
import time

from tokenizers import Tokenizer

from dspark_loop.config.default_model import DEMO_MANIFEST
from dspark_loop.contract.model_config import ModelConfig
from tools.train_demo import calibration, rollout, state, tokenizer
from tools.train_demo.corpus import corpus_hash
from tools.train_demo.drafter import CONFIG_KEY
from tools.train_demo.ship import file_entry, load
from workers.drafter_weights import load_drafter
from workers.weights import load_model


def run(
    model_dir: str, out_dir: str, seed: int, smoke: bool, resume: bool, anchors: int, command: str, log, progress
) -> dict:
    d = os.path.join(out_dir, "calibrate")
    os.makedirs(d, exist_ok=True)
    t0 = time.perf_counter()
    cfg = ModelConfig.from_dir(model_dir)
    target, drafter = load_model(model_dir, cfg, quiet=True), load_drafter(model_dir, cfg)
    manifest_path = os.path.join(model_dir, DEMO_MANIFEST)
    manifest = load(manifest_path) if os.path.exists(manifest_path) else None
    files, train, held = tokenizer.corpus(smoke)
    digest = corpus_hash(files)
    corpus_ok = None if manifest is None else digest == manifest["corpus_hash"]
    log(
        f"calibrate: {model_dir}, corpus {digest[:16]} ({len(files)} files): "
        + {None: "no manifest.json to check it against", True: "matches the manifest's corpus_hash"}.get(
            corpus_ok, f"DIFFERS from the manifest's {manifest and manifest['corpus_hash'][:16]} (other rollouts)"
        )
    )
    if manifest is not None and manifest.get("seed") != seed:
        log(f"calibrate: --seed {seed}, the manifest's training seed {manifest.get('seed')}: other rollouts")
    data_path = os.path.join(d, "rollouts.pt")
    data = state.load_state(data_path) if resume else None
    if data is None:
        tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        streams = [tokenizer.stream(tok, [f.text for f in part]) for part in (train, held)]
        log(f"calibrate: tokenized train {len(streams[0])} and held-out {len(streams[1])} tokens")
        data = rollout.train_and_heldout(target, cfg, *streams, seed, smoke, progress)
        state.save_state(data_path, data)
        log(f"calibrate: {rollout.describe(data, smoke)} in {time.perf_counter() - t0:.0f}s")
    ro, held = data["train"], data["heldout"]
    fit = calibration.position_calibration(drafter, target, ro, held, seed, anchors, log, progress)
    info = {"model": model_dir, "anchors": anchors, "corpus_hash_matches": corpus_ok, **fit}
    write_config(model_dir, fit["position_temperatures"])
    if manifest is not None:
        write_manifest(model_dir, manifest, fit, command)
    log(
        f"calibrate: wrote {CONFIG_KEY} = {fit['position_temperatures']} to {model_dir}/config.json"
        f"{' and the manifest' if manifest is not None else ''} ({time.perf_counter() - t0:.0f}s)"
    )
    return info


def write_json(path: str, obj: dict, indent: int) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def write_config(model_dir: str, temps: list[float]) -> None:
    """config.json with CONFIG_KEY set, in state.write_model_dir's format."""
    path = os.path.join(model_dir, "config.json")
    config = load(path)
    config[CONFIG_KEY] = [float(t) for t in temps]
    write_json(path, config, 2)


def write_manifest(model_dir: str, manifest: dict, fit: dict, command: str) -> None:
    """The fit's figures under "drafter", the command (replacing an earlier calibrate's), and
    config.json's new size and hash (dspark_loop.config.default_model checks sizes at start)."""
    manifest["drafter"].update(fit)
    cmds = [c for c in manifest.get("commands", []) if " calibrate " not in f" {c} "]
    manifest["commands"] = cmds + [command]
    manifest["files"]["config.json"] = file_entry(os.path.join(model_dir, "config.json"))
    write_json(os.path.join(model_dir, DEMO_MANIFEST), manifest, 1)
