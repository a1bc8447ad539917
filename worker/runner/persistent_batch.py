"""A step's inputs kept across steps and advanced in place while the batch holds.

Most steps of a steady batch are the same requests decoding one token each. For
them nothing about the batch changes but one token and one position per row, and
a block-table column every block_size steps; rebuilding the inputs from the
request states (step_inputs.py) and the sampling tensors from their parameters
(sampling_inputs.py) every step is host work for nothing. As vLLM's persistent
InputBatch does, this keeps the last decode step's arrays and sampling metadata
and advances them while the batch's composition holds:

    step t (decode, every row samples)  -> remembered
    step t+1: same requests, same order, one token each, each one position on
              -> input ids = the tokens sampled at t, positions and seq lens + 1,
                 slots from the (extended) block tables; sampling reused
    anything else (a request added, finished, preempted, a prefill chunk)
              -> rebuilt from the states, as before

Advancing gives the arrays a rebuild would (tests/worker/runner/test_persistent_batch.py).
Nothing here touches the device.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from worker.attention.metadata import BatchLayout
from worker.runner.request_state import RequestState
from worker.runner.step_inputs import StepInputs, build_step_inputs
from worker.sample.sampler import SamplingMetadata


def _sampling_is_fixed(state: RequestState) -> bool:
    """Whether this request's sampling tensors stay the same from step to step:
    penalties read the output so far, bad words its tail, min_tokens bans EOS
    until it is reached; a seeded generator is reseeded per step (done apart)."""
    params = state.sampling_params
    return (
        not params.has_penalties
        and not params.bad_words_token_ids
        and state.num_output_tokens >= params.min_tokens
        and state.grammar is None
    )


class PersistentBatch:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._req_ids: tuple[str, ...] | None = None  # the remembered decode batch
        self._inputs: StepInputs | None = None
        # Per row, as Python ints (compared per step: numpy scalars are ~3x slower):
        self._num_blocks: list[int] = []  # block ids its table holds
        self._seq_lens: list[int] = []  # its seq_len in the remembered inputs
        self._sampling: SamplingMetadata | None = None
        self._seeded_rows: list[int] = []  # rows whose draw reseeds every step

    def forget(self) -> None:
        """Rebuild next step: requests were added, finished or resumed (a request
        id may come back with other blocks, so matching ids prove nothing then)."""
        self._req_ids = self._inputs = self._sampling = None

    def step_inputs(
        self, req_ids: tuple[str, ...], states: list[RequestState], num_scheduled: list[int]
    ) -> StepInputs:
        """This step's inputs: the remembered ones advanced where the batch holds,
        else built from the states (and remembered when they are a decode batch)."""
        inputs = self._advanced(req_ids, states, num_scheduled)
        if inputs is None:
            self._sampling = None
            inputs = build_step_inputs(states, num_scheduled, self.block_size)
            is_decode = (
                len(inputs.input_ids) == len(states) == len(inputs.sample_req_ids)
                and not inputs.prompt_logprob_spans
            )
            self._req_ids = req_ids if is_decode else None
            if is_decode:
                self._num_blocks = [len(s.block_ids) for s in states]
                self._seq_lens = inputs.layout.seq_lens.tolist()
        self._inputs = inputs
        return inputs

    def _advanced(
        self, req_ids: tuple[str, ...], states: list[RequestState], num_scheduled: list[int]
    ) -> StepInputs | None:
        last = self._inputs
        if req_ids != self._req_ids or last is None or any(n != 1 for n in num_scheduled):
            return None
        # One position on, and the row samples again (its token is the last one).
        seq_lens = self._seq_lens
        if [s.num_computed_tokens for s in states] != seq_lens:
            return None
        if [len(s.token_ids) - 1 for s in states] != seq_lens:
            return None
        tables = last.layout.block_tables
        num_blocks = [len(s.block_ids) for s in states]
        if num_blocks != self._num_blocks:
            grown = [i for i, (n, m) in enumerate(zip(num_blocks, self._num_blocks)) if n != m]
            width = max(num_blocks)
            # A new array: the last step's tensors are views of the old one. (Not
            # np.pad: it costs ~50 us here, zeros and a copy ~2.)
            wider = np.zeros((len(states), max(width, tables.shape[1])), dtype=tables.dtype)
            wider[:, : tables.shape[1]] = tables
            tables = wider
            for i in grown:
                ids = states[i].block_ids
                if ids[: self._num_blocks[i]] != tables[i, : self._num_blocks[i]].tolist():
                    return None  # replaced, not extended
                tables[i, : len(ids)] = ids
                self._num_blocks[i] = len(ids)
        # Each row's new position is its last seq_len. Its slot is the one after
        # its last, unless the position starts a block: then that block's first.
        # (Few numpy calls: after a forward has streamed the weights through the
        # caches, each costs several us, ~0.1 ms a step for the vectorized form.)
        block_size = self.block_size
        positions = last.positions + 1  # [num_seqs] int64
        slot_mapping = last.layout.slot_mapping + 1  # [num_seqs] int64
        for i, position in enumerate(seq_lens):
            if position % block_size == 0:
                slot_mapping[i] = int(tables[i, position // block_size]) * block_size
        layout = BatchLayout(
            query_start_loc=last.layout.query_start_loc,
            seq_lens=last.layout.seq_lens + 1,
            block_tables=tables,
            slot_mapping=slot_mapping,
        )
        self._seq_lens = [n + 1 for n in seq_lens]
        input_ids = np.fromiter((s.token_ids[-1] for s in states), np.int64, len(states))
        return StepInputs(
            input_ids=input_ids,
            positions=positions,
            layout=layout,
            logits_indices=last.logits_indices,
            sample_req_ids=last.sample_req_ids,
            prompt_logprob_spans=last.prompt_logprob_spans,
        )

    def sampling(self, states: list[RequestState], build) -> SamplingMetadata:
        """The sampling metadata for these rows: the remembered one, with this
        step's generators, while the batch holds and no row's tensors change;
        else `build(states)`."""
        meta = self._sampling
        if meta is not None and self._req_ids is not None:
            if not self._seeded_rows:
                return meta  # no generator to reseed: the same metadata
            generators = {i: states[i].step_generator() for i in self._seeded_rows}
            return dataclasses.replace(meta, generators=generators)
        meta = build(states)
        fixed = self._req_ids is not None and all(_sampling_is_fixed(s) for s in states)
        self._sampling = meta if fixed else None
        self._seeded_rows = list(meta.generators)
        return meta
