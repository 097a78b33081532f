"""Two "hosts" in two network namespaces of one machine: node 1 sees node 0 only through a
veth pair (10.213.x.1 <-> 10.213.x.2), as a separate host would. Needs root and `ip netns`;
skipped elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from dspark_testing.prompts import TEXTS, token_prompt
from dspark_testing.server_process import ServerProcess, wait_gone
from tests.e2e.nodes import SECRET_ENV_VARS, NodeProcess, free_port_pair, node_args

PROMPTS = [TEXTS[0], token_prompt(40, seed=3)]
MAX_TOKENS = 8


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def namespace():
    """(namespace, node 0's address, node 0's interface, node 1's interface); torn down after."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = os.getpid() % 250 + 1
    ns, here, there = f"dspark-n1-{tag}", f"dsv0-{tag}", f"dsv1-{tag}"
    try:
        ip("netns", "add", ns)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot create a network namespace here: {e.stderr.decode().strip()}")
    try:
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", ns)
        ip("addr", "add", f"10.213.{tag}.1/30", "dev", here)
        ip("link", "set", here, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"10.213.{tag}.2/30", "dev", there)
        ip("netns", "exec", ns, "ip", "link", "set", there, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, f"10.213.{tag}.1", here, there
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)


@pytest.mark.slow
def test_two_nodes_in_separate_network_namespaces_serve_the_single_host_tokens(namespace, tiny_ckpt, solo4):
    """Node 1 in its own network namespace, reaching node 0 only over a veth pair, must join
    and serve exactly the single-host greedy tokens; both must shut down cleanly."""
    ns, address, here, there = namespace
    port = free_port_pair()
    args = [a.replace("127.0.0.1", address) for a in node_args(tiny_ckpt, port, 1)]
    # NOTE: gloo must listen on the veth (the hostname resolves to no address in the namespace).
    node1 = NodeProcess(
        ["--log-level", "info", *args],
        env={**SECRET_ENV_VARS, "GLOO_SOCKET_IFNAME": there},
        prefix=["ip", "netns", "exec", ns, sys.executable],
    )
    node0 = ServerProcess(
        [a.replace("127.0.0.1", address) for a in node_args(tiny_ckpt, port, 0)],
        env={**SECRET_ENV_VARS, "GLOO_SOCKET_IFNAME": here},
        wait=False,
    )
    try:
        node0.wait_ready(300)
        for prompt in PROMPTS:
            got = node0.complete(prompt, MAX_TOKENS)["choices"][0]["token_ids"]
            assert got == solo4(prompt, MAX_TOKENS), prompt
        ranks = node0.ranks + node1.rank_pids()
        assert len(ranks) == 4
        assert node0.stop() == 0, node0.log()[-3000:]
        assert node1.wait(30) == 0, node1.log()[-3000:]
        assert wait_gone(ranks, 10) == []
    finally:
        node0.stop()
        node1.stop()
