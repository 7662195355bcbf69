"""Experiment harness, benchmarks, figure scripts and the ``remat`` CLI."""
