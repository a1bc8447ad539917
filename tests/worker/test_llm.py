"""The offline API end to end: text prompts, logprobs against transformers, seeds."""

from __future__ import annotations

import json

import pytest
import torch

from shared.errors import ConfigError, UnsupportedModelError
from tests.conftest import random_prompts
from worker import LLM, SamplingParams

OPTIONS = dict(block_size=4, max_model_len=128, num_kv_blocks=256)


@pytest.fixture(scope="module")
def llama(make_checkpoint):
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def llm(llama):
    return LLM(str(llama), **OPTIONS)


@pytest.fixture(scope="module")
def hf_model(llama):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32).eval()


def test_text_prompts_are_tokenized_and_outputs_detokenized(llm, llama):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(llama)
    (out,) = llm.generate("Paged attention stores", SamplingParams(temperature=0, max_tokens=8))
    assert out.prompt_token_ids == tokenizer.encode("Paged attention stores")
    completion = out.outputs[0]
    assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)


def test_sampled_logprobs_match_transformers(llm, hf_model):
    prompt = random_prompts([12], seed=11)[0]
    (out,) = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=5, logprobs=2))
    completion = out.outputs[0]
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(hf_model(ids).logits[0].float(), dim=-1)
    for i, entry in enumerate(completion.logprobs):
        row = logprobs[len(prompt) - 1 + i]
        assert entry.token_id == completion.token_ids[i]
        assert entry.rank == 1  # greedy
        assert entry.logprob == pytest.approx(row[entry.token_id].item(), abs=1e-4)
        top_ids = [t for t, _ in entry.top]
        assert top_ids == row.topk(2).indices.tolist()


def test_prompt_logprobs_match_transformers(llm, hf_model):
    prompt = random_prompts([21], seed=12)[0]
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    # A tiny budget splits the prompt across steps: prompt logprobs arrive in chunks.
    chunked = LLM(str(llm.engine.spec.path), **OPTIONS, max_num_batched_tokens=8)
    for engine in (llm, chunked):
        (out,) = engine.generate([prompt], params)
        with torch.no_grad():
            logprobs = torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0].float(), dim=-1)
        assert out.prompt_logprobs[0] is None
        assert len(out.prompt_logprobs) == len(prompt)
        for pos, entry in enumerate(out.prompt_logprobs[1:], start=1):
            assert entry.token_id == prompt[pos]
            assert entry.logprob == pytest.approx(logprobs[pos - 1, prompt[pos]].item(), abs=1e-4)
            assert len(entry.top) == 1


def test_seeded_sampling_is_reproducible_alone_and_in_a_mixed_batch(llm):
    prompt = random_prompts([15], seed=13)[0]
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_tokens=12, ignore_eos=True)
    alone = llm.generate([prompt], seeded)[0].outputs[0].token_ids
    assert llm.generate([prompt], seeded)[0].outputs[0].token_ids == alone
    others = random_prompts([3, 30, 9], seed=14)
    params = [
        SamplingParams(temperature=0.8, max_tokens=20),
        seeded,
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.5, top_k=5),
    ]
    mixed = llm.generate([others[0], prompt, others[1], others[2]], params)
    assert mixed[1].outputs[0].token_ids == alone


def test_n_samples_with_a_seed_differ_from_each_other_but_repeat(llm):
    prompt = random_prompts([10], seed=15)[0]
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    first = [c.token_ids for c in llm.generate([prompt], params)[0].outputs]
    second = [c.token_ids for c in llm.generate([prompt], params)[0].outputs]
    assert first == second
    assert len({tuple(t) for t in first}) == 3


def test_stop_token_ids_and_finish_reasons(llm):
    prompt = random_prompts([8], seed=16)[0]
    (greedy,) = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    )
    tokens = greedy.outputs[0].token_ids
    stop = tokens[3]
    (stopped,) = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop])
    )
    out = stopped.outputs[0]
    first = tokens.index(stop)
    assert out.token_ids == tokens[: first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert greedy.outputs[0].finish_reason == "length"


def test_unsupported_architecture_names_the_supported_ones(tmp_path, llama):
    config = json.loads((llama / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        UnsupportedModelError,
        match="'GPT2LMHeadModel' is not supported; supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM",
    ):
        LLM(str(tmp_path))


def test_kv_cache_too_small_for_max_model_len_says_what_to_change(llama):
    with pytest.raises(
        ConfigError,
        match=r"less than one request of --max-model-len 128.*--kv-cache-memory.*--max-model-len to 64",
    ):
        LLM(str(llama), block_size=4, max_model_len=128, num_kv_blocks=16)


def test_missing_folder_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        LLM(str(tmp_path / "nope"))


def test_on_step_sees_every_step_stats(llm):
    # 8 prompt tokens in blocks of 4: one prefill step, then one step per further token.
    prompt = random_prompts([8], seed=21)[0]
    seen = []
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate([prompt], params, on_step=seen.append)
    first = seen[0].step
    assert [s.step for s in seen] == [first, first + 1, first + 2, first + 3]
    assert [s.num_scheduled_tokens for s in seen] == [8, 1, 1, 1]
    # Computed tokens against slots in the request's blocks; the last step frees them.
    assert [s.kv_tokens_held for s in seen] == [8, 9, 10, 0]
    assert [s.kv_slots_allocated for s in seen] == [8, 12, 12, 0]
    assert seen[-1] is llm.last_stats


def test_step_budget_defaults_to_the_offline_one_and_keeps_an_explicit_one(llm, llama):
    from worker.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine

    assert llm.engine.config.scheduler.max_num_batched_tokens == 4096
    assert llm.engine.core.scheduler.config.max_num_batched_tokens == 4096
    serving = LLMEngine(EngineConfig.from_kwargs(model=str(llama), **OPTIONS))
    assert serving.config.scheduler.max_num_batched_tokens == 2048
    explicit = LLM(str(llama), **OPTIONS, max_num_batched_tokens=512)
    assert explicit.engine.config.scheduler.max_num_batched_tokens == 512


def test_block_size_defaults_by_device(llama):
    from worker.config import EngineConfig

    unset = EngineConfig.from_kwargs(model=str(llama))
    assert unset.cache.block_size is None
    assert unset.resolved(offline=True, device_type="cpu").cache.block_size == 8
    assert unset.resolved(offline=True, device_type="cuda").cache.block_size == 16
    llm = LLM(str(llama), max_model_len=128, num_kv_blocks=256)
    assert llm.engine.config.cache.block_size == 8
    assert llm.engine.core.runner.block_size == 8


def test_shutdown_frees_the_model_and_kv_cache_at_once(llama):
    """The runner and its KV cache are gone when shutdown returns, without waiting
    for a garbage collection (on a GPU the next engine needs that memory)."""
    import gc
    import weakref

    llm = LLM(str(llama), **OPTIONS)
    assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].outputs[0].token_ids
    runner = weakref.ref(llm.engine.core.runner)
    kv_cache = weakref.ref(llm.engine.core.runner.kv_caches[0])
    gc.disable()  # a collection between the calls must not be what frees them
    try:
        llm.shutdown()
        assert runner() is None and kv_cache() is None
        llm.shutdown()  # twice is fine
    finally:
        gc.enable()
