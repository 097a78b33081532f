"""The handshake end to end without sockets: Knocker (peer side) against Peers (server side)."""

from __future__ import annotations

import msgspec
import pytest

from dspark_loop.contract.mesh_join import JoinError, Knocker
from dspark_loop.contract.protocol import PROTOCOL_VERSION, Hello, NodeHello, RankExited
from dspark_loop.mesh.nodes import NodeLayout
from dspark_loop.mesh.peers import Peers, peer_name, remote_loss

SECRET = "a-secret-of-some-length"
RANK1 = b"rank1"


def hello(**overrides) -> Hello:
    return Hello(PROTOCOL_VERSION, 1, 2, 1234, [8], **overrides)


def test_a_peer_with_the_secret_is_admitted_on_its_connection_only():
    """Knock -> Challenge -> signed Hello must admit the peer on the connection it came
    from, and frames from another connection under the same identity must not count."""
    peers, knocker = Peers(SECRET, {RANK1}), Knocker(SECRET, "node 0")
    challenge = peers.answer(RANK1, knocker.knock())
    assert knocker.accepts(challenge)
    assert peers.admit(RANK1, 7, knocker.sign(hello(), challenge)) is None
    assert peers.is_admitted(RANK1, 7) and not peers.is_admitted(RANK1, 8)


def test_a_wrong_secret_fails_on_both_sides_with_a_message():
    """A peer with another secret must reject the server's proof, and the server must refuse
    its Hello naming the variable."""
    peers, knocker = Peers(SECRET, {RANK1}), Knocker("another-secret-entirely", "node 0 at X")
    challenge = peers.answer(RANK1, knocker.knock())
    with pytest.raises(JoinError, match="node 0 at X could not prove it has our DSPARK_MESH_SECRET"):
        knocker.accepts(challenge)
    problem = peers.admit(RANK1, 7, knocker.sign(hello(), challenge))
    assert problem == "rank 1 failed authentication: its DSPARK_MESH_SECRET differs from node 0's: refused"
    assert not peers.is_admitted(RANK1, 7)


def test_a_replayed_or_edited_hello_is_refused():
    """A Hello signed for an earlier nonce (a replay) or edited after signing must be refused,
    and a Hello without a Knock too."""
    peers, knocker = Peers(SECRET, {RANK1}), Knocker(SECRET, "node 0")
    first = peers.answer(RANK1, knocker.knock())
    signed = knocker.sign(hello(), first)
    assert peers.admit(RANK1, 7, signed) is None
    peers.answer(RANK1, knocker.knock())  # a new connection, a new nonce
    assert "failed authentication" in peers.admit(RANK1, 9, signed)
    challenge = peers.answer(RANK1, knocker.knock())
    edited = msgspec.structs.replace(knocker.sign(hello(), challenge), num_blocks=[9999])
    assert "failed authentication" in peers.admit(RANK1, 9, edited)
    assert "without knocking first" in peers.admit(RANK1, 9, knocker.sign(hello(), challenge))


def test_only_known_identities_get_a_challenge_and_stale_ones_are_ignored():
    """An identity that is not one of the mesh's peers must get no Challenge; a Challenge for
    an older Knock must be ignored by the peer (it knocked again), not taken as a failure."""
    peers, knocker = Peers(SECRET, {RANK1}), Knocker(SECRET, "node 0")
    assert peers.answer(b"intruder", knocker.knock()) is None
    old = peers.answer(RANK1, knocker.knock())
    new = peers.answer(RANK1, knocker.knock())
    assert not knocker.accepts(old) and knocker.accepts(new)
    node_hello = knocker.sign(NodeHello(PROTOCOL_VERSION, 1, 2, "fp", "{}"), new)
    assert Peers(SECRET, {RANK1}).admit(RANK1, 1, node_hello) is not None  # other server, no nonce
    assert peers.admit(RANK1, 3, node_hello) is None


def test_a_closed_connection_names_its_admitted_peer_once():
    """closed(fd) must name the admitted peer of that connection once and forget it; fds of
    unadmitted or replaced connections must name nobody."""
    peers, knocker = Peers(SECRET, {RANK1, b"node1"}), Knocker(SECRET, "node 0")
    for peer, fd in ((RANK1, 5), (b"node1", 6)):
        challenge = peers.answer(peer, knocker.knock())
        assert knocker.accepts(challenge)
        assert peers.admit(peer, fd, knocker.sign(hello(), challenge)) is None
    assert peers.closed(99) is None
    assert peers.closed(6) == b"node1" and peers.closed(6) is None
    assert peers.lost == [b"node1"] and not peers.is_admitted(b"node1", 6)
    assert peer_name(b"node1") == "node 1's agent" and peer_name(RANK1) == "rank 1"


def test_a_lost_node_is_named_by_its_node_and_the_exit_its_agent_reported():
    """A closed connection of another node's rank or agent must name that node (preferring
    the exit its agent reported); lost peers of node 0 must not count as a lost node."""
    nodes = NodeLayout(nnodes=2, world_size=4)
    assert remote_loss(nodes, [b"rank0", b"rank1"], []) is None
    assert remote_loss(nodes, [b"rank1", b"rank3"], []) == "node 1 lost: rank 3's connection closed"
    assert remote_loss(nodes, [b"node1"], []) == "node 1 lost: its agent's connection closed"
    exits = [RankExited(2, "signal SIGKILL")]
    assert remote_loss(nodes, [b"node1"], exits) == "rank 2 on node 1 exited with signal SIGKILL"
