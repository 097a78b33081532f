import asyncio
import os
import pathlib

import pytest

from dspark_loop.mesh import Mesh
from dspark_loop.protocol import DEFAULT_RUNNER, RankConfig

REPO = pathlib.Path(__file__).resolve().parents[3]
FAKE_RUNNER = "tests.integration.mesh.fake_runner:FakeRunner"


@pytest.fixture
def fake_model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


def fake_env() -> dict[str, str]:
    """The rank must import the fake runner from the tests package."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def make_mesh(model_dir: str, **overrides) -> Mesh:
    """overrides: RankConfig fields (runner=None: the real ModelRunner) or Mesh options."""
    rank = dict(model=model_dir, world_size=4, tp=2, block_size=16, runner=FAKE_RUNNER,
                log_level="warning")
    mesh = dict(env=fake_env(), start_timeout_s=60.0, step_timeout_s=30.0)
    for key, value in overrides.items():
        (rank if key in RankConfig.__struct_fields__ else mesh)[key] = value
    if rank["runner"] is None:
        rank["runner"] = DEFAULT_RUNNER
    return Mesh(RankConfig(**rank), **mesh)


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def wait_until(cond, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True
