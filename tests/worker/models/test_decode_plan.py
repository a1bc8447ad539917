"""The bound decode plan (worker/models/decode_plan.py) computes what the module
path computes, bit for bit: same tokens, same logprobs, on bf16 models."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import random_prompts
from worker import LLM, SamplingParams
from worker.layers import cpu_packed
from worker.models import decode_plan

# No prefix cache: a rerun's prefill from cached blocks rounds differently in bf16,
# plan or not.
ENGINE = dict(
    block_size=4,
    max_model_len=128,
    num_kv_blocks=200,
    dtype="bfloat16",
    enable_prefix_caching=False,
)
PARAMS = SamplingParams(temperature=0, max_tokens=24, logprobs=3, ignore_eos=True)


def _needs_gemv() -> None:
    if cpu_packed._gemv_kernels() is None:
        pytest.skip("no bf16 GEMV kernels on this CPU/build (AVX512-BF16 panels): no plan")


def _generate(llm, prompts):
    outputs = llm.generate(prompts, PARAMS, detokenize=False)
    return [(list(o.outputs[0].token_ids), list(o.outputs[0].logprobs)) for o in outputs]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: a bias on qkv_proj
def test_plan_matches_the_module_path(make_checkpoint, arch):
    _needs_gemv()
    llm = LLM(str(make_checkpoint(arch, dtype=torch.bfloat16)), **ENGINE)
    model = llm.engine.core.runner.model.model
    # One stream, four and six: each decodes with rows the GEMV takes, where the plan runs.
    assert decode_plan.MAX_ROWS == cpu_packed.GEMV_MAX_ROWS == 6
    batches = [
        random_prompts([11], seed=3),
        random_prompts([5, 17, 9, 30], seed=4),
        random_prompts([7, 3, 21, 12, 8, 15], seed=6),
    ]
    with_plan = [_generate(llm, prompts) for prompts in batches]
    assert model.decode_plan not in (None, False), "the plan was not built"
    bound = model.layers[0].self_attn.attn._bound
    assert getattr(bound, "decode_qkv", None) is not None, "no fused decode attention"
    model.decode_plan = None  # the module path from now on
    without = [_generate(llm, prompts) for prompts in batches]
    assert with_plan == without


def test_no_plan_for_q_k_norm(make_checkpoint):
    _needs_gemv()
    llm = LLM(str(make_checkpoint("qwen3", dtype=torch.bfloat16)), **ENGINE)
    llm.generate(random_prompts([6], seed=5), PARAMS, detokenize=False)
    assert llm.engine.core.runner.model.model.decode_plan is None


def test_no_plan_for_float32(make_checkpoint):
    llm = LLM(str(make_checkpoint("llama")), **{**ENGINE, "dtype": "float32"})
    llm.generate(random_prompts([6], seed=5), PARAMS, detokenize=False)
    assert llm.engine.core.runner.model.model.decode_plan is None
