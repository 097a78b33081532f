import asyncio

import pytest

from dspark_loop.contract.checkpoint_fingerprint import checkpoint_fingerprint
from dspark_loop.contract.errors import MeshStartError
from dspark_loop.contract.protocol import PROTOCOL_VERSION, Hello, RankConfig
from dspark_loop.mesh.mesh import Mesh
from tests.integration.mesh.conftest import alive, hand_rank, make_mesh


async def test_rank_that_cannot_load_its_model_fails_start_with_its_message(tmp_path):
    """A rank that fails to load (no checkpoint) must make start() raise MeshStartError with
    the rank's own error text, and no rank may be left running."""
    mesh = make_mesh(str(tmp_path / "missing"))
    with pytest.raises(MeshStartError, match="failed to start: FileNotFoundError: no config.json"):
        await mesh.start()
    assert not any(alive(p) for p in mesh.pids)
    assert mesh.dead is not None


async def test_hello_with_another_protocol_version_is_refused(fake_model_dir):
    """A rank speaking another protocol version must be refused at the handshake."""
    mesh = Mesh(RankConfig(model=fake_model_dir), launch=False, start_timeout_s=10.0)
    mesh.bind()
    hello = Hello(PROTOCOL_VERSION + 1, 0, 1, 1234, [8], fingerprint=checkpoint_fingerprint(fake_model_dir))
    rank = asyncio.ensure_future(hand_rank(mesh.address, mesh.secret, hello))
    with pytest.raises(MeshStartError, match="protocol version .* refused"):
        await asyncio.wait_for(mesh.start(), 5.0)
    rank.cancel()


async def test_a_rank_serving_another_checkpoint_is_refused(fake_model_dir):
    """A rank whose checkpoint has another fingerprint (config + tensor names) than the
    server's must stop the start-up with a message saying so."""
    mesh = Mesh(RankConfig(model=fake_model_dir), launch=False, start_timeout_s=10.0)
    mesh.bind()
    hello = Hello(PROTOCOL_VERSION, 0, 1, 1234, [8], fingerprint="0123456789abcdef" * 4)
    rank = asyncio.ensure_future(hand_rank(mesh.address, mesh.secret, hello))
    with pytest.raises(MeshStartError, match="rank 0 serves another checkpoint .*0123456789ab"):
        await asyncio.wait_for(mesh.start(), 5.0)
    rank.cancel()


async def test_a_rank_without_the_secret_is_not_heard(fake_model_dir, caplog):
    """A Hello signed with another secret must not count: the server logs the refusal and
    start() times out naming that rank as missing."""
    mesh = Mesh(RankConfig(model=fake_model_dir), launch=False, start_timeout_s=1.5)
    mesh.bind()
    hello = Hello(PROTOCOL_VERSION, 0, 1, 1234, [8], fingerprint=checkpoint_fingerprint(fake_model_dir))
    rank = asyncio.ensure_future(hand_rank(mesh.address, "not-the-secret-of-this-mesh", hello))
    with pytest.raises(MeshStartError, match=r"ranks \[0\] did not say Hello within"):
        await mesh.start()
    rank.cancel()
    assert "rank 0 failed authentication: its DSPARK_MESH_SECRET differs" in caplog.text


async def test_start_times_out_with_the_missing_ranks_named(fake_model_dir):
    """start() must give up after start_timeout_s and say which ranks never said Hello."""
    mesh = Mesh(RankConfig(model=fake_model_dir, world_size=2), launch=False, start_timeout_s=0.5)
    with pytest.raises(MeshStartError, match=r"ranks \[0, 1\] did not say Hello within"):
        await mesh.start()
