"""Session fixtures: tiny random checkpoints, and `transformers` as the oracle."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import redis
import torch

from bench.checkpoints import build_random_checkpoint
from tests.redis_server import RedisServer, answers
from tests.triton_devices import triton_device  # noqa: F401  (a fixture)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory):
    """make_checkpoint(arch, **overrides) -> folder; each distinct one is built once."""
    built: dict[tuple, Path] = {}

    def make(arch: str = "llama", **overrides) -> Path:
        key = (arch, tuple(sorted((k, str(v)) for k, v in overrides.items())))
        if key not in built:
            built[key] = build_random_checkpoint(tmp_path_factory.mktemp(arch), arch, **overrides)
        return built[key]

    return make


@pytest.fixture(scope="session")
def hf_greedy():
    """hf_greedy(path, prompts, max_new_tokens) -> generated ids per prompt, one at a time."""
    from transformers import AutoModelForCausalLM

    models: dict[Path, torch.nn.Module] = {}
    memo: dict[tuple, list[int]] = {}

    def generate(path: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        if path not in models:
            models[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        model = models[path]
        results = []
        for prompt in prompts:
            key = (path, tuple(prompt), max_new_tokens)
            if key not in memo:
                with torch.no_grad():
                    out = model.generate(
                        torch.tensor([prompt]),
                        max_new_tokens=max_new_tokens,
                        do_sample=False,
                        pad_token_id=0,
                    )
                memo[key] = out[0, len(prompt) :].tolist()
            results.append(memo[key])
        return results

    return generate


@pytest.fixture
def avx2_cpu(monkeypatch):
    """The engine as on an AVX2-only CPU: no fast bf16, the AVX2 half kernels
    (the GEMM and the 1-8 row GEMV)."""
    from kernels.cpu import cpu_runs, load_gemv_f32_kernels, load_half_f32_kernels
    from worker.layers import cpu_half_f32

    if not cpu_runs("avx2"):
        pytest.skip("this CPU cannot run the AVX2 build (it lacks AVX2, FMA or F16C)")
    kernels, gemv = load_half_f32_kernels("avx2"), load_gemv_f32_kernels("avx2")
    if kernels is None or gemv is None:
        pytest.skip("no C++ toolchain to build the CPU kernels")
    monkeypatch.setattr("worker.runner.platform.cpu_has_fast_bf16", lambda: False)
    monkeypatch.setattr(cpu_half_f32, "_kernels", lambda: kernels)
    monkeypatch.setattr(cpu_half_f32, "load_half_f32_kernels", lambda: kernels)
    monkeypatch.setattr(cpu_half_f32, "_gemv_kernels", lambda: gemv)


@pytest.fixture(scope="session")
def redis_url():
    """A real Redis: the one on 127.0.0.1:6379 if it answers, else our own redis-server."""
    if answers(DEFAULT_REDIS_URL):
        yield DEFAULT_REDIS_URL
        return
    if not RedisServer.available():
        pytest.skip("no Redis on 127.0.0.1:6379 and no redis-server binary to start one")
    server = RedisServer()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_prefix(redis_url):
    """A key prefix of this test's own; its keys are deleted afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def random_prompts(lengths: list[int], vocab_size: int = 512, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    # Ids from 3 up: 0-2 are special tokens.
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.01, what: str = "condition"):
    """Poll until predicate() is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
