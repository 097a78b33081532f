"""Test doubles and fixtures: nothing here runs in a real deployment.

The product loads these only when a test asks (DSPARK_TEST_RUNNER, DSPARK_TEST_DRAFTER,
ModelRunner(proposer=...)); tests and tools/ benchmarks import them directly.
"""
