"""Quantized checkpoints: greedy output equals `transformers` run on the same
dequantized weights in float32, token for token, for every format and option."""

from __future__ import annotations

import pytest

from bench.quantized_checkpoints import write_quantized_checkpoint
from shared.errors import ConfigError
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


# Each TP=2 case starts two rank processes: the default suite runs one checkpoint
# format and one quantized at load (the row-gathering path); the rest under -m slow.
TP2_CASES = [
    "gptq-4bit-actorder-asym",
    "int4-at-load",
    *(
        pytest.param(case, marks=pytest.mark.slow)
        for case in ("awq-g32", "fp8-block", "int8-at-load", "fp8-at-load")
    ),
]


@pytest.mark.parametrize("case", TP2_CASES)
def test_tensor_parallel_greedy_matches_hf(case, make_checkpoint, tmp_path_factory, hf_greedy):
    """Quantized layers shard like the dense ones: at TP=2 each rank loads and
    repacks its slice (act-order groups included) and the output is unchanged."""
    arch, fmt, options = CASES[case]
    out = tmp_path_factory.mktemp(f"tp2-{case}")
    quantized_dir, dequantized_dir = write_quantized_checkpoint(
        make_checkpoint(arch), out, fmt, **options
    )
    at_load = {"int8": "int8", "int4": "int4", "fp8-at-load": "fp8"}.get(fmt)
    _check_tp2(quantized_dir, dequantized_dir, at_load, hf_greedy)


def _check_tp2(quantized_dir, dequantized_dir, at_load, hf_greedy):
    prompts = random_prompts(LENGTHS, seed=6)
    llm = LLM(str(quantized_dir), quantization=at_load, tensor_parallel_size=2, **ENGINE)
    try:
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    finally:
        llm.shutdown()
    got = [o.outputs[0].token_ids for o in outputs]
    assert got == hf_greedy(dequantized_dir, prompts, MAX_TOKENS)


# NF4 blocks of 64 run along rows: 128 inputs (64 per rank) split into whole blocks.
NF4_TP2_SHAPE = dict(hidden_size=128, num_attention_heads=8)


@pytest.mark.slow
def test_tensor_parallel_nf4_matches_hf(make_checkpoint, tmp_path_factory, hf_greedy):
    pytest.importorskip("bitsandbytes", reason="the bitsandbytes extra is not installed")
    out = tmp_path_factory.mktemp("tp2-nf4")
    quantized_dir, dequantized_dir = write_quantized_checkpoint(
        make_checkpoint("qwen2", **NF4_TP2_SHAPE), out, "bitsandbytes"
    )
    _check_tp2(quantized_dir, dequantized_dir, "bitsandbytes", hf_greedy)


def test_tensor_parallel_nf4_refuses_rows_that_split_a_block(make_checkpoint):
    pytest.importorskip("bitsandbytes", reason="the bitsandbytes extra is not installed")
    # o_proj: 64 inputs, 32 per rank, half of an NF4 block.
    with pytest.raises(ConfigError, match=r"self_attn\.o_proj has 32 of its 64 inputs per rank"):
        LLM(
            str(make_checkpoint("qwen2")),
            quantization="bitsandbytes",
            tensor_parallel_size=2,
            **ENGINE,
        )
