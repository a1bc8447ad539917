"""--kv-cache-dtype fp8: the reference backend keeps K/V in e4m3 (scale 1.0,
saturating) and attends as a float32 cache holding the same rounded values
would; the budget holds 4x a float32 cache's tokens; backends without fp8
kernels refuse it at start; the triton backend's greedy tokens equal the
reference's (interpreted). The CPU backend's: test_fp8_kv_cpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared.errors import ConfigError
from tests.conftest import random_prompts
from worker import LLM, SamplingParams
from worker.attention.backends import get_attention_backend, register_backend
from worker.attention.backends.torch_reference import TorchReferenceBackend
from worker.attention.metadata import BatchLayout
from worker.config import CacheConfig
from worker.models.spec import ModelSpec
from worker.runner.kv_budget import plan_kv_cache

FP8 = torch.float8_e4m3fn


def _attend(kv_cache, q, k, v, block_tables, seq_lens, query_start_loc, slots):
    backend = get_attention_backend("torch", "cpu")
    layout = BatchLayout(
        query_start_loc=np.asarray(query_start_loc, dtype=np.int32),
        seq_lens=np.asarray(seq_lens, dtype=np.int32),
        block_tables=block_tables,
        slot_mapping=slots,
    )
    arrays = {n: torch.from_numpy(a) for n, a in backend.device_arrays(layout).items()}
    return backend.forward(q, k, v, kv_cache, backend.build_metadata(layout, arrays), 0.25, None)


def test_fp8_cache_attends_as_the_rounded_values_would():
    gen = torch.Generator().manual_seed(0)
    num_tokens, heads, kv_heads, dim, block = 10, 4, 2, 16, 4
    q = torch.randn(num_tokens, heads, dim, generator=gen)
    k = torch.randn(num_tokens, kv_heads, dim, generator=gen) * 3
    v = torch.randn(num_tokens, kv_heads, dim, generator=gen) * 3
    k[0, 0, 0], v[1, 1, 1] = 1000.0, -900.0  # past e4m3's 448: saturate, not NaN
    tables = np.array([[0, 1, 2], [3, 4, 5]], dtype=np.int32)
    slots = np.array([0, 1, 2, 3, 4, 5, 12, 13, 14, 15], dtype=np.int64)
    args = (tables, [6, 4], [0, 6, 10], slots)
    fp8_cache = torch.zeros(2, 6, block, kv_heads, dim, dtype=FP8)
    out = _attend(fp8_cache, q, k, v, *args)

    def rounded(x):
        return x.clamp(-448, 448).to(FP8).float()

    f32_cache = torch.zeros(2, 6, block, kv_heads, dim)
    expected = _attend(f32_cache, q, rounded(k), rounded(v), *args)
    assert torch.equal(out, expected) and not out.isnan().any()
    assert fp8_cache.float()[0, 0, 0, 0, 0] == 448.0


def test_fp8_budget_holds_four_times_the_float32_tokens(make_checkpoint):
    path = make_checkpoint("llama")
    spec, cpu = ModelSpec.from_folder(path), torch.device("cpu")
    cache = CacheConfig(block_size=4, kv_cache_memory=2**20, kv_cache_dtype="fp8")
    dense = plan_kv_cache(cache, spec, torch.float32, cpu, 0, 64)
    fp8 = LLM(str(path), max_model_len=64, attention_backend="torch", **_fields(cache))
    assert fp8.engine.core.kv_budget.num_blocks == 4 * dense.num_blocks
    assert "KV cache (fp8)" in fp8.engine.core.kv_budget.describe()
    prompts = random_prompts([5, 17])
    greedy = SamplingParams(temperature=0, max_tokens=6)
    out = fp8.generate(prompts, greedy, detokenize=False)
    assert [len(o.outputs[0].token_ids) for o in out] == [6, 6]


def _fields(cache: CacheConfig) -> dict:
    return {f: getattr(cache, f) for f in ("block_size", "kv_cache_memory", "kv_cache_dtype")}


class _NoFp8Backend(TorchReferenceBackend):
    name = "no-fp8"
    extra_kv_dtypes = ()


def test_backends_without_fp8_kernels_refuse_it(make_checkpoint):
    register_backend("no-fp8", __name__, "_NoFp8Backend")
    with pytest.raises(ConfigError, match="--kv-cache-dtype fp8 is not supported by the no-fp8"):
        LLM(
            str(make_checkpoint("llama")),
            kv_cache_dtype="fp8",
            num_kv_blocks=64,
            attention_backend="no-fp8",
        )


def test_triton_fp8_greedy_equals_reference_fp8(make_checkpoint):
    from tests.triton_devices import _skip_reason

    reason = _skip_reason("cpu")
    if reason:
        pytest.skip(reason)
    path = make_checkpoint("llama")
    prompts = random_prompts([3, 11, 6])
    greedy = SamplingParams(temperature=0, max_tokens=5)
    runs = {}
    for backend in ("triton", "torch"):
        llm = LLM(
            str(path),
            kv_cache_dtype="fp8",
            attention_backend=backend,
            block_size=4,
            max_model_len=32,
            num_kv_blocks=32,
        )
        runs[backend] = [
            o.outputs[0].token_ids for o in llm.generate(prompts, greedy, detokenize=False)
        ]
    assert runs["triton"] == runs["torch"]
