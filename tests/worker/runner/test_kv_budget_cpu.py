"""--gpu-memory-utilization on CPU: a vLLM habit, answered with what sizes the cache here."""

from __future__ import annotations

import logging

import torch

from worker.config import CacheConfig
from worker.models.spec import ModelSpec
from worker.runner.kv_budget import plan_kv_cache


def test_gpu_memory_utilization_on_cpu_says_which_flags_size_the_cache(make_checkpoint, caplog):
    spec = ModelSpec.from_folder(make_checkpoint("llama"))
    caplog.set_level(logging.WARNING, logger="worker.runner.kv_budget")
    cpu = torch.device("cpu")
    plan_kv_cache(CacheConfig(block_size=4, num_kv_blocks=64), spec, torch.float32, cpu, 0, 128)
    assert caplog.messages == []
    habit = CacheConfig(block_size=4, num_kv_blocks=64, gpu_memory_utilization=0.8)
    budget = plan_kv_cache(habit, spec, torch.float32, cpu, 0, 128)
    assert budget.num_blocks == 64
    (message,) = caplog.messages
    assert message.startswith("--gpu-memory-utilization sizes a GPU's memory and does nothing")
    assert "--kv-cache-memory" in message
