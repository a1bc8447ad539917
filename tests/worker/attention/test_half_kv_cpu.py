"""A half checkpoint run in float32 (a CPU without native bf16, emulated by avx2_cpu)
keeps its K/V in the checkpoint's dtype under --kv-cache-dtype auto: greedy tokens
equal the reference backend's run over the same cache (chunked prefill, a cached
prefix, decode steps through the native loop), the budget holds twice the float32
cache's tokens, and the explicit dtypes pick or refuse what they name."""

from __future__ import annotations

import pytest
import torch

from shared.errors import ConfigError
from tests.conftest import random_prompts
from worker import LLM, SamplingParams
from worker.config import CacheConfig
from worker.models.spec import ModelSpec
from worker.runner.kv_budget import plan_kv_cache
from worker.runner.kv_memory import kv_cache_dtype

GREEDY = SamplingParams(temperature=0, max_tokens=8)
# A shared 24-token head (a cached prefix for the later prompts), a prompt longer
# than the 32-token step budget (chunked), short ones.
_HEAD = random_prompts([24], seed=3)[0]
PROMPTS = [_HEAD + p for p in random_prompts([5, 50, 9], seed=4)] + random_prompts([3, 17])
ENGINE = {
    "max_model_len": 128,
    "num_kv_blocks": 64,
    "block_size": 8,
    "max_num_batched_tokens": 32,
    "enable_prefix_caching": True,
}


def _run(path, backend, **options):
    llm = LLM(str(path), attention_backend=backend, **ENGINE, **options)
    out = llm.generate(PROMPTS, GREEDY, detokenize=False)
    return llm, [o.outputs[0].token_ids for o in out]


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_auto_keeps_the_checkpoints_half_dtype_and_matches_the_reference(
    avx2_cpu, make_checkpoint, half
):
    path = make_checkpoint("qwen2", dtype=half)
    llm, tokens = _run(path, "cpu")
    runner = llm.engine.core.runner
    assert runner.dtype == torch.float32 and runner.kv_dtype == half
    assert all(cache.dtype == half for cache in runner.kv_caches)
    plan = runner.model.model.decode_plan
    assert plan not in (None, False) and plan.stacks is not None  # the native loop ran
    reference, expected = _run(path, "torch")
    assert reference.engine.core.runner.kv_dtype == half
    assert tokens == expected


def test_float32_keeps_a_float32_cache_and_the_budget_halves(avx2_cpu, make_checkpoint):
    path = make_checkpoint("llama", dtype=torch.bfloat16)
    memory = {"max_model_len": 64, "block_size": 4, "kv_cache_memory": 2**20}
    half = LLM(str(path), **memory).engine.core
    full = LLM(str(path), kv_cache_dtype="float32", **memory).engine.core
    assert (half.runner.kv_dtype, full.runner.kv_dtype) == (torch.bfloat16, torch.float32)
    assert half.kv_budget.num_blocks == 2 * full.kv_budget.num_blocks
    spec, cpu = ModelSpec.from_folder(path), torch.device("cpu")
    f32 = plan_kv_cache(
        CacheConfig(block_size=4, kv_cache_memory=2**20), spec, torch.float32, cpu, 0, 64
    )
    assert full.kv_budget.num_blocks == f32.num_blocks


def test_auto_keeps_float32_where_the_backend_reads_no_half_cache(
    avx2_cpu, make_checkpoint, monkeypatch
):
    from worker.attention.backends.cpu import CPUAttentionBackend

    monkeypatch.setattr(CPUAttentionBackend, "half_kv_under_float32", False)
    path = make_checkpoint("llama", dtype=torch.bfloat16)
    runner = LLM(str(path), max_model_len=64, num_kv_blocks=16).engine.core.runner
    assert (runner.dtype, runner.kv_dtype) == (torch.float32, torch.float32)


def test_auto_resolution():
    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    assert kv_cache_dtype("auto", f32, bf16) == bf16  # widened half checkpoint
    assert kv_cache_dtype("auto", f32, f16) == f16
    assert kv_cache_dtype("auto", f32, f32) == f32
    assert kv_cache_dtype("auto", f32, None) == f32  # --dtype float32 named
    assert kv_cache_dtype("auto", bf16, bf16) == bf16
    assert kv_cache_dtype("float32", f32, bf16) == f32
    assert kv_cache_dtype("fp8", bf16) == torch.float8_e4m3fn


def test_explicit_dtypes(make_checkpoint):
    path = make_checkpoint("llama")  # float32
    small = {"max_model_len": 64, "num_kv_blocks": 16}
    assert LLM(str(path), kv_cache_dtype="bfloat16", **small).engine.core.runner.kv_dtype == (
        torch.bfloat16
    )
    with pytest.raises(ConfigError, match=r"float32 .*not supported by the cpu attention backend"):
        LLM(str(path), dtype="bfloat16", kv_cache_dtype="float32", **small)
