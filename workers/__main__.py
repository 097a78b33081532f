"""python -m workers: one rank process. The server spawns these; on several hosts start
them by hand with the server's addresses:

    python -m workers --rank 3 --world-size 8 --tp 4 \\
        --connect tcp://10.0.0.1:5555 --dist-init tcp://10.0.0.1:29500 \\
        --model /ckpt --backend npu --device-id 3
"""
from __future__ import annotations

import argparse
import logging
import sys

from workers.rank import DEFAULT_RUNNER, RankArgs, run


def parse_args(argv: list[str] | None = None) -> RankArgs:
    p = argparse.ArgumentParser(prog="python -m workers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--connect", required=True, help="the server's ZMQ address, tcp://host:port")
    p.add_argument("--dist-init", required=True, help="torch.distributed rendezvous, tcp://host:port")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--num-blocks", type=int, default=None, help="pages per cache family")
    p.add_argument("--kv-cache-memory", type=int, default=None, help="bytes for the KV pools")
    p.add_argument("--backend", default="cpu", choices=["cpu", "npu", "cuda", "auto"])
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    p.add_argument("--runner", default=DEFAULT_RUNNER, help="module:Class (tests use a fake)")
    p.add_argument("--dist-timeout-s", type=float, default=600.0)
    p.add_argument("--spec-k", type=int, default=0, choices=[0, 7], help="DSpark speculative tokens")
    p.add_argument("--num-leases", type=int, default=0, help="drafter leases per TP group (K=7)")
    p.add_argument("--max-model-len", type=int, default=1 << 30, help="position ceiling (K=7)")
    p.add_argument("--log-level", default="info")
    ns = p.parse_args(argv)
    if ns.world_size % ns.tp or not 0 <= ns.rank < ns.world_size:
        p.error(f"rank {ns.rank} / world size {ns.world_size} / tp {ns.tp} is not a topology")
    logging.basicConfig(level=ns.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s rank{ns.rank} %(levelname)s %(name)s: %(message)s")
    fields = {k: v for k, v in vars(ns).items() if k != "log_level"}
    return RankArgs(**fields)


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
