"""The rank's seam, checked: mypy (scripts/test.sh) proves here that the real runner (and so
every subclass, such as dspark_testing's ScriptedRunner) and the simulated device's SimRunner satisfy
runner_interface.Runner.
Nothing imports this module at run time (the rank loads its runner class by name)."""

from __future__ import annotations

from workers.runner import ModelRunner
from workers.runner_interface import Runner
from workers.sim.runner import SimRunner


def model_runner_is_a_runner(runner: ModelRunner) -> Runner:
    return runner


def sim_runner_is_a_runner(runner: SimRunner) -> Runner:
    return runner
