"""Quantized checkpoints: greedy output equals `transformers` run on the same
dequantized weights in float32, token for token, for every format and option."""

from __future__ import annotations

import pytest

from bench.quantized_checkpoints import write_quantized_checkpoint
from tests.conftest import random_prompts
from worker import LLM, SamplingParams

LENGTHS = [3, 17, 40]
MAX_TOKENS = 10
ENGINE = dict(block_size=4, max_model_len=128, num_kv_blocks=200)

CASES = {
    "gptq-4bit-g32-sym": ("llama", "gptq", dict(bits=4, group_size=32)),
    "gptq-4bit-actorder-asym": (
        "qwen2",
        "gptq",
        dict(bits=4, group_size=32, desc_act=True, sym=False),
    ),
    "gptq-8bit-channel": ("llama", "gptq", dict(bits=8, group_size=-1)),
    "gptq-8bit-g16-asym": ("qwen2", "gptq", dict(bits=8, group_size=16, sym=False)),
    "awq-g32": ("qwen3", "awq", dict(group_size=32)),
    "awq-g16-down-dense": ("llama", "awq", dict(group_size=16, not_converted=("down_proj",))),
    "fp8-tensor-static": ("qwen2", "fp8", dict(static=True)),
    "fp8-block": ("llama", "fp8", dict(block=(16, 32))),
    "ct-w4a16-group-asym-actorder": (
        "llama",
        "compressed-tensors",
        dict(kind="int", bits=4, group_size=32, sym=False, actorder=True),
    ),
    "ct-w8a16-channel": ("qwen3", "compressed-tensors", dict(kind="int", bits=8)),
    "ct-fp8-channel": ("llama", "compressed-tensors", dict(kind="float")),
    "ct-fp8-tensor": ("qwen2", "compressed-tensors", dict(kind="float", strategy="tensor")),
    "fp8-at-load": ("llama", "fp8-at-load", {}),
    "nf4-at-load": ("qwen2", "bitsandbytes", {}),
    "int8-at-load": ("qwen2", "int8", {}),
    "int4-at-load": ("llama", "int4", {}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def quantized(request, make_checkpoint, tmp_path_factory):
    arch, fmt, options = CASES[request.param]
    if fmt == "bitsandbytes":
        pytest.importorskip("bitsandbytes", reason="the bitsandbytes extra is not installed")
    out = tmp_path_factory.mktemp(request.param)
    paths = write_quantized_checkpoint(make_checkpoint(arch), out, fmt, **options)
    at_load = {"int8": "int8", "int4": "int4", "fp8-at-load": "fp8"}.get(fmt)
    at_load = "bitsandbytes" if fmt == "bitsandbytes" else at_load
    return paths, at_load


def test_greedy_matches_hf_on_dequantized_weights(quantized, hf_greedy):
    (quantized_dir, dequantized_dir), at_load = quantized
    prompts = random_prompts(LENGTHS, seed=5)
    llm = LLM(str(quantized_dir), quantization=at_load, **ENGINE)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    got = [o.outputs[0].token_ids for o in outputs]
    assert got == hf_greedy(dequantized_dir, prompts, MAX_TOKENS)
