"""--gpu-memory-utilization arithmetic, the start-up check, and the profile run
(which runs on CPU too, measuring nothing there)."""

from __future__ import annotations

import pytest
import torch

from shared.errors import ConfigError
from worker.config import CacheConfig
from worker.runner.gpu_memory import GPUMemoryProfile, MemorySnapshot, check_startup_memory
from worker.runner.kv_budget import plan_kv_cache

GiB = 2**30


def test_kv_gets_the_workers_fraction_less_what_it_uses():
    profile = GPUMemoryProfile(
        total=80 * GiB, utilization=0.5, weights_bytes=10 * GiB, activation_peak=3 * GiB,
        non_torch_bytes=1 * GiB,
    )  # fmt: skip
    assert profile.budget == 40 * GiB
    assert profile.kv_bytes == 26 * GiB  # the other half of the GPU is another worker's


def test_startup_check_names_the_numbers():
    check_startup_memory(MemorySnapshot(free=60 * GiB, total=80 * GiB, torch_reserved=0), 0.7)
    with pytest.raises(
        ConfigError, match=r"asks for 72\.00 GiB of the GPU.s 80\.00 GiB, but only 60\.00 GiB"
    ):
        check_startup_memory(MemorySnapshot(free=60 * GiB, total=80 * GiB, torch_reserved=0), 0.9)


def test_plan_uses_the_profile_and_refuses_the_cpu_fraction(make_checkpoint):
    from worker.models.spec import ModelSpec

    spec = ModelSpec.from_folder(make_checkpoint("llama"))
    profile = GPUMemoryProfile(GiB, 0.9, 100 * 2**20, 50 * 2**20, 10 * 2**20)
    budget = plan_kv_cache(
        CacheConfig(block_size=16), spec, torch.bfloat16, torch.device("cuda"), 0, 128,
        gpu_profile=profile,
    )  # fmt: skip
    assert budget.num_blocks == profile.kv_bytes // budget.bytes_per_block
    assert "--gpu-memory-utilization 0.9" in budget.describe()
    with pytest.raises(ConfigError, match="--kv-cache-memory-fraction sizes the KV cache on CPU"):
        plan_kv_cache(
            CacheConfig(block_size=16, kv_cache_memory_fraction=0.5), spec, torch.bfloat16,
            torch.device("cuda"), 0, 128, gpu_profile=profile,
        )  # fmt: skip
    with pytest.raises(ConfigError, match="no memory is left for the KV cache"):
        plan_kv_cache(
            CacheConfig(block_size=16), spec, torch.bfloat16, torch.device("cuda"), 0, 128,
            gpu_profile=GPUMemoryProfile(GiB, 0.1, GiB, 0, 0),
        )  # fmt: skip


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_profile_run_leaves_the_cache_alone(make_checkpoint, backend):
    from worker import LLM

    llm = LLM(
        str(make_checkpoint("llama")), num_kv_blocks=20, block_size=4, max_model_len=64,
        attention_backend=backend, max_num_batched_tokens=40, max_num_seqs=3,
    )  # fmt: skip
    runner = llm.engine.core.runner
    caches = [kv.clone() for kv in runner.kv_caches]
    assert runner.profile_run() == 0  # nothing to measure off CUDA
    assert all(torch.equal(a, b) for a, b in zip(caches, runner.kv_caches))
    assert all(layer.kv_cache is kv for layer, kv in zip(runner.attn_layers, runner.kv_caches))
