"""The engine's front door: validation errors, n fan-out, aborts that free everything."""

from __future__ import annotations

import pytest

from shared.errors import InvalidRequestError
from shared.sampling_params import SamplingParams
from worker.config import EngineConfig
from worker.engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def engine(make_checkpoint):
    path = make_checkpoint("llama")
    return LLMEngine(
        EngineConfig.from_kwargs(model=str(path), block_size=4, max_model_len=64, num_kv_blocks=64)
    )


def drain(engine: LLMEngine) -> dict[tuple[str, int], list]:
    got: dict[tuple[str, int], list] = {}
    while engine.has_unfinished_requests():
        for delta in engine.step().deltas:
            got.setdefault((delta.request_id, delta.index), []).append(delta)
    return got


def assert_pool_idle(engine: LLMEngine) -> None:
    pool = engine.core.scheduler.kv.pool
    pool.check_integrity()
    assert pool.num_free_blocks == pool.num_blocks


@pytest.mark.parametrize(
    "prompt, params, field, message",
    [
        ([], SamplingParams(), "prompt", "must contain at least one token"),
        (
            [5, 512, 7],
            SamplingParams(),
            "prompt",
            "token id 512 at position 1 is outside the vocabulary [0, 512)",
        ),
        ([5, -1], SamplingParams(), "prompt", "token id -1 at position 1"),
        ([5] * 64, SamplingParams(), "prompt", "64 tokens leave no room"),
        (
            [5] * 60,
            SamplingParams(max_tokens=5),
            "max_tokens",
            "the prompt (60 tokens) plus max_tokens (5) exceeds the maximum context length of 64 tokens; lower max_tokens to at most 4",
        ),
        ([5], SamplingParams(stop_token_ids=[600]), "stop_token_ids", "token id 600"),
    ],
)
def test_invalid_requests_raise_typed_errors(engine, prompt, params, field, message):
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("bad", prompt, params)
    assert info.value.field == field
    assert message in info.value.message
    assert not engine.has_unfinished_requests()


def test_duplicate_request_id_is_rejected(engine):
    engine.add_request("dup", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="already running"):
        engine.add_request("dup", [5, 6], SamplingParams(max_tokens=2))
    drain(engine)
    assert_pool_idle(engine)


def test_max_tokens_none_fills_the_context(engine):
    engine.add_request(
        "fill", [5] * 60, SamplingParams(max_tokens=None, ignore_eos=True, temperature=0)
    )
    got = drain(engine)[("fill", 0)]
    assert sum(len(d.new_token_ids) for d in got) == 4
    assert got[-1].finish_reason == "length"


def test_n_samples_share_the_prompt_and_come_back_indexed(engine):
    prompt = list(range(10, 30))
    engine.add_request(
        "multi", prompt, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    )
    got = drain(engine)
    assert sorted(got) == [("multi", 0), ("multi", 1), ("multi", 2)]
    for deltas in got.values():
        assert sum(len(d.new_token_ids) for d in deltas) == 6
        assert deltas[-1].finished
    # Samples 1 and 2 hit the blocks sample 0 registered in the same step.
    assert [got[("multi", i)][0].num_cached_tokens for i in range(3)] == [0, 16, 16]
    assert_pool_idle(engine)


def test_abort_at_any_time_frees_every_block(engine):
    engine.add_request("a", list(range(3, 40)), SamplingParams(max_tokens=20, ignore_eos=True))
    engine.add_request("b", list(range(3, 20)), SamplingParams(n=2, max_tokens=20, ignore_eos=True))
    engine.add_request("c", list(range(50, 60)), SamplingParams(max_tokens=20, ignore_eos=True))
    engine.step()
    engine.abort_request("b")
    engine.step()
    engine.abort_request("a")
    engine.abort_request("c")
    engine.abort_request("never-existed")
    assert not engine.has_unfinished_requests()
    engine.step()  # lets the runner drop its state
    assert engine.core.runner.requests == {}
    assert_pool_idle(engine)
