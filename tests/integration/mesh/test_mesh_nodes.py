"""Node 0's Mesh and node 1's agent in one test process, the ranks (fake runner) as real
processes: joining, steps across nodes, refusals, and losing either node."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from dspark_loop.config.server_config import ServerConfig
from dspark_loop.contract.errors import EngineDead, MeshStartError
from dspark_loop.contract.protocol import RankConfig, as_i32
from dspark_loop.mesh.node_agent import NodeAgent
from dspark_loop.mesh.nodes import NodeLayout
from tests.e2e.nodes import free_port_pair
from tests.integration.mesh.conftest import FAKE_RUNNER, alive, fake_env, make_mesh, wait_until
from tests.integration.mesh.fake_runner import expected_token
from tests.integration.mesh.plans import decode_plan, expected_rows, prefill_plan
from workers.comm import ShardSpec

SECRET = "nodes-test-secret-0123456789"


@pytest.fixture(autouse=True)
def rank_pythonpath(monkeypatch):
    """The agent spawns ranks with its own environment: they must find the fake runner."""
    monkeypatch.setenv("PYTHONPATH", fake_env()["PYTHONPATH"])


def node0(model_dir: str, port: int, **overrides):
    return make_mesh(
        model_dir,
        nodes=NodeLayout(2, 0, 4),
        host="127.0.0.1",
        port=port + 1,
        dist_port=port,
        secret=SECRET,
        **overrides,
    )


def agent(model_dir: str, port: int, timeout_s: float = 60.0, **rank_overrides) -> NodeAgent:
    cfg = ServerConfig(
        model=model_dir,
        dp=2,
        tp=2,
        ep=4,
        devices=(0, 1),
        nnodes=2,
        node_rank=1,
        dist_init_addr=f"127.0.0.1:{port}",
        dist_timeout_s=timeout_s,
    )
    rank_cfg = RankConfig(
        **{
            **dict(model=model_dir, world_size=4, tp=2, block_size=16, runner=FAKE_RUNNER, log_level="warning"),
            **rank_overrides,
        }
    )
    return NodeAgent(cfg, rank_cfg, SECRET)


async def test_node_1_started_first_joins_serves_steps_and_exits_0_on_close(fake_model_dir):
    """An agent started before node 0 must join when node 0 comes up; node 0 must spawn only
    ranks 0-1, the agent ranks 2-3; steps must carry collectives across both nodes; close()
    must make the agent exit 0 with its ranks gone."""
    port = free_port_pair()
    node1 = agent(fake_model_dir, port)
    agent_run = asyncio.ensure_future(node1.run())
    assert await wait_until(lambda: node1.knocker.nonce != b"", 60.0)  # it knocked on a closed door
    mesh = node0(fake_model_dir, port)
    try:
        await mesh.start()
        assert len(mesh.pids) == 2 and len(node1.procs.pids) == 2
        remote_pids = node1.procs.pids
        for step_id in range(3):
            plan = prefill_plan(step_id, 2) if step_id == 0 else decode_plan(step_id, 2)
            results = await mesh.step(plan)
            for group, result in enumerate(results):
                leader = ShardSpec(rank=group * 2, world_size=4, tp_size=2)
                want = [expected_token(r, p, leader) for r, p in expected_rows(step_id, group)]
                np.testing.assert_array_equal(as_i32(result.token_ids), want)
    finally:
        await mesh.close()
    assert await asyncio.wait_for(agent_run, 30) == 0
    assert await wait_until(lambda: not any(alive(p) for p in remote_pids), 5.0)


async def test_a_killed_rank_on_node_1_kills_the_mesh_naming_node_1(fake_model_dir):
    """SIGKILL on a rank of node 1 must make the next step raise EngineDead naming that node,
    stop node 0's ranks, and make the agent stop its ranks and exit 1."""
    port = free_port_pair()
    mesh = node0(fake_model_dir, port)
    node1 = agent(fake_model_dir, port)
    agent_run = asyncio.ensure_future(node1.run())
    try:
        await mesh.start()
        await mesh.step(prefill_plan(0, 2))
        local, remote = mesh.pids, node1.procs.pids
        os.kill(remote[1], signal.SIGKILL)
        with pytest.raises(EngineDead, match="node 1"):
            for step_id in range(1, 200):
                await mesh.step(decode_plan(step_id, 2))
        assert "node 1" in mesh.dead
        assert await asyncio.wait_for(agent_run, 30) == 1
        assert await wait_until(lambda: not any(alive(p) for p in local + remote), 5.0)
    finally:
        await mesh.close()
        agent_run.cancel()


