"""The rank's seam, checked: mypy (scripts/test.sh) proves here that the real runner (and so
every subclass, such as dspark_testing's ScriptedRunner) satisfies runner_interface.Runner.
Nothing imports this module at run time (the rank loads its runner class by name)."""

from __future__ import annotations

from workers.runner import ModelRunner
from workers.runner_interface import Runner


def model_runner_is_a_runner(runner: ModelRunner) -> Runner:
    return runner
