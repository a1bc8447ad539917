"""The roofline bound from given peaks, and a (tiny) real measurement."""

from __future__ import annotations

import pytest
import torch

from bench.model_flops import ModelFlops
from bench.roofline import bound_record, matmul_gflops, memory_gb_s
from bench.workloads import BenchRequest, Workload
from tests.bench.test_model_flops import tiny_spec


def test_bound_is_tokens_over_flops_at_the_peak_and_results_are_rated():
    flops = ModelFlops.from_spec(tiny_spec())
    workload = Workload("w", 0, 512, (BenchRequest((20,) * 5, 3),))  # 1_243_136 FLOPs
    peaks = {"matmul_gflops": {"float32": 2.0, "bfloat16": 1.0}, "memory_gb_s": {"copy": 9.0}}
    results = [
        {"workload": "w", "engine": "pagoda", "dtype": "float32", "total_tokens_per_s": 6436.0},
        {"workload": "other", "engine": "pagoda", "total_tokens_per_s": 1.0},
    ]
    record = bound_record(flops, workload, peaks, results)
    seconds = 1_243_136 / 2e9
    assert record["bound_total_tokens_per_s"]["float32"] == pytest.approx(8 / seconds)
    assert record["bound_total_tokens_per_s"]["bfloat16"] == pytest.approx(4 / seconds)
    (rated,) = record["results"]
    assert rated["fraction_of_float32_bound"] == pytest.approx(6436.0 / (8 / seconds))
    assert record["memory_gb_s"] == {"copy": 9.0} and record["gflop"] == 1_243_136 / 1e9


def test_measurements_return_positive_rates():
    assert matmul_gflops(torch.float32, size=64, repeats=1) > 0
    assert matmul_gflops(torch.bfloat16, size=64, repeats=1) > 0
    assert all(v > 0 for v in memory_gb_s(repeats=1, num_bytes=2**20).values())


def test_a_slow_dtype_is_timed_at_the_probe_size(monkeypatch):
    from bench import roofline

    sizes = []

    def fake_seconds(torch_module, dtype, size, repeats):
        sizes.append(size)
        return 0.5 if size == roofline._PROBE_SIZE else 0.25

    monkeypatch.setattr(roofline, "_mm_seconds", fake_seconds)
    # 0.5 s at 256 projects to 256 s at 2048: measure at 256 instead.
    assert matmul_gflops(torch.bfloat16, size=2048) == pytest.approx(2 * 256**3 / 0.5 / 1e9)
    assert sizes == [256, 256]
    sizes.clear()
    monkeypatch.setattr(roofline, "_MAX_SECONDS_PER_PRODUCT", 1000.0)
    assert matmul_gflops(torch.float32, size=2048) == pytest.approx(2 * 2048**3 / 0.25 / 1e9)
    assert sizes == [256, 2048]
