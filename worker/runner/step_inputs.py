"""Build one step's model inputs from the runner's request states.

Per-sequence work is one slice per request; per-token work is vectorized in
numpy, so the cost stays flat as batches grow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from worker.attention.metadata import AttentionMetadata
from worker.runner.request_state import RequestState


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attn_metadata: AttentionMetadata
    # Rows of the hidden states whose logits are sampled, and their requests.
    logits_indices: torch.Tensor  # [num_sample]
    sample_req_ids: list[str]
    # Per request: (first hidden row, first position, count) of prompt
    # positions that need prompt logprobs this step.
    prompt_logprob_spans: dict[str, tuple[int, int, int]]


def build_step_inputs(
    states: list[RequestState],
    num_scheduled: list[int],
    block_size: int,
    device: torch.device,
) -> StepInputs:
    num_seqs = len(states)
    counts = np.asarray(num_scheduled, dtype=np.int64)
    starts = np.fromiter((s.num_computed_tokens for s in states), dtype=np.int64, count=num_seqs)
    query_start_loc = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(counts, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    seq_lens = starts + counts

    input_ids: list[int] = []
    for state, start, count in zip(states, starts.tolist(), num_scheduled):
        input_ids.extend(state.token_ids[start : start + count])
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

    def to_device(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(device, non_blocking=True)

    metadata = AttentionMetadata(
        slot_mapping=to_device(slot_mapping),
        block_tables=to_device(block_tables),
        query_start_loc=query_start_loc.tolist(),
        seq_lens=seq_lens.tolist(),
        max_query_len=int(counts.max()),
        max_seq_len=int(seq_lens.max()),
    )
    return StepInputs(
        input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
        positions=to_device(positions),
        attn_metadata=metadata,
        logits_indices=torch.tensor(sample_rows, dtype=torch.int64, device=device),
        sample_req_ids=sample_req_ids,
        prompt_logprob_spans=prompt_logprob_spans,
    )
