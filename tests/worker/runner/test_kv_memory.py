"""KV pools: zeroed, the asked shape, and resident before the first step."""

from __future__ import annotations

import torch

from worker.runner.kv_memory import allocate_kv_pool


def _anonymous_bytes() -> int:
    # smaps_rollup, not statm: statm's counters lag and miss huge pages.
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Anonymous line in /proc/self/smaps_rollup")


def test_large_pool_is_zeroed_and_resident_at_allocation():
    shape = (4096, 16, 8, 64)  # 64 MiB of bf16
    before = _anonymous_bytes()
    pool = allocate_kv_pool(shape, torch.bfloat16, torch.device("cpu"))
    grown = _anonymous_bytes() - before
    assert pool.shape == shape and pool.dtype == torch.bfloat16
    # Faulted in here, not by the first steps that write to it.
    assert grown >= 64 * 2**20, grown
    assert not pool.any()


def test_small_pool_is_a_plain_zeroed_tensor():
    pool = allocate_kv_pool((4, 4, 2, 8), torch.float32, torch.device("cpu"))
    assert pool.shape == (4, 4, 2, 8) and not pool.any()
