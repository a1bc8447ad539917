"""Build one step's model inputs, on the host, from the runner's request states.

Per-sequence work is one slice per request; per-token work is vectorized in
numpy, so the cost stays flat as batches grow. Nothing here touches the
device: the runner ships these arrays in the step's one copy (staging.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.attention.metadata import BatchLayout
from worker.runner.request_state import RequestState


@dataclass
class StepInputs:
    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    layout: BatchLayout
    # Rows of the hidden states whose logits are sampled, and their requests.
    logits_indices: np.ndarray  # [num_sample] int64
    sample_req_ids: list[str]
    # Per request: (first hidden row, first position, count) of prompt
    # positions that need prompt logprobs this step.
    prompt_logprob_spans: dict[str, tuple[int, int, int]]

    def padded(self, num_seqs: int, max_num_blocks: int) -> StepInputs:
        """This decode step padded to num_seqs rows (token 0 at position 0, slot -1)."""
        pad = num_seqs - self.layout.num_seqs
        zeros = np.zeros(pad, dtype=np.int64)
        return StepInputs(
            input_ids=np.concatenate([self.input_ids, zeros]),
            positions=np.concatenate([self.positions, zeros]),
            layout=self.layout.padded(num_seqs, max_num_blocks),
            logits_indices=self.logits_indices,
            sample_req_ids=self.sample_req_ids,
            prompt_logprob_spans=self.prompt_logprob_spans,
        )


def build_step_inputs(
    states: list[RequestState], num_scheduled: list[int], block_size: int
) -> StepInputs:
    num_seqs = len(states)
    counts = np.asarray(num_scheduled, dtype=np.int64)
    starts = np.fromiter((s.num_computed_tokens for s in states), dtype=np.int64, count=num_seqs)
    query_start_loc = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(counts, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    seq_lens = starts + counts

    input_ids = np.empty(num_tokens, dtype=np.int64)
    for state, start, first, count in zip(
        states, starts.tolist(), query_start_loc.tolist(), num_scheduled
    ):
        input_ids[first : first + count] = state.token_ids[start : start + count]
    # position of token j of sequence i = starts[i] + (j - query_start_loc[i])
    positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(
        starts - query_start_loc[:-1], counts
    )

    max_blocks = max(len(s.block_ids) for s in states)
    block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int32)
    for i, state in enumerate(states):
        block_tables[i, : len(state.block_ids)] = state.block_ids
    seq_index = np.repeat(np.arange(num_seqs), counts)
    slot_mapping = (
        block_tables[seq_index, positions // block_size].astype(np.int64) * block_size
        + positions % block_size
    )

    sample_rows, sample_req_ids = [], []
    prompt_logprob_spans = {}
    for i, state in enumerate(states):
        end = int(seq_lens[i])
        if end == len(state.token_ids):
            sample_rows.append(int(query_start_loc[i + 1]) - 1)
            sample_req_ids.append(state.req_id)
        if state.sampling_params.prompt_logprobs is not None:
            # Position p's logits score prompt token p + 1.
            first, last = int(starts[i]), min(end, state.num_prompt_tokens - 1)
            if last > first:
                prompt_logprob_spans[state.req_id] = (int(query_start_loc[i]), first, last - first)

    layout = BatchLayout(
        query_start_loc=query_start_loc.astype(np.int32),
        seq_lens=seq_lens.astype(np.int32),
        block_tables=block_tables,
        slot_mapping=slot_mapping,
    )
    return StepInputs(
        input_ids=input_ids,
        positions=positions,
        layout=layout,
        logits_indices=np.asarray(sample_rows, dtype=np.int64),
        sample_req_ids=sample_req_ids,
        prompt_logprob_spans=prompt_logprob_spans,
    )
