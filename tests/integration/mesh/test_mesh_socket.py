"""The ROUTER's doorkeeper over real sockets: who is heard, who is refused, who is lost."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from dspark_loop.contract.mesh_join import Knocker
from dspark_loop.contract.protocol import (
    ENCODER,
    PROTOCOL_VERSION,
    RANK_DECODER,
    Challenge,
    Hello,
    StepResult,
    identity,
)
from dspark_loop.mesh.router_socket import MeshSocket

SECRET = "the-mesh-secret-for-tests"


async def dealer_join(ctx, address: str, rank: int, secret: str = SECRET) -> zmq.asyncio.Socket:
    """A DEALER that knocks and says a signed Hello as rank `rank`."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity(rank))
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    knocker = Knocker(secret, address)
    await sock.send(ENCODER.encode(knocker.knock()))
    challenge = RANK_DECODER.decode(await asyncio.wait_for(sock.recv(), 5))
    assert isinstance(challenge, Challenge)
    # NOTE: sign even when the proof fails: the server must refuse the Hello itself.
    await sock.send(ENCODER.encode(knocker.sign(Hello(PROTOCOL_VERSION, rank, 2, 1, [4]), challenge)))
    return sock


async def join(router: MeshSocket, ctx, rank: int, secret: str = SECRET):
    """(the peer's socket, what router.recv() returned meanwhile): both sides run at once."""
    return await asyncio.gather(dealer_join(ctx, router.address, rank, secret), router.recv(2))


async def test_an_admitted_peer_is_heard_and_an_unadmitted_one_is_not():
    """After a signed Hello a rank's StepResult must reach recv(); a DEALER that never said
    Hello must not be heard even when it claims another rank's identity."""
    router = MeshSocket(SECRET, {identity(0), identity(1)})
    router.address = router.bind("127.0.0.1")
    ctx = zmq.asyncio.Context()
    try:
        rank0, (sender, hello) = await join(router, ctx, 0)
        assert sender == identity(0) and isinstance(hello, Hello)
        intruder = ctx.socket(zmq.DEALER)
        intruder.setsockopt(zmq.IDENTITY, identity(1))
        intruder.setsockopt(zmq.LINGER, 0)
        intruder.connect(router.address)
        await intruder.send(ENCODER.encode(StepResult(1, 1)))
        await rank0.send(ENCODER.encode(StepResult(1, 0)))
        sender, result = await router.recv(5)
        assert sender == identity(0) and result.rank == 0
        assert await router.recv(0.3) is None  # the intruder's frame was dropped
        for s in (rank0, intruder):
            s.close()
    finally:
        router.close()
        ctx.destroy(linger=0)


async def test_a_peer_with_another_secret_is_refused_with_a_message():
    """A Hello signed with another secret must not be returned, and the refusal must be kept
    with a message naming the variable."""
    router = MeshSocket(SECRET, {identity(1)})
    router.address = router.bind("127.0.0.1")
    ctx = zmq.asyncio.Context()
    try:
        sock, got = await join(router, ctx, 1, secret="not-the-mesh-secret-at-all")
        assert got is None
        assert "DSPARK_MESH_SECRET differs" in router.refusals[identity(1)]
        sock.close()
    finally:
        router.close()
        ctx.destroy(linger=0)


async def test_a_closed_connection_names_the_lost_peer():
    """When an admitted peer's connection closes, poll_lost() must name it (within a second)."""
    router = MeshSocket(SECRET, {identity(0), identity(1)})
    router.address = router.bind("127.0.0.1")
    ctx = zmq.asyncio.Context()
    try:
        socks = []
        for rank in (0, 1):
            sock, got = await join(router, ctx, rank)
            socks.append(sock)
            assert got[0] == identity(rank)
        assert router.poll_lost() == []
        socks[1].close()
        lost = []
        for _ in range(50):
            lost += router.poll_lost()
            if lost:
                break
            await asyncio.sleep(0.02)
        assert lost == [identity(1)]
        socks[0].close()
    finally:
        router.close()
        ctx.destroy(linger=0)
