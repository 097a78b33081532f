import asyncio

import pytest
import zmq
import zmq.asyncio

from dspark_loop.errors import MeshStartError
from dspark_loop.mesh import Mesh
from dspark_loop.protocol import ENCODER, PROTOCOL_VERSION, Hello, RankConfig, identity
from tests.integration.mesh.conftest import alive, make_mesh


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
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, identity(0))
    dealer.connect(mesh.address)
    try:
        await dealer.send(ENCODER.encode(Hello(PROTOCOL_VERSION + 1, 0, 1, 1234, [8])))
        with pytest.raises(MeshStartError, match="protocol version .* refused"):
            await asyncio.wait_for(mesh.start(), 5.0)
    finally:
        dealer.close(linger=0)
        ctx.term()


async def test_start_times_out_with_the_missing_ranks_named(fake_model_dir):
    """start() must give up after start_timeout_s and say which ranks never said Hello."""
    mesh = Mesh(RankConfig(model=fake_model_dir, world_size=2), launch=False, start_timeout_s=0.5)
    with pytest.raises(MeshStartError, match=r"ranks \[0, 1\] did not say Hello within"):
        await mesh.start()
