"""Recovery across two "hosts" (loopback, as test_two_nodes.py): node 1 is lost mid-stream
(SIGKILL of its agent and ranks), node 0 restarts its mesh and waits for node 1; once node
1's command is run again the server serves the tokens it served before the loss."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from dspark_testing.prompts import token_prompt
from dspark_testing.server_process import ServerProcess, pools_full, wait_gone
from dspark_testing.stream_client import open_stream, read_while_flowing
from tests.e2e.nodes import SECRET_ENV_VARS, NodeProcess, free_port_pair, node_args
from tests.e2e.test_rank_recovery import wait_health

PROBES = [[5, 6, 7], token_prompt(30, seed=11)]
MAX_TOKENS = 8


@pytest.mark.slow
async def test_a_lost_node_rejoins_and_the_server_serves_the_same_greedy_tokens(tiny_ckpt, http):
    """SIGKILL node 1 while 2 streams run: each stream must end with one error naming node 1
    then [DONE]; /health must say 503 "restarting" naming node 1 while node 1 is away; after
    node 1's command is run again /health must be 200, the probes must give exactly their
    greedy tokens from before the loss, node 0's old ranks must be gone, the pools full and
    dspark:mesh_restarts_total 1; both nodes must then shut down cleanly."""
    port = free_port_pair()
    node0 = ServerProcess(node_args(tiny_ckpt, port, 0), env=SECRET_ENV_VARS, wait=False)
    node1 = NodeProcess(node_args(tiny_ckpt, port, 1), env=SECRET_ENV_VARS)
    try:
        await asyncio.to_thread(node0.wait_ready, 300)
        before = [(await asyncio.to_thread(node0.complete, p, MAX_TOKENS))["choices"][0]["token_ids"] for p in PROBES]
        old_ranks = node0.rank_pids()
        streams = [
            await open_stream(
                http, node0.url, {"prompt": token_prompt(20 + i, seed=i), "max_tokens": 900, "ignore_eos": True}
            )
            for i in range(2)
        ]
        readers = await read_while_flowing(streams)  # tokens are flowing on every stream
        assert not any(r.done() for r in readers)
        gone = node1.kill()
        lost_at = time.monotonic()
        for events in await asyncio.wait_for(asyncio.gather(*readers), timeout=60):
            assert events[-1] == "[DONE]"
            errors = [e for e in events if isinstance(e, dict) and "error" in e]
            assert len(errors) == 1 and "node 1" in errors[0]["error"]["message"], events[-3:]
        status, body = await wait_health(node0, 503)
        assert body["status"] == "restarting" and "node 1" in body["reason"], body
        node1 = NodeProcess(node_args(tiny_ckpt, port, 1), env=SECRET_ENV_VARS)
        status, body = await wait_health(node0, 200, timeout_s=300)
        assert status == 200, (body, node0.log()[-3000:])
        serving_after_s = time.monotonic() - lost_at
        after = [(await asyncio.to_thread(node0.complete, p, MAX_TOKENS))["choices"][0]["token_ids"] for p in PROBES]
        assert after == before
        assert await asyncio.to_thread(wait_gone, old_ranks + gone, 10) == []
        assert pools_full(await asyncio.to_thread(node0.wait_idle))
        assert node0.metrics_json()["mesh_restarts_total"] == 1
        print(f"node 1 lost -> serving again: {serving_after_s:.1f} s (incl. the agent's restart)")
        ranks = node0.rank_pids() + node1.rank_pids()
        assert await asyncio.to_thread(node0.stop) == 0, node0.log()[-3000:]
        assert await asyncio.to_thread(node1.wait, 30) == 0, node1.log()[-3000:]
        assert await asyncio.to_thread(wait_gone, ranks, 10) == []
    finally:
        node1.stop()
        node0.stop(signal.SIGKILL)
