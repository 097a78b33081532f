"""GlooComm across two real processes: every dtype the model gathers, ragged and empty rows."""

import multiprocessing as mp
import traceback

from dspark_loop.mesh.nodes import free_port


def _worker(rank: int, init: str, out) -> None:
    try:
        import torch

        from workers.comm import ShardSpec
        from workers.dist_comm import GlooComm, init_distributed

        torch.set_num_threads(1)
        shard = ShardSpec(rank=rank, world_size=2, tp_size=2)
        comm = GlooComm(shard, init_distributed(shard, init, "gloo", 60.0)[0])
        got = {}
        for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.int64, torch.bool):
            x = (torch.arange(6).reshape(2, 3) + 10 * rank).to(dtype)  # [2, 3]
            got[f"tp {dtype}"] = [p.tolist() for p in comm.gather_tp(x)]
            ragged = torch.full((rank * 3, 2), rank + 1).to(dtype)  # rank 0 sends no rows
            got[f"world {dtype}"] = [(p.dtype == dtype, list(p.shape), p.tolist()) for p in comm.gather_world(ragged)]
        got["empty"] = [list(p.shape) for p in comm.gather_world(torch.zeros(0, 4))]
        got["sum"] = comm.sum_tp(torch.tensor([0.1, 0.2]) * (rank + 1)).tolist()
        out.put((rank, got))
    except Exception:
        out.put((rank, traceback.format_exc()))


def test_gloo_comm_gathers_every_dtype_in_rank_order_and_keeps_ragged_rows():
    """gather_tp must return every rank's tensor in rank order with dtype and values intact;
    gather_world must keep each rank's own number of rows (zero included); sum_tp must add in
    rank order on every rank."""
    import torch

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    procs = [ctx.Process(target=_worker, args=(r, init, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(10)
    for rank in (0, 1):
        assert isinstance(results[rank], dict), results[rank]
    assert results[0] == results[1]
    got = results[0]
    for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.int64, torch.bool):
        want_tp = [(torch.arange(6).reshape(2, 3) + 10 * r).to(dtype).tolist() for r in (0, 1)]
        assert got[f"tp {dtype}"] == want_tp
        want_world = [(True, [0, 2], []), (True, [3, 2], torch.full((3, 2), 2).to(dtype).tolist())]
        assert got[f"world {dtype}"] == want_world
    assert got["empty"] == [[0, 4], [0, 4]]
    assert got["sum"] == (torch.tensor([0.1, 0.2]) + torch.tensor([0.1, 0.2]) * 2).tolist()
