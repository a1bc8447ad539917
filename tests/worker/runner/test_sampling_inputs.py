"""Per-request sampling parameters become the step's additive logit mask exactly."""

from __future__ import annotations

import torch

from shared.sampling_params import SamplingParams
from tests.worker.sample.test_sampler import EOS, LOGITS, VOCAB, sample, state
from worker.runner.sampling_inputs import banned_token_ids, build_sampling_metadata

CPU = torch.device("cpu")
INF = float("-inf")


def mask_of(*states) -> torch.Tensor:
    return build_sampling_metadata(list(states), VOCAB, EOS, CPU).logit_bias


def test_allowed_token_ids_leave_only_those_tokens():
    params = SamplingParams(temperature=1.0, allowed_token_ids=[2, 5], logit_bias={5: 1.5})
    assert mask_of(state(0, params)).tolist() == [[INF, INF, 0.0, INF, INF, 1.5, INF, INF]]
    draws = {sample(LOGITS, [state(0, params)], seed=s).token_ids.item() for s in range(60)}
    assert draws == {2, 5}


def test_bad_words_ban_the_token_that_would_complete_them():
    params = SamplingParams(temperature=0, bad_words_token_ids=[[1], [3, 4, 6], [7, 3]])
    # Single-token words always; [3, 4, 6] only after 3, 4; [7, 3] only after 7.
    assert banned_token_ids(state(0, params, outputs=()), EOS) == [1]
    assert banned_token_ids(state(0, params, outputs=(5, 3, 4)), EOS) == [1, 6]
    assert banned_token_ids(state(0, params, outputs=(3, 4, 7)), EOS) == [1, 3]
    # The prompt does not count: vLLM matches the output only.
    assert banned_token_ids(state(0, params, prompt=(3, 4)), EOS) == [1]
    # Greedy order of LOGITS: 1, 3, 6, ...
    assert sample(LOGITS, [state(0, params, outputs=(5,))]).token_ids.tolist() == [3]
    assert sample(LOGITS, [state(0, params, outputs=(7,))]).token_ids.tolist() == [6]


def test_a_vocabulary_wide_bias_is_tensorized_once_per_request():
    bias = {token: float(token) for token in range(VOCAB)}
    s = state(0, SamplingParams(temperature=0, logit_bias=bias))
    first = mask_of(s)
    tensors = s.mask_tensors()
    assert mask_of(s).tolist() == first.tolist() == [[float(t) for t in range(VOCAB)]]
    assert s.mask_tensors() is tensors  # built once, not per step


def test_rows_without_adjustments_get_no_mask():
    assert mask_of(state(0, SamplingParams()), state(1, SamplingParams(temperature=0))) is None
    mixed = mask_of(state(0, SamplingParams()), state(1, SamplingParams(allowed_token_ids=[1])))
    assert mixed[0].tolist() == [0.0] * VOCAB
    assert mixed[1].tolist() == [INF, 0.0, INF, INF, INF, INF, INF, INF]