async def test_an_agent_with_other_flags_is_refused_and_node_0_names_it_at_timeout(fake_model_dir, capsys):
    """An agent whose run-shaping flags differ must exit 2 printing node 0's reason, and
    node 0 must time out naming node 1, quoting that refusal and how to start node 1."""
    port = free_port_pair()
    mesh = node0(fake_model_dir, port, launch=False, start_timeout_s=3.0)
    node1 = agent(fake_model_dir, port, block_size=32)
    start = asyncio.ensure_future(mesh.start())
    assert await asyncio.wait_for(node1.run(), 30) == 2
    assert (
        "node 0 refused this node: node 1 was started with other flags than node 0: "
        "block_size 32 (node 0: 16)" in capsys.readouterr().err
    )
    with pytest.raises(MeshStartError) as err:
        await start
    assert "node 1 (ranks 2, 3) never joined (last attempt refused: node 1 was started" in str(err.value)
    assert "--node-rank {node}" not in str(err.value)
    assert f"--nnodes 2 --node-rank 1 --dist-init-addr 127.0.0.1:{port}" in str(err.value)
    await mesh.close()


async def test_an_agent_whose_node_0_vanishes_waits_then_exits_1(fake_model_dir, capsys):
    """When node 0's socket goes away the agent must stop its ranks and wait for node 0 to
    come back; when it does not within --dist-timeout it must exit 1 saying so."""
    port = free_port_pair()
    mesh = node0(fake_model_dir, port)
    node1 = agent(fake_model_dir, port, timeout_s=4.0)
    agent_run = asyncio.ensure_future(node1.run())
    try:
        await mesh.start()
        remote = node1.procs.pids
        mesh.socket.close()  # node 0 vanishes without a word
        mesh.socket = None
        assert await wait_until(lambda: not any(alive(p) for p in remote), 10.0)
        assert await asyncio.wait_for(agent_run, 30) == 1
        assert "did not answer within 4 s" in capsys.readouterr().err
    finally:
        await mesh.close()


async def test_a_dying_mesh_that_will_restart_makes_the_agent_rejoin_the_next_one(fake_model_dir):
    """With rejoin_on_death() true (recovery will restart the mesh), a killed rank on node 0
    must make the agent stop its ranks but not exit; a second Mesh on the same ports must
    admit it again, with fresh ranks on both nodes, and serve a step; closing that one must
    make the agent exit 0."""
    port = free_port_pair()
    mesh = node0(fake_model_dir, port)
    mesh.rejoin_on_death = lambda: True
    node1 = agent(fake_model_dir, port)
    agent_run = asyncio.ensure_future(node1.run())
    second = None
    try:
        await mesh.start()
        await mesh.step(prefill_plan(0, 2))
        local, remote = mesh.pids, node1.procs.pids
        os.kill(local[0], signal.SIGKILL)
        with pytest.raises(EngineDead, match="rank 0"):
            for step_id in range(1, 200):
                await mesh.step(decode_plan(step_id, 2))
        await mesh.close(grace_s=0.0)
        assert await wait_until(lambda: not any(alive(p) for p in local + remote), 10.0)
        assert not agent_run.done()
        second = node0(fake_model_dir, port)
        await second.start()
        assert not set(node1.procs.pids) & set(remote) and len(node1.procs.pids) == 2
        results = await second.step(prefill_plan(0, 2))
        assert len(results) == 2
    finally:
        await mesh.close()
        if second is not None:
            await second.close()
    assert await asyncio.wait_for(agent_run, 30) == 0
