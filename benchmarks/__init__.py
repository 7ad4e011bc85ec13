"""Benchmarks: ``python -m benchmarks [name ...]`` prints figures and ratios against a peer."""
