"""Two "hosts" on one machine: node 0 (API server, engine, ranks 0-1) and node 1 (ranks 2-3),
two launches on loopback with different --node-rank, joined over ZeroMQ + torch.distributed.

NOTE: both nodes share one network namespace here (loopback); test_two_nodes_netns.py runs
node 1 in its own namespace where the machine allows it."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from dspark_testing.prompts import TEXTS, token_prompt
from dspark_testing.server_process import ServerProcess, pools_full, wait_gone
from dspark_testing.stream_client import open_stream, read_while_flowing
from tests.e2e.nodes import SECRET_ENV_VARS, NodeProcess, free_port_pair, node_args

PROMPTS = [TEXTS[0], token_prompt(40, seed=3), [0]]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def two_nodes(tiny_ckpt):
    """Node 1 starts first and waits for node 0 (either order must work)."""
    port = free_port_pair()
    node1 = NodeProcess(node_args(tiny_ckpt, port, 1), env=SECRET_ENV_VARS)
    try:
        node0 = ServerProcess(node_args(tiny_ckpt, port, 0), env=SECRET_ENV_VARS, timeout_s=300)
    except BaseException:
        node1.stop()
        raise
    yield node0, node1
    node0.stop()
    node1.stop()


def test_dp2_tp2_ep4_split_over_two_nodes_serves_the_single_host_tokens(two_nodes, solo4):
    """Ranks 0-1 on node 0 and 2-3 on node 1 (one TP group each, experts over all four) must
    serve exactly the greedy tokens of the same topology on one host, and both nodes must
    shut down cleanly (node 0 exits 0, node 1's agent then exits 0, no rank left)."""
    node0, node1 = two_nodes
    assert len(node0.ranks) == 2 and len(node1.rank_pids()) == 2
    for prompt in PROMPTS:
        got = node0.complete(prompt, MAX_TOKENS)["choices"][0]["token_ids"]
        assert got == solo4(prompt, MAX_TOKENS), prompt
    assert pools_full(node0.wait_idle())
    ranks = node0.ranks + node1.rank_pids()
    assert node0.stop() == 0, node0.log()[-3000:]
    assert node1.wait(30) == 0, node1.log()[-3000:]
    assert wait_gone(ranks, 10) == []


def test_wrong_secret_other_checkpoint_or_flags_on_node_1_are_refused(tiny_ckpt, tmp_path):
    """While node 0 waits, a node 1 with another DSPARK_MESH_SECRET, another checkpoint or
    another --max-model-len must each exit 2 with a message saying why and node 0 must log
    each refusal; SIGTERM must then stop the waiting node 0 at once (not after
    --dist-timeout). (The timeout message itself: tests/integration/mesh/test_mesh_nodes.py.)"""
    from tools.make_checkpoint import make_checkpoint

    other = make_checkpoint(str(tmp_path / "other"), size="tiny", seed=7, with_drafter=True, quiet=True)
    port = free_port_pair()
    node0 = ServerProcess(node_args(tiny_ckpt, port, 0), env=SECRET_ENV_VARS, wait=False)
    try:
        cases = [
            (
                node_args(tiny_ckpt, port, 1),
                {"DSPARK_MESH_SECRET": "another-secret-0123456789"},
                "could not prove it has our DSPARK_MESH_SECRET",
                "failed authentication",
            ),
            (
                node_args(other, port, 1),
                SECRET_ENV_VARS,
                "node 0 refused this node: node 1 serves another checkpoint",
                "another checkpoint",
            ),
            (
                node_args(tiny_ckpt, port, 1, "--max-model-len", "512"),
                SECRET_ENV_VARS,
                "max_model_len 512 (node 0: 1024)",
                "max_model_len 512",
            ),
        ]
        for args, env, node1_says, node0_says in cases:
            node1 = NodeProcess(args, env=env)
            assert node1.wait(120) == 2, node1.log()[-3000:]
            assert node1_says in node1.log(), node1.log()[-3000:]
            assert node0_says in node0.log(), node0.log()[-3000:]
        ranks0 = node0.rank_pids()  # waiting for ranks 2-3 in torch.distributed's rendezvous
        assert len(ranks0) == 2
        assert node0.stop(signal.SIGTERM, timeout_s=30) == 0, node0.log()[-3000:]
        assert "start-up interrupted" in node0.log()
        assert wait_gone(ranks0, 10) == []
    finally:
        node0.stop()


async def test_losing_node_1_mid_stream_ends_every_stream_with_an_error(tiny_ckpt, http):
    """With recovery off (--max-rank-restarts 0), SIGKILL on node 1 (its agent and its ranks,
    a host losing power) while 3 streams run must end each stream with one error event naming
    node 1, then [DONE]; /health must say 503 and node 0's own ranks must be stopped.
    (Recovery from a lost node: test_two_nodes_recovery.py.)"""
    port = free_port_pair()
    node0 = ServerProcess(node_args(tiny_ckpt, port, 0, "--max-rank-restarts", "0"), env=SECRET_ENV_VARS, wait=False)
    node1 = NodeProcess(node_args(tiny_ckpt, port, 1), env=SECRET_ENV_VARS)
    try:
        await asyncio.to_thread(node0.wait_ready, 300)
        ranks0 = node0.rank_pids()
        streams = [
            await open_stream(
                http, node0.url, {"prompt": token_prompt(20 + i, seed=i), "max_tokens": 900, "ignore_eos": True}
            )
            for i in range(3)
        ]
        readers = await read_while_flowing(streams)  # tokens are flowing on every stream
        assert not any(r.done() for r in readers)
        gone = node1.kill()
        killed_at = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*readers), timeout=30)
        for events in results:
            assert events[-1] == "[DONE]"
            errors = [e for e in events if isinstance(e, dict) and "error" in e]
            assert len(errors) == 1 and "node 1" in errors[0]["error"]["message"], events[-3:]
        assert time.monotonic() - killed_at < 30
        status, body = await asyncio.to_thread(node0.get, "/health")
        assert status == 503 and "node 1" in body, body
        assert await asyncio.to_thread(wait_gone, ranks0 + gone, 10) == []
    finally:
        node1.stop()
        assert node0.stop(signal.SIGTERM) == 0, node0.log()[-3000:]
