"""Tensor-parallel size 2 over two gloo rank processes: token for token what
`transformers` generates, with chunked prefill, preemption and a prefix-cache
hit in the same run; each rank's KV cache holds its own heads."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
from safetensors import safe_open

from shared.structured_outputs import StructuredOutputsParams
from tests.conftest import random_prompts
from tests.worker.structured.schemas import PERSON
from worker import LLM, SamplingParams

LENGTHS = [1, 3, 7, 12, 16, 23, 31, 40, 57, 70]
MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
# A 16-token step budget chunks every longer prompt; 36 blocks of 4 cannot hold
# ten requests of up to 82 tokens, so some are preempted and recomputed.
ENGINE = dict(block_size=4, max_model_len=128, num_kv_blocks=36, max_num_batched_tokens=16)

# Each case starts two rank processes: qwen2's q/k/v bias and qwen3's q/k norm
# run with -m slow (the sharded bias is also checked layer by layer).
CASES = [
    pytest.param(("llama", {}), id="llama"),
    pytest.param(("qwen2", {}), id="qwen2", marks=pytest.mark.slow),
    pytest.param(("qwen3", {}), id="qwen3", marks=pytest.mark.slow),
    # One KV head, replicated on both ranks.
    pytest.param(("llama", {"num_key_value_heads": 1}), id="gqa-replicated-kv"),
]


@pytest.fixture(params=CASES)
def checkpoint(request, make_checkpoint):
    arch, overrides = request.param
    return make_checkpoint(arch, **overrides)


def _token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def test_tp2_matches_transformers(checkpoint, hf_greedy):
    prompts = random_prompts(LENGTHS, seed=11)
    prefix = random_prompts([29], seed=12)[0]
    shared = [prefix + s for s in random_prompts([2, 9], seed=13)]
    llm = LLM(str(checkpoint), tensor_parallel_size=2, **ENGINE)
    try:
        got = _token_ids(llm.generate(prompts, GREEDY, detokenize=False))
        assert llm.last_stats.num_preemptions > 0
        first = llm.generate(shared[:1], GREEDY, detokenize=False)
        (hit,) = llm.generate(shared[1:], GREEDY, detokenize=False)
    finally:
        llm.shutdown()
    assert got == hf_greedy(checkpoint, prompts, MAX_TOKENS)
    assert _token_ids(first + [hit]) == hf_greedy(checkpoint, shared, MAX_TOKENS)
    assert hit.num_cached_tokens == 28  # 7 full blocks of 4


def _checkpoint_bytes(path) -> tuple[int, int]:
    """(all tensors, the norms) in bytes, of a float32 checkpoint."""
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        sizes = {name: 4 * math.prod(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    return sum(sizes.values()), sum(n for name, n in sizes.items() if "norm" in name)


def test_logprobs_match_tp1_and_each_rank_holds_its_share(make_checkpoint):
    """Logprobs within float tolerance of TP=1. Rank 0 reads half of every sharded
    tensor and all of the norms, nothing more; its KV cache holds one of the two
    KV heads."""
    path = make_checkpoint("llama")  # 2 layers, 2 KV heads of 16, float32
    prompts = random_prompts([5, 33], seed=14)
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=3, prompt_logprobs=2)
    results = []
    for tp in (1, 2):
        llm = LLM(str(path), tensor_parallel_size=tp, **ENGINE)
        try:
            results.append(llm.generate(prompts, params, detokenize=False))
            if tp == 2:
                budget = llm.engine.core.kv_budget
                stats = llm.engine.core.executor.rank_stats()
        finally:
            llm.shutdown()
    total, norms = _checkpoint_bytes(path)
    assert stats["checkpoint_bytes_read"] == (total - norms) // 2 + norms
    assert budget.bytes_per_block == 2 * 2 * 16 * 4 * 4  # K and V x layers x head_dim x 4 x 4 B
    assert budget.num_blocks == 36
    for one, two in zip(*results):
        assert one.outputs[0].token_ids == two.outputs[0].token_ids
        pairs = list(zip(one.outputs[0].logprobs, two.outputs[0].logprobs))
        pairs += list(zip(one.prompt_logprobs[1:], two.prompt_logprobs[1:]))
        for a, b in pairs:
            assert a.token_id == b.token_id and a.rank == b.rank
            assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            assert [lp for _, lp in a.top] == pytest.approx([lp for _, lp in b.top], abs=1e-5)


def test_constrained_sampling_matches_tp1(make_checkpoint):
    """Compiled grammars do not pickle: each rank compiles its own, and every rank
    masks and samples alike, so seeded constrained output equals TP=1's."""
    path = make_checkpoint("llama")
    constraint = StructuredOutputsParams.from_schema(PERSON)
    params = SamplingParams(temperature=1.0, max_tokens=80, seed=5, structured_outputs=constraint)
    prompts = random_prompts([5, 9], seed=15)
    texts = []
    for tp in (1, 2):
        llm = LLM(str(path), tensor_parallel_size=tp, **ENGINE)
        try:
            texts.append([o.outputs[0].text for o in llm.generate(prompts, params)])
        finally:
            llm.shutdown()
    assert texts[0] == texts[1]
    for text in texts[1]:
        jsonschema.validate(json.loads(text), PERSON)
