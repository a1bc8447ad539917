"""The persistent batch advances a decode batch to exactly what a rebuild gives,
and rebuilds whenever the batch does not simply move one token on."""

from __future__ import annotations

import numpy as np
import torch

from shared.sampling_params import SamplingParams
from worker.runner import persistent_batch
from worker.runner.persistent_batch import PersistentBatch
from worker.runner.request_state import RequestState, draw_seed
from worker.runner.sampling_inputs import build_sampling_metadata
from worker.runner.step_inputs import StepInputs, build_step_inputs

BLOCK = 4
VOCAB, EOS = 16, (15,)


def make_state(req_id: str, prompt_len: int, first_block: int, params=None) -> RequestState:
    params = params or SamplingParams(temperature=0)
    blocks = list(range(first_block, first_block + -(-(prompt_len + 1) // BLOCK)))
    # The prompt is computed and one token sampled: the next step decodes it.
    tokens = list(range(1, prompt_len + 1)) + [7]
    seed = params.seed
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return RequestState(req_id, tokens, prompt_len, params, blocks, prompt_len, generator)


def decode_one(states: list[RequestState], next_block: list[int], token: int) -> None:
    """What a step and the next _update_states do to a decode row: the token
    sampled is appended, the position computed, a block added at a boundary."""
    for s in states:
        s.num_computed_tokens += 1
        s.token_ids.append(token)
        if s.num_computed_tokens + 1 > len(s.block_ids) * BLOCK:
            s.block_ids.append(next_block[0])
            next_block[0] += 1


def assert_same(a: StepInputs, b: StepInputs) -> None:
    for name in ("input_ids", "positions", "logits_indices"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    for name in ("query_start_loc", "seq_lens", "block_tables", "slot_mapping"):
        x, y = getattr(a.layout, name), getattr(b.layout, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert a.sample_req_ids == b.sample_req_ids
    assert a.prompt_logprob_spans == b.prompt_logprob_spans


def count_rebuilds(monkeypatch) -> list[int]:
    calls = []

    def counted(*args):
        calls.append(1)
        return build_step_inputs(*args)

    monkeypatch.setattr(persistent_batch, "build_step_inputs", counted)
    return calls


def test_advancing_over_block_boundaries_equals_rebuilding(monkeypatch):
    rebuilds = count_rebuilds(monkeypatch)
    states = [make_state("a", 5, 0), make_state("b", 2, 10)]
    ids = ("a", "b")
    batch, next_block = PersistentBatch(BLOCK), [20]
    batch.step_inputs(ids, states, [1, 1])
    for step in range(11):  # rows cross block boundaries at different steps
        decode_one(states, next_block, token=100 + step)
        got = batch.step_inputs(ids, states, [1, 1])
        assert_same(got, build_step_inputs(states, [1, 1], BLOCK))
    assert len(rebuilds) == 1  # the first step only
    assert got.input_ids.tolist() == [110, 110]
    assert got.positions.tolist() == [16, 13]


def test_a_changed_batch_is_rebuilt(monkeypatch):
    rebuilds = count_rebuilds(monkeypatch)
    a, b = make_state("a", 5, 0), make_state("b", 2, 10)
    batch = PersistentBatch(BLOCK)
    batch.step_inputs(("a", "b"), [a, b], [1, 1])
    decode_one([a, b], [20], token=3)
    # Another order (or another set of requests): rebuilt, and still right.
    got = batch.step_inputs(("b", "a"), [b, a], [1, 1])
    assert_same(got, build_step_inputs([b, a], [1, 1], BLOCK))
    # A prefill chunk in the step: not a decode batch, nothing remembered.
    c = make_state("c", 6, 30)
    c.num_computed_tokens, c.token_ids = 0, c.token_ids[:-1]
    batch.step_inputs(("b", "a", "c"), [b, a, c], [1, 1, 6])
    decode_one([b, a], [20], token=3)
    c.num_computed_tokens = 6
    c.token_ids.append(9)  # its first sampled token
    batch.step_inputs(("b", "a", "c"), [b, a, c], [1, 1, 1])
    assert len(rebuilds) == 4
    # forget(): the runner saw requests come or go.
    batch.forget()
    decode_one([b, a, c], [20], token=3)
    assert_same(
        batch.step_inputs(("b", "a", "c"), [b, a, c], [1, 1, 1]),
        build_step_inputs([b, a, c], [1, 1, 1], BLOCK),
    )
    assert len(rebuilds) == 5


def test_replaced_blocks_are_not_taken_for_an_extension():
    a = make_state("a", 3, 0)  # blocks [0]; position 3 is the block's last slot
    batch = PersistentBatch(BLOCK)
    batch.step_inputs(("a",), [a], [1])
    decode_one([a], [20], token=3)
    a.block_ids = [8, 9]  # not [0, ...]: the table's row must be rebuilt
    got = batch.step_inputs(("a",), [a], [1])
    assert_same(got, build_step_inputs([a], [1], BLOCK))
    assert got.layout.slot_mapping.tolist() == [9 * BLOCK + 0]


def test_sampling_is_reused_only_while_no_row_changes_per_step():
    def build(states):
        build.calls += 1
        return build_sampling_metadata(states, VOCAB, EOS, torch.device("cpu"))

    build.calls = 0
    plain = make_state("a", 3, 0, SamplingParams(temperature=0.7, top_k=3))
    seeded = make_state("b", 3, 5, SamplingParams(temperature=0.7, seed=11))
    batch, next_block = PersistentBatch(BLOCK), [20]
    ids = ("a", "b")
    for _ in range(3):
        batch.step_inputs(ids, [plain, seeded], [1, 1])
        meta = batch.sampling([plain, seeded], build)
        fresh = build_sampling_metadata([plain, seeded], VOCAB, EOS, torch.device("cpu"))
        assert meta.top_k.tolist() == fresh.top_k.tolist() == [3, 0]
        assert meta.temperature.tolist() == fresh.temperature.tolist()
        # The seeded row's generator is reseeded for this output position.
        expected = torch.Generator().manual_seed(draw_seed(11, seeded.num_output_tokens))
        draw = torch.rand(4, generator=meta.generators[1])
        assert torch.equal(draw, torch.rand(4, generator=expected))
        decode_one([plain, seeded], next_block, token=4)
    assert build.calls == 1

    # Penalties read the output so far: rebuilt every step.
    build.calls = 0
    penalized = make_state("c", 3, 40, SamplingParams(temperature=0, presence_penalty=1.0))
    batch = PersistentBatch(BLOCK)
    for _ in range(3):
        batch.step_inputs(("c",), [penalized], [1])
        meta = batch.sampling([penalized], build)
        decode_one([penalized], next_block, token=4)
    assert build.calls == 3
    assert meta.output_ids.tolist() == [[7, 4, 4]]  # this step's output so far
