"""Our engine over workloads on a tiny random checkpoint: exact token counts, KV figures."""

from __future__ import annotations

import pytest

from bench.offline import run_offline, warm_up
from bench.workloads import BenchRequest, TokenDraw, Workload, mixed, shared_prefix
from worker import LLM

OPTIONS = dict(block_size=4, max_model_len=128, num_kv_blocks=256, max_num_batched_tokens=256)


@pytest.fixture(scope="module")
def tiny(make_checkpoint):
    return str(make_checkpoint("llama"))


@pytest.fixture(scope="module")
def llm(tiny):
    llm = LLM(tiny, **OPTIONS)
    warm_up(llm)
    return llm


def test_mixed_counts_exactly_the_workload_tokens(llm, tiny):
    requests = mixed(TokenDraw(5, 512), num_requests=6, prompt_len=(4, 40), output_len=(2, 12))
    workload = Workload("mixed-tiny", 5, 512, tuple(requests))
    result = run_offline(llm, workload, model=tiny)
    assert result.engine == "pagoda" and result.dtype == "float32"
    assert result.requests == 6
    assert result.prompt_tokens == sum(len(r.prompt_token_ids) for r in requests)
    assert result.output_tokens == sum(r.max_tokens for r in requests)
    assert 0 <= result.kv_waste < 1
    assert 0 < result.peak_kv_blocks <= 256 and result.peak_kv_use == result.peak_kv_blocks / 256
    assert (result.preemptions, result.cached_prompt_tokens) == (0, 0)
    assert result.prefix_cache_hit_rate == 0.0  # the warm-up shares no block with it
    line = result.to_json()
    total = result.prompt_tokens + result.output_tokens
    assert line["total_tokens_per_s"] == round(total / result.elapsed_s, 2)
    flags = ["--max-model-len=128", "--block-size=4", "--num-kv-blocks=256"]
    flags.append("--max-num-batched-tokens=256")
    assert " ".join(line["flags"]) == " ".join(flags).replace("=", " ")
    assert set(line["machine"]) >= {"cpu", "cores", "torch", "threads"}


def test_kv_waste_of_one_request_by_hand(llm, tiny):
    # 8 prompt tokens in blocks of 4, 4 outputs. After each step (slots, tokens):
    # prefill (8, 8); decode (12, 9), (12, 10); last step frees it (0, 0).
    workload = Workload("one", 0, 512, (BenchRequest(tuple(range(100, 108)), 4),))
    result = run_offline(llm, workload, model=tiny)
    assert result.kv_waste == pytest.approx(5 / 32)
    assert (result.output_tokens, result.peak_kv_blocks) == (4, 3)


def test_shared_prefix_is_read_from_the_cache_and_not_without_it(llm, tiny):
    requests = shared_prefix(
        TokenDraw(6, 512), num_requests=4, prefix_len=16, suffix_len=4, output_len=2
    )
    workload = Workload("shared-prefix-tiny", 6, 512, tuple(requests))
    # The first request alone fills the cache; then the other three find its 16 tokens.
    run_offline(llm, workload.head(1), model=tiny)
    cached = run_offline(llm, Workload("rest", 6, 512, workload.requests[1:]), model=tiny)
    assert cached.cached_prompt_tokens == 3 * 16
    assert cached.prefix_cache_hit_rate == pytest.approx(48 / 60)
    uncached = run_offline(LLM(tiny, **OPTIONS, enable_prefix_caching=False), workload, tiny)
    assert uncached.prefix_caching is False
    assert (uncached.cached_prompt_tokens, uncached.prefix_cache_hit_rate) == (0, None)
