from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sim_ckpt(tmp_path_factory) -> str:
    """A tiny checkpoint without weights (config, drafter keys, tokenizer): all the sim reads."""
    from tools.make_checkpoint import make_checkpoint

    out = tmp_path_factory.mktemp("sim") / "tiny"
    return make_checkpoint(str(out), size="tiny", with_drafter=True, no_weights=True, quiet=True)
