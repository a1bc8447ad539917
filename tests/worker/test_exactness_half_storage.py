"""A bf16 checkpoint on a CPU without fast bf16: the engine computes in float32
with the linear weights kept in bf16 (worker/layers/cpu_half_f32.py, the AVX2
build of gemm_half_f32.cpp), and greedy output still equals `transformers` in
float32; a float32 checkpoint keeps float32 weights."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import random_prompts
from worker import LLM, SamplingParams
from worker.layers import cpu_half_f32
from worker.layers.linear import LinearBase

MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
ENGINE = dict(block_size=4, max_model_len=96, num_kv_blocks=200)


def _linear_weights(llm: LLM) -> list[torch.Tensor]:
    model = llm.engine.core.runner.model
    return [m.weight for m in model.modules() if isinstance(m, LinearBase)]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: biased qkv
def test_bf16_checkpoint_runs_float32_over_bf16_weights(
    avx2_cpu, make_checkpoint, hf_greedy, arch, monkeypatch
):
    # PAGODA_CPU_HALF_WEIGHTS=1 (the default): no float32 copies; more than 8 rows
    # (prefill) through gemm_half_f32.cpp.
    monkeypatch.delenv("PAGODA_CPU_HALF_WEIGHTS", raising=False)
    path = make_checkpoint(arch, dtype=torch.bfloat16)
    prompts = random_prompts([1, 5, 13, 30], seed=4)
    llm = LLM(str(path), **ENGINE)
    weights = _linear_weights(llm)
    assert weights and all(w.dtype == torch.bfloat16 and w.dim() == 3 for w in weights)
    model = llm.engine.core.runner.model
    assert all(m.weight_f32 is None for m in model.modules() if isinstance(m, LinearBase))
    head = llm.engine.core.runner.model.lm_head
    assert head.packed_is_half_f32 and head.packed_weight.dtype == torch.bfloat16
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, detokenize=False)]
    assert got == hf_greedy(path, prompts, MAX_TOKENS)


def test_bf16_checkpoint_with_float32_copies(avx2_cpu, make_checkpoint, hf_greedy, monkeypatch):
    # PAGODA_CPU_HALF_WEIGHTS=copy: 1-8 rows over the bf16 panels (the GEMV), 9-128
    # (the 10-stream decode steps here) through the half GEMM, more (the
    # 190-token prefill step) through oneDNN's float32 copy.
    monkeypatch.setenv("PAGODA_CPU_HALF_WEIGHTS", "copy")
    copy_rows: list[int] = []
    packed_linear = cpu_half_f32.cpu_packed.packed_linear

    def spy(x, weight, bias):
        copy_rows.append(x.numel() // x.shape[-1])
        return packed_linear(x, weight, bias)

    monkeypatch.setattr(cpu_half_f32.cpu_packed, "packed_linear", spy)
    path = make_checkpoint("llama", dtype=torch.bfloat16)
    prompts = random_prompts([1, 5, 13, 30, 80, 40, 3, 7, 2, 9], seed=5)
    llm = LLM(str(path), **ENGINE)
    model = llm.engine.core.runner.model
    layers = [m for m in model.modules() if isinstance(m, LinearBase)]
    assert layers and all(
        m.weight.dtype == torch.bfloat16 and m.weight_f32 is not None for m in layers
    )
    assert model.lm_head.packed_f32 is not None
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, detokenize=False)]
    assert got == hf_greedy(path, prompts, MAX_TOKENS)
    assert copy_rows and set(copy_rows) == {190}  # only the prefill, none of the decode steps


def test_float32_checkpoint_keeps_float32_weights(avx2_cpu, make_checkpoint):
    llm = LLM(str(make_checkpoint("llama")), **ENGINE)
    assert all(w.dtype == torch.float32 for w in _linear_weights(llm))


def test_exact_half_dtype():
    w = torch.randn(32, 8)
    assert cpu_half_f32.exact_half_dtype(w) is None
    assert cpu_half_f32.exact_half_dtype(w.bfloat16().float()) is torch.bfloat16
    halves = torch.tensor([1.0 + 2**-10, 3.0])  # fp16 holds 10 mantissa bits, bf16 7
    assert cpu_half_f32.exact_half_dtype(halves) is torch.float16
