"""Benchmark harness: synthetic checkpoints, workloads, offline and online runs."""
