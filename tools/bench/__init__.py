"""Benchmarks: python -m tools.bench.<name> (serve: the served system over HTTP at N streams)."""
