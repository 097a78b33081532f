import asyncio
import os
import signal
import time

import pytest

from dspark_loop.contract.errors import EngineDead
from tests.integration.mesh.conftest import alive, make_mesh, reached, wait_until
from tests.integration.mesh.fake_runner import FAIL_REQ, HANG_REQ
from tests.integration.mesh.plans import decode_plan, prefill_plan


async def test_killed_rank_makes_step_raise_engine_dead_and_stops_every_other_rank(fake_model_dir):
    """A rank killed mid-run must make the next step raise EngineDead naming that rank within
    seconds, set `dead`, and leave no other rank running shortly after."""
    mesh = make_mesh(fake_model_dir)
    await mesh.start()
    try:
        await mesh.step(prefill_plan(0, 2))
        pids = mesh.pids
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(EngineDead, match="rank 1 .*SIGKILL"):
            for step_id in range(1, 100):
                await mesh.step(decode_plan(step_id, 2))
        assert time.monotonic() - t0 < 5.0
        assert "rank 1" in mesh.dead
        assert await wait_until(lambda: not any(alive(p) for p in pids), 5.0)
        with pytest.raises(EngineDead):
            await mesh.step(decode_plan(100, 2))
    finally:
        await mesh.close()


async def test_idle_watcher_notices_a_dead_rank_without_a_step(fake_model_dir):
    """A rank dying while no step runs must set `dead` within a couple of seconds, so /health
    can turn 503 without waiting for a request."""
    mesh = make_mesh(fake_model_dir, world_size=2, tp=2)
    await mesh.start()
    try:
        os.kill(mesh.pids[0], signal.SIGKILL)
        assert await wait_until(lambda: mesh.dead is not None, 3.0)
        assert "rank 0" in mesh.dead
        assert await wait_until(lambda: not any(alive(p) for p in mesh.pids), 5.0)
    finally:
        await mesh.close()


async def test_rank_failing_a_step_reports_its_error_and_the_mesh_dies(fake_model_dir):
    """An exception inside a rank's step must come back as EngineDead carrying the rank's
    message, and the rank processes must all be gone afterwards."""
    mesh = make_mesh(fake_model_dir)
    await mesh.start()
    try:
        with pytest.raises(EngineDead, match="fake runner asked to fail"):
            await mesh.step(prefill_plan(0, 2, req_id_override=FAIL_REQ))
        assert await wait_until(lambda: not any(alive(p) for p in mesh.pids), 5.0)
    finally:
        await mesh.close()


async def test_rank_that_stops_answering_trips_the_step_timeout(fake_model_dir):
    """A step no rank answers within step_timeout_s must raise EngineDead naming the silent
    ranks, and the hung ranks must be killed."""
    mesh = make_mesh(fake_model_dir, world_size=2, tp=1, step_timeout_s=1.5)
    await mesh.start()
    try:
        await mesh.step(prefill_plan(0, 2))
        with pytest.raises(EngineDead, match=r"did not answer step 1 within 1.5 s"):
            await mesh.step(prefill_plan(1, 2, req_id_override=HANG_REQ))
        assert await wait_until(lambda: not any(alive(p) for p in mesh.pids), 5.0)
    finally:
        await mesh.close()


async def test_close_after_death_is_quiet_and_final(fake_model_dir):
    """close() on a dead mesh must return promptly and keep `dead` saying why it died."""
    mesh = make_mesh(fake_model_dir, world_size=1, tp=1)
    await mesh.start()
    os.kill(mesh.pids[0], signal.SIGKILL)
    assert await wait_until(lambda: mesh.dead is not None, 3.0)
    await asyncio.wait_for(mesh.close(), 3.0)
    assert "SIGKILL" in mesh.dead


async def test_ranks_ignore_sigint_but_die_on_sigterm(fake_model_dir):
    """Ctrl-C must not take a rank down behind the server's back (the server shuts ranks down
    in order), while SIGTERM must still end it and the mesh must notice."""
    mesh = make_mesh(fake_model_dir, world_size=1, tp=1)
    await mesh.start()
    try:
        os.kill(mesh.pids[0], signal.SIGINT)
        results = await mesh.step(prefill_plan(0, 1))
        assert len(results) == 1 and not results[0].error
        os.kill(mesh.pids[0], signal.SIGTERM)
        assert await wait_until(lambda: mesh.dead is not None, 3.0)
        assert "SIGTERM" in mesh.dead
    finally:
        await mesh.close()


async def test_close_during_a_step_fails_that_step_and_stops_the_ranks(fake_model_dir):
    """close() while a step is waiting must end that step with EngineDead (not hang, not a
    socket error) and still stop every rank."""
    mesh = make_mesh(fake_model_dir, world_size=2, tp=1, step_timeout_s=30.0)
    await mesh.start()
    step = asyncio.ensure_future(mesh.step(prefill_plan(0, 2, req_id_override=HANG_REQ)))
    assert await wait_until(lambda: reached(fake_model_dir, "hanging", [0]), 60.0)
    await asyncio.wait_for(mesh.close(grace_s=0.5), 10.0)
    with pytest.raises(EngineDead):
        await asyncio.wait_for(step, 5.0)
    assert not any(alive(p) for p in mesh.pids)


async def test_a_stopped_rank_fails_the_step_long_before_the_step_timeout(fake_model_dir):
    """A rank frozen by SIGSTOP mid-run must make the next step raise EngineDead saying it
    is stopped (not wait for the 60 s step timeout), and every rank must be killed, the
    stopped one included."""
    mesh = make_mesh(fake_model_dir, world_size=2, tp=1, step_timeout_s=60.0)
    await mesh.start()
    try:
        await mesh.step(prefill_plan(0, 2))
        pids = mesh.pids
        os.kill(pids[1], signal.SIGSTOP)
        with pytest.raises(EngineDead, match="rank 1 .*stopped"):
            await asyncio.wait_for(mesh.step(decode_plan(1, 2)), 30.0)
        assert await wait_until(lambda: not any(alive(p) for p in pids), 5.0)
    finally:
        await mesh.close()


async def test_idle_watcher_notices_a_stopped_rank(fake_model_dir):
    """A rank stopped while no step runs must make the mesh dead without a step."""
    mesh = make_mesh(fake_model_dir, world_size=2, tp=2)
    await mesh.start()
    try:
        os.kill(mesh.pids[1], signal.SIGSTOP)
        assert await wait_until(lambda: mesh.dead is not None, 5.0)
        assert "stopped" in mesh.dead
        assert await wait_until(lambda: not any(alive(p) for p in mesh.pids), 5.0)
    finally:
        await mesh.close()
