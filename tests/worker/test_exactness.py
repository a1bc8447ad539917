"""Greedy output equals `transformers` token for token, whatever the engine does.

Every scenario (one batch, staggered arrivals, shared prefixes, chunked
prefill, preemption) runs on each supported architecture, float32.
"""

from __future__ import annotations

import pytest

from bench.checkpoints import ARCHITECTURES
from tests.conftest import random_prompts
from worker import LLM, SamplingParams
from worker.config import EngineConfig
from worker.engine.llm_engine import LLMEngine

LENGTHS = [1, 3, 7, 12, 16, 23, 31, 40, 57, 70]
MAX_TOKENS = 20
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
ENGINE = dict(block_size=4, max_model_len=128, num_kv_blocks=400)


def run_llm(path, prompts, **options):
    llm = LLM(str(path), **{**ENGINE, **options})
    outputs = llm.generate(prompts, GREEDY, detokenize=False)
    return [o.outputs[0].token_ids for o in outputs], llm.last_stats, llm


@pytest.fixture(params=ARCHITECTURES)
def arch_path(request, make_checkpoint):
    return make_checkpoint(request.param)


def test_batch_matches_hf(arch_path, hf_greedy):
    prompts = random_prompts(LENGTHS)
    got, stats, _ = run_llm(arch_path, prompts)
    assert got == hf_greedy(arch_path, prompts, MAX_TOKENS)
    assert stats.num_kv_blocks_used == 0


def test_requests_arriving_while_others_decode(arch_path, hf_greedy):
    prompts = random_prompts(LENGTHS, seed=1)
    engine = LLMEngine(EngineConfig.from_kwargs(model=str(arch_path), **ENGINE))
    got: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or engine.has_unfinished_requests():
        # A new request every other step, joining a batch that is decoding.
        if pending and step % 2 == 0:
            i, prompt = pending.pop(0)
            engine.add_request(str(i), prompt, GREEDY)
        for delta in engine.step().deltas:
            got.setdefault(delta.request_id, []).extend(delta.new_token_ids)
        step += 1
    assert [got[str(i)] for i in range(len(prompts))] == hf_greedy(arch_path, prompts, MAX_TOKENS)


def test_prefix_caching(arch_path, hf_greedy):
    prefix = random_prompts([37], seed=2)[0]
    suffixes = random_prompts([1, 4, 9, 13, 20, 2, 6, 11], seed=3)
    prompts = [prefix + s for s in suffixes]
    llm = LLM(str(arch_path), **ENGINE)
    first = llm.generate(prompts[:1], GREEDY, detokenize=False)
    rest = llm.generate(prompts[1:], GREEDY, detokenize=False)
    got = [o.outputs[0].token_ids for o in first + rest]
    assert got == hf_greedy(arch_path, prompts, MAX_TOKENS)
    assert llm.last_stats.prefix_cache_hits > 0
    # 37 shared tokens = 9 full blocks of 4 for every later request.
    assert all(o.num_cached_tokens == 36 for o in rest)


def test_decode_cascade_over_a_shared_prefix(arch_path, hf_greedy, monkeypatch):
    """Ten requests decode together over one cached 134-token prefix: the CPU
    backend attends it once for all of them (a cascade) and merges it per row."""
    from kernels.cpu import load_cpu_kernels
    from worker.attention.backends.cpu import CPUAttentionBackend

    cascades = []
    plain = CPUAttentionBackend._cascade_prefix_len

    def spy(self, *args):
        cascades.append(plain(self, *args))
        return cascades[-1]

    monkeypatch.setattr(CPUAttentionBackend, "_cascade_prefix_len", spy)
    prefix = random_prompts([134], seed=7)[0]
    prompts = [prefix + s for s in random_prompts([2, 5, 1, 9, 3, 12, 4, 7, 6, 10, 8], seed=8)]
    llm = LLM(str(arch_path), **{**ENGINE, "max_model_len": 256})
    first = llm.generate(prompts[:1], GREEDY, detokenize=False)
    rest = llm.generate(prompts[1:], GREEDY, detokenize=False)
    got = [o.outputs[0].token_ids for o in first + rest]
    assert got == hf_greedy(arch_path, prompts, MAX_TOKENS)
    assert all(o.num_cached_tokens == 132 for o in rest)  # 33 full blocks of 4
    if load_cpu_kernels() is not None:  # without a compiler the reference backend runs
        assert max(cascades) == 132


