from __future__ import annotations

import pytest
import torch

from shared.sampling_params import SamplingParams
from worker.runner.request_state import RequestState
from worker.runner.sampling_inputs import build_sampling_metadata
from worker.sample.sampler import Sampler

VOCAB = 8
EOS = (1,)


def state(i: int, params: SamplingParams, outputs=(), prompt=(3, 4)) -> RequestState:
    generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
    tokens = list(prompt) + list(outputs)
    return RequestState(str(i), tokens, len(prompt), params, [0], len(tokens), generator)


def sample(logits: torch.Tensor, states: list[RequestState], seed: int = 0):
    meta = build_sampling_metadata(states, logits.shape[1], EOS, torch.device("cpu"))
    return Sampler(torch.Generator().manual_seed(seed))(logits, meta)


LOGITS = torch.tensor([[0.5, 2.0, -1.0, 1.5, 0.0, -0.5, 1.0, 0.2]])


def reference_filtered_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The documented pipeline, written out plainly for one row."""
    x = logits / p.temperature
    order = torch.argsort(x, descending=True)
    keep = torch.zeros_like(x, dtype=torch.bool)
    k = p.top_k if p.top_k > 0 else len(x)
    keep[order[:k]] = True
    probs = torch.softmax(torch.where(keep, x, torch.tensor(float("-inf"))), dim=-1)
    if p.top_p < 1:
        sorted_probs = probs[order]
        cumulative_before = torch.cumsum(sorted_probs, 0) - sorted_probs
        keep_p = torch.zeros_like(keep)
        keep_p[order[cumulative_before < p.top_p]] = True
        keep &= keep_p
        probs = torch.softmax(torch.where(keep, x, torch.tensor(float("-inf"))), dim=-1)
    if p.min_p > 0:
        probs = torch.where(probs >= p.min_p * probs.max(), probs, torch.zeros_like(probs))
    return probs / probs.sum()


def test_greedy_is_argmax():
    out = sample(LOGITS, [state(0, SamplingParams(temperature=0))])
    assert out.token_ids.tolist() == [1]


def test_greedy_takes_the_models_dtype():
    # Plain greedy rows skip the float32 copy; the pick is the same.
    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    states = [state(i, SamplingParams(temperature=0)) for i in range(5)]
    out = sample(logits, states)
    assert out.token_ids.tolist() == logits.float().argmax(dim=-1).tolist()


def test_greedy_with_a_logit_bias_still_applies_it_on_bf16_logits():
    params = SamplingParams(temperature=0, logit_bias={6: 5.0})
    out = sample(LOGITS.to(torch.bfloat16), [state(0, params)])
    assert out.token_ids.tolist() == [6]  # 1.0 + 5.0 beats token 1's 2.0


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=3, seed=1),
        SamplingParams(temperature=1.3, top_p=0.6, seed=2),
        SamplingParams(temperature=1.0, min_p=0.3, seed=3),
        SamplingParams(temperature=0.9, top_k=5, top_p=0.8, min_p=0.1, seed=4),
    ],
    ids=["top_k", "top_p", "min_p", "all"],
)
def test_filtered_sampling_matches_the_distribution(params):
    expected = reference_filtered_probs(LOGITS[0], params)
    draws = 20000
    logits = LOGITS.expand(draws, VOCAB).contiguous()
    states = [state(i, params.__class__(**{**params.__dict__, "seed": i})) for i in range(draws)]
    tokens = sample(logits, states).token_ids
    counts = torch.bincount(tokens, minlength=VOCAB).float() / draws
    # Never outside the allowed set.
    assert counts[expected == 0].sum().item() == 0
    # Sampling error at 20000 draws: sigma <= 0.0036 per token; allow 4.5 sigma.
    assert torch.allclose(counts, expected, atol=0.016), (counts, expected)


def test_seeded_rows_do_not_depend_on_the_batch():
    params = SamplingParams(temperature=1.0, seed=1234)
    alone = sample(LOGITS, [state(0, params)], seed=0).token_ids.tolist()
    logits = torch.cat([torch.randn(3, VOCAB), LOGITS, torch.randn(2, VOCAB)])
    others = [state(i, SamplingParams(temperature=1.0)) for i in range(5)]
    batch = others[:3] + [state(9, params)] + others[3:]
    mixed = sample(logits, batch, seed=99).token_ids.tolist()
    assert mixed[3] == alone[0]


def run_seeded(params: SamplingParams, outputs: list[int], steps: int) -> list[int]:
    """`steps` draws of one seeded row, each token appended as the runner does."""
    row = state(0, params, outputs=outputs)
    drawn = []
    for _ in range(steps):
        token = sample(LOGITS, [row], seed=len(drawn)).token_ids.item()
        row.token_ids.append(token)
        drawn.append(token)
    return drawn


def test_a_seeded_draw_is_a_function_of_seed_and_position_alone():
    """A request resumed elsewhere with its first tokens given (a fresh state, as on
    another worker) draws exactly the tokens an undisturbed run draws next."""
    params = SamplingParams(temperature=1.0, seed=77)
    whole = run_seeded(params, [], 24)
    assert len(set(whole)) > 2  # positions draw differently, not one token repeated
    for cut in (1, 9, 23):
        assert run_seeded(params, whole[:cut], 24 - cut) == whole[cut:]
    assert run_seeded(SamplingParams(temperature=1.0, seed=78), [], 24) != whole


def test_penalties_follow_the_documented_formula():
    params = SamplingParams(
        temperature=0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25
    )
    logits = torch.tensor([[1.0, 2.0, -1.0, 4.0, 0.5, -2.0, 3.0, 0.0]])
    # prompt (3, 4); outputs 6, 6, 2
    meta = build_sampling_metadata(
        [state(0, params, outputs=(6, 6, 2))], VOCAB, EOS, torch.device("cpu")
    )
    adjusted = Sampler.adjust_logits(logits, meta)[0].tolist()
    assert adjusted == [
        1.0,
        2.0,
        -1.0 * 2.0 - 0.5 * 1 - 0.25,  # output once, negative: multiplied
        4.0 / 2.0,  # prompt only: repetition penalty, no frequency/presence
        0.5 / 2.0,
        -2.0,
        3.0 / 2.0 - 0.5 * 2 - 0.25,  # output twice
        0.0,
    ]


def test_logit_bias_and_min_tokens_ban():
    params = SamplingParams(
        temperature=0, logit_bias={5: 10.0, 1: -3.0}, min_tokens=2, stop_token_ids=(3,)
    )
    meta = build_sampling_metadata(
        [state(0, params, outputs=(7,))], VOCAB, EOS, torch.device("cpu")
    )
    adjusted = Sampler.adjust_logits(LOGITS, meta)[0]
    assert adjusted[5].item() == pytest.approx(-0.5 + 10.0)
    # EOS (1) and the stop token (3) are banned until 2 tokens exist.
    assert adjusted[1].item() == float("-inf") and adjusted[3].item() == float("-inf")
    done = build_sampling_metadata(
        [state(0, params, outputs=(7, 7))], VOCAB, EOS, torch.device("cpu")
    )
    assert Sampler.adjust_logits(LOGITS, done)[0][1].item() == pytest.approx(2.0 - 3.0)


def test_ignore_eos_does_not_ban_eos_under_min_tokens():
    params = SamplingParams(temperature=0, min_tokens=3, ignore_eos=True)
    meta = build_sampling_metadata([state(0, params)], VOCAB, EOS, torch.device("cpu"))
    assert meta.logit_bias is None


def test_logprobs_are_raw_with_rank_and_top_alternatives():
    params = SamplingParams(temperature=0, logprobs=3, logit_bias={0: 50.0})
    out = sample(LOGITS, [state(0, params)])
    raw = torch.log_softmax(LOGITS[0], dim=-1)
    assert out.token_ids.tolist() == [0]  # the bias decided the token...
    assert out.sampled_logprobs.tolist() == [raw[0].item()]  # ...but logprobs are raw
    assert out.sampled_ranks.tolist() == [4]  # 2.0, 1.5, 1.0 are more likely than 0.5
    assert out.top_token_ids.tolist() == [[1, 3, 6]]
    assert torch.equal(out.top_logprobs[0], raw[[1, 3, 6]])
