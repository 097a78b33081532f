"""Test doubles and fixtures: nothing here runs in a real deployment.

The product never imports them: a test hands them in (ModelRunner(proposer=...)) or names a
runner the ranks load by name (DSPARK_TEST_RUNNER=module:Class, as RankConfig.runner); tests
and tools/ benchmarks import them directly.
"""
