import numpy as np

from dspark_loop.contract.protocol import as_i32
from tests.integration.mesh.conftest import alive, make_mesh, reached, wait_until
from tests.integration.mesh.fake_runner import expected_token
from tests.integration.mesh.plans import decode_plan, expected_rows, prefill_plan
from workers.comm import ShardSpec


async def test_four_ranks_in_two_tp_groups_answer_twenty_steps_with_collective_results(fake_model_dir):
    """4 ranks at tp 2 must handshake, report the per-family minimum of num_blocks, and answer
    20 steps with the leaders' tokens in partition order, each token carrying the right
    gather_tp / gather_world / argmax_tp results from the other processes."""
    mesh = make_mesh(fake_model_dir, num_blocks=12)
    await mesh.start()
    try:
        assert mesh.num_blocks == [12, 100 - 3]  # the fake gives 100 - rank pages in family 1
        for step_id in range(20):
            plan = prefill_plan(step_id, 2) if step_id == 0 else decode_plan(step_id, 2)
            results = await mesh.step(plan)
            assert [r.rank for r in results] == [0, 2]
            for group, result in enumerate(results):
                assert result.step_id == step_id and not result.error
                leader = ShardSpec(rank=group * 2, world_size=4, tp_size=2)
                want = [expected_token(req, pos, leader) for req, pos in expected_rows(step_id, group)]
                np.testing.assert_array_equal(as_i32(result.token_ids), want)
        assert mesh.dead is None
    finally:
        pids = mesh.pids
        await mesh.close()
    assert await wait_until(lambda: not any(alive(p) for p in pids), 5.0)


async def test_close_is_safe_twice_and_concurrently(fake_model_dir):
    """close() must shut every rank down once, however often and however concurrently it is
    called (a signal handler and the normal exit path may both call it)."""
    import asyncio

    mesh = make_mesh(fake_model_dir, world_size=2, tp=1)
    await mesh.start()
    pids = mesh.pids
    await asyncio.gather(mesh.close(), mesh.close())
    await mesh.close()
    assert not any(alive(p) for p in pids)
    assert [p.returncode for p in mesh.procs.procs] == [0, 0]  # they obeyed Shutdown


async def test_masks_that_follow_the_plan_reach_every_rank_before_it_samples(fake_model_dir):
    """A plan with masks_follow must wait, on every rank of each TP group, for the StepMasks
    sent after it: each masked row answers its group's
    mask, the other rows their usual targets, and the plan after it runs normally (every
    rank took the masks off its socket, masked rows or not)."""
    from dspark_loop.contract.protocol import StepMasks, TokenMask, pack_mask
    from tests.integration.mesh.fake_runner import VOCAB

    def only(token: int) -> bytes:
        allowed = np.zeros(VOCAB, bool)
        allowed[token] = True
        return pack_mask(allowed)

    mesh = make_mesh(fake_model_dir, num_blocks=12)
    await mesh.start()
    try:
        await mesh.step(prefill_plan(0, 2))
        plan = decode_plan(1, 2)
        plan.masks_follow = True
        await mesh.send(plan)
        assert await wait_until(lambda: reached(fake_model_dir, "waits-for-masks", range(4)), 60.0)
        # group 0: request a's only row and request b's row 3; group 1: nothing masked
        a, b = 100, 200
        await mesh.send_masks(StepMasks(1, [[TokenMask(a, only(5)), TokenMask(b, only(9), 3)], []]))
        await mesh.send(decode_plan(2, 2))  # two steps in flight: the next plan follows the masks
        for step_id in (1, 2):
            results = await mesh.gather(step_id)
            for group, result in enumerate(results):
                assert not result.error, result.error
                leader = ShardSpec(rank=group * 2, world_size=4, tp_size=2)
                want = [expected_token(req, pos, leader) for req, pos in expected_rows(step_id, group)]
                if step_id == 1 and group == 0:
                    base = expected_token(a, 0, leader) - (31 * a) % VOCAB  # the collective part
                    want[0], want[1 + 3] = base + 5, base + 9
                np.testing.assert_array_equal(as_i32(result.token_ids), want)
        assert mesh.dead is None
    finally:
        await mesh.close()


async def test_a_rank_waiting_for_masks_obeys_shutdown(fake_model_dir):
    """Closing the mesh while its ranks wait for a step's masks must end them cleanly (exit 0)."""
    mesh = make_mesh(fake_model_dir, world_size=2, tp=1)
    await mesh.start()
    await mesh.step(prefill_plan(0, 2))
    plan = decode_plan(1, 2)
    plan.masks_follow = True
    await mesh.send(plan)
    assert await wait_until(lambda: reached(fake_model_dir, "waits-for-masks", range(2)), 60.0)
    pids = mesh.pids
    await mesh.close()
    assert await wait_until(lambda: not any(alive(p) for p in pids), 5.0)
    assert [p.returncode for p in mesh.procs.procs] == [0, 0]