def test_one_long_stream_splits_its_decode_attention(arch_path, hf_greedy, monkeypatch):
    """One stream of 520+ tokens on two threads: the decode kernel attends each step's
    tokens in two parts, a thread each, and merges them by log-sum-exp."""
    import torch

    from kernels.cpu import load_cpu_kernels

    kernels = load_cpu_kernels()
    if kernels is None:
        pytest.skip("no C++ toolchain to build the CPU kernels")
    splits = []
    plain = kernels.paged_attention_decode

    def spy(*args, **kwargs):
        seq_lens, window = args[4], args[8] if len(args) > 8 else kwargs["sliding_window"]
        splits.append(
            len(kernels.paged_attention_decode_parts(seq_lens, torch.get_num_threads(), window))
        )
        return plain(*args, **kwargs)

    monkeypatch.setattr(kernels, "paged_attention_decode", spy)  # before the layers bind it
    prompts = random_prompts([520], seed=9)
    got, _, _ = run_llm(arch_path, prompts, max_model_len=1024, num_kv_blocks=256, cpu_threads=2)
    assert got == hf_greedy(arch_path, prompts, MAX_TOKENS)
    assert splits and set(splits) == {2}


def test_chunked_prefill(arch_path, hf_greedy):
    prompts = random_prompts(LENGTHS, seed=4)
    got, _, _ = run_llm(arch_path, prompts, max_num_batched_tokens=16)
    assert got == hf_greedy(arch_path, prompts, MAX_TOKENS)


def test_preemption(arch_path, hf_greedy):
    prompts = random_prompts(LENGTHS, seed=5)
    # 36 blocks of 4 = 144 slots for ten requests of up to 90 tokens.
    got, stats, _ = run_llm(arch_path, prompts, num_kv_blocks=36)
    assert stats.num_preemptions > 0
    assert got == hf_greedy(arch_path, prompts, MAX_TOKENS)


def test_preemption_without_prefix_caching(make_checkpoint, hf_greedy):
    path = make_checkpoint("llama")
    prompts = random_prompts(LENGTHS, seed=6)
    got, stats, _ = run_llm(path, prompts, num_kv_blocks=36, enable_prefix_caching=False)
    assert stats.num_preemptions > 0
    assert stats.prefix_cache_queries == 0
    assert got == hf_greedy(path, prompts, MAX_TOKENS)


@pytest.mark.parametrize(
    "arch, overrides",
    [
        ("llama", {"tie_word_embeddings": True}),
        ("llama", {"max_shard_size": "40KB"}),
        (
            "llama",
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 10000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32,
                }
            },
        ),
        ("llama", {"num_key_value_heads": 4}),
        ("llama", {"num_key_value_heads": 1}),
        ("mistral", {"sliding_window": 8}),
        ("qwen3", {"tie_word_embeddings": True}),
    ],
    ids=["tied", "sharded", "llama3-rope", "mha", "mqa", "sliding-window", "qwen3-tied"],
)
def test_checkpoint_variants(make_checkpoint, hf_greedy, arch, overrides):
    path = make_checkpoint(arch, **overrides)
    prompts = random_prompts([5, 19, 44, 60], seed=7)
    got, _, _ = run_llm(path, prompts)
    assert got == hf_greedy(path, prompts, MAX_TOKENS)


def test_bf16_checkpoint_runs_exact_in_float32(make_checkpoint, hf_greedy):
    import torch

    path = make_checkpoint("llama", dtype=torch.bfloat16)
    prompts = random_prompts([9, 33], seed=8)
    got, _, llm = run_llm(path, prompts, dtype="float32")
    assert llm.engine.core.dtype == torch.float32
    assert got == hf_greedy(path, prompts, MAX_TOKENS)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_bfloat16_engine_tracks_float32_transformers(make_checkpoint, backend):
    """bf16 cannot be token-exact, but its distribution must stay close: prompt
    logprobs (every layer, both attention paths, chunked) against fp32 HF."""
    import torch
    from transformers import AutoModelForCausalLM

    path = make_checkpoint("llama", dtype=torch.bfloat16)
    prompt = random_prompts([70], seed=10)[0]
    llm = LLM(
        str(path), **ENGINE, dtype="bfloat16", attention_backend=backend, max_num_batched_tokens=32
    )
    params = SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=0)
    (out,) = llm.generate([prompt], params, detokenize=False)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0], dim=-1)
    got = torch.tensor([e.logprob for e in out.prompt_logprobs[1:]])
    want = expected[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    # Measured: mean 0.0036, max 0.014 on both backends.
    assert (got - want).abs().mean() < 0.015, (got - want).abs().max()
