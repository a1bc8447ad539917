"""The engine with the Triton backend gives transformers' greedy tokens, on CPU
through Triton's interpreter (the GPU path, kernels and metadata alike):
a batch with a prefix-cache hit, chunked prefill, decode and preemption, and
decode steps replayed through the CUDA-graph runner with a capture that
re-runs the recorded function (its padding and static buffers on CPU).
Under `gpu` the same runs on CUDA, with real graphs."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import random_prompts
from worker import LLM, SamplingParams
from worker.runner.model_runner import ModelRunner

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
# Small enough that the interpreter runs each scenario in seconds.
ENGINE = dict(block_size=4, max_model_len=96, attention_backend="triton")


class EagerReplayCapture:
    """A capture that records by keeping the function: replay runs it again on the
    capture-time tensors, as a CUDA graph replays its kernels on their addresses."""

    def __init__(self) -> None:
        self.replays = 0

    def capture(self, fn):
        out = fn()

        def replay():
            self.replays += 1
            out.copy_(fn())

        return out, replay


def _generate(path, prompts, device, **options):
    llm = LLM(str(path), **{**ENGINE, "device": device, **options})
    first = llm.generate(prompts[:1], GREEDY, detokenize=False)
    rest = llm.generate(prompts[1:], GREEDY, detokenize=False)
    return [o.outputs[0].token_ids for o in first + rest], llm


def _scenarios(make_checkpoint, hf_greedy, device, dtype="float32"):
    path = make_checkpoint("llama")
    prefix = random_prompts([13], seed=11)[0]
    prompts = [prefix + s for s in random_prompts([3, 1], seed=12)] + random_prompts([22], seed=13)
    want = hf_greedy(path, prompts, MAX_TOKENS)
    # Prefix hit (later prompts share 3 blocks), chunked prefill (10-token budget), decode.
    got, llm = _generate(path, prompts, device, max_num_batched_tokens=10, dtype=dtype)
    assert llm.last_stats.prefix_cache_hits > 0
    assert got == want
    llm.shutdown()  # on a GPU the next engine wants the KV cache's memory
    # Preemption: 7 blocks of 4 tokens; three requests admitted with 2 blocks each
    # grow to 4 each while decoding.
    prompts = random_prompts([7, 8, 6], seed=16)
    options = {**ENGINE, "device": device, "dtype": dtype, "max_model_len": 24}
    llm = LLM(str(path), **options, num_kv_blocks=7)
    outputs = llm.generate(prompts, GREEDY, detokenize=False)
    assert llm.last_stats.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy(path, prompts, MAX_TOKENS)
    llm.shutdown()


def test_triton_backend_interpreted_matches_hf(make_checkpoint, hf_greedy, triton_device):
    if triton_device.type == "cuda":
        pytest.skip("the CUDA run is test_triton_backend_on_cuda")
    _scenarios(make_checkpoint, hf_greedy, "cpu")


def test_decode_through_graph_runner_matches_hf(
    make_checkpoint, hf_greedy, monkeypatch, triton_device
):
    """Three decode rows replay the graph of 4 (a padding row: slot -1, an empty
    context), one row the graph of 1; prefill steps run eagerly."""
    if triton_device.type == "cuda":
        pytest.skip("the CUDA run is test_cuda_graphs_match_eager")
    capture = EagerReplayCapture()
    real_capture = ModelRunner.capture_cuda_graphs
    monkeypatch.setattr(ModelRunner, "cuda_graphs_wanted", lambda self: True)
    monkeypatch.setattr(
        ModelRunner, "capture_cuda_graphs", lambda self: real_capture(self, capture)
    )
    path = make_checkpoint("llama")
    prompts = random_prompts([5, 11, 2, 9], seed=14)
    got, llm = _generate(path, prompts, "cpu", max_num_seqs=4)
    assert sorted(llm.engine.core.runner.graphs.graphs) == [1, 2, 4]
    assert capture.replays >= 2 * (MAX_TOKENS - 1)
    assert got == hf_greedy(path, prompts, MAX_TOKENS)


@pytest.mark.gpu
def test_triton_backend_on_cuda(make_checkpoint, hf_greedy):
    """float32 on CUDA (IEEE dots, graphs on): token-exact like on CPU."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _scenarios(make_checkpoint, hf_greedy, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_graphs_match_eager(make_checkpoint, dtype):
    """Graph replay gives the eager run's tokens, in bf16 and fp16."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    path = make_checkpoint("llama")
    prompts = random_prompts([5, 17, 2, 9, 12, 40, 3], seed=15)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = {}
    for eager in (True, False):
        llm = LLM(str(path), **{**ENGINE, "device": "cuda", "dtype": dtype, "enforce_eager": eager})
        assert (llm.engine.core.runner.graphs is None) == eager
        outputs[eager] = [
            o.outputs[0].token_ids for o in llm.generate(prompts, params, detokenize=False)
        ]
        llm.shutdown()
    assert outputs[True] == outputs[False]
