"""The benchmarks: each a module run as `python -m tools.bench.NAME` (`python -m tools.bench`
lists them; docs/benchmarks.md says what each measures). They share harness.py (the common
options, the default checkpoint, merging runs, the report) and plot.py (charts, through the
optional matplotlib extra). Not part of the product: run from a repository checkout."""
