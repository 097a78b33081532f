"""The start-up handshake's rules: who may join the mesh, and the pool size it agrees on.

A rank's DEALER identity is b"rank<R>" on both sides; its Hello must come from that socket,
speak this server's protocol version and name the same world. Torch-free.
"""
from __future__ import annotations

from dspark_loop.errors import MeshStartError
from dspark_loop.protocol import PROTOCOL_VERSION, Hello, identity


def hello_problem(hello: Hello, sender: bytes, world_size: int, seen: set[int]) -> str | None:
    """Why this Hello must stop the start-up, or None."""
    if hello.protocol_version != PROTOCOL_VERSION:
        return (f"rank {hello.rank} speaks protocol version {hello.protocol_version}, "
                f"the server speaks {PROTOCOL_VERSION}: refused")
    if hello.error:
        return f"rank {hello.rank} failed to start: {hello.error}"
    if hello.world_size != world_size or not 0 <= hello.rank < world_size:
        return f"rank {hello.rank} of {hello.world_size} joined a mesh of {world_size} ranks"
    if sender != identity(hello.rank):
        return f"rank {hello.rank} said Hello from socket {sender!r}"
    if hello.rank in seen:
        return f"rank {hello.rank} said Hello twice"
    return None


def min_num_blocks(hellos: list[Hello]) -> list[int]:
    families = {len(h.num_blocks) for h in hellos}
    if len(families) != 1:
        raise MeshStartError(f"ranks disagree on the number of cache families: {sorted(families)}")
    return [min(col) for col in zip(*(h.num_blocks for h in hellos))]
