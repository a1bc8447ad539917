"""The CPU backend's per-step metadata: the decode/prefill partition of a step,
made once for all of its layers (cpu.py, cpu_bound.py read it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from worker.attention.backends.torch_reference import TorchAttentionMetadata
from worker.attention.metadata import BatchLayout

# A cascade pays from 8 decode sequences sharing 128 tokens (measured: 8 x 200
# tokens over a 128-token prefix, 52 -> 39 us per layer; 32 x 560 over 512,
# 449 -> 140 us); with fewer, the per-sequence kernel alone is as fast.
CASCADE_MIN_SEQS = 8
CASCADE_MIN_TOKENS = 128
_NO_RANGES = torch.zeros(0, 2, dtype=torch.int64)  # a step without prefill rows


def shared_leading_blocks(block_tables: torch.Tensor) -> int:
    """How many leading columns of block_tables [num_seqs, max_num_blocks] hold the
    same block in every row (padding included: callers cap by sequence length).

    Compared over a window of columns that grows 8x until a column differs: the
    shared run is short next to the table (max_model_len / block_size columns,
    1024 at SmolLM2's 8192 and blocks of 8). Comparing all of it with torch ops
    took 125-139 us of every step of 8+ decode sequences on a Zen 4 (`decode`
    and `mixed`, timed in the engine), this 38-40."""
    table = block_tables.numpy()
    width = table.shape[1]
    start, end = 0, 1
    while start < width:  # columns [0, start) are equal in every row
        end = min(end, width)
        same = (table[:, start:end] == table[:1, start:end]).all(axis=0)
        if not same.all():
            return start + int(same.argmin())
        start, end = end, end * 8
    return width


def cascade_prefix_len(metadata: CPUAttentionMetadata, block_size: int) -> int:
    """Tokens of the decode rows' shared prefix to attend as a cascade, or 0, for
    layers whose kernels take one (no sliding window, the prefill tiles' dtype and
    head shape: the caller checks). Every sequence keeps at least its newest token
    for the per-sequence part."""
    if not metadata.cascade_blocks:
        return 0
    prefix_len = min(metadata.cascade_blocks * block_size, metadata.decode_min_len - 1)
    return prefix_len if prefix_len >= CASCADE_MIN_TOKENS else 0


@dataclass
class CPUAttentionMetadata(TorchAttentionMetadata):
    """The reference's metadata (the fallback for head shapes the kernels do not
    take) plus the decode/prefill partition, made once per step for all layers."""

    decode_rows: torch.Tensor  # [num_decode] int64, query rows of decode sequences
    decode_block_tables: torch.Tensor  # [num_decode, max_num_blocks] int32
    decode_seq_lens: torch.Tensor  # [num_decode] int32
    decode_seq_ids: list[int]
    prefills: list[tuple[int, int, int, int]]  # (seq index, first row, end row, seq_len)
    prefill_block_tables: torch.Tensor  # [num_prefill, max_num_blocks] int32
    prefill_seq_lens: torch.Tensor  # [num_prefill] int32
    prefill_ranges: torch.Tensor  # [num_prefill, 2] int64, rows [first, end) of each
    # Cascade: leading block-table columns every decode sequence shares (0: too few
    # sequences to bother), and the shortest decode context.
    cascade_blocks: int = 0
    decode_min_len: int = 0
    # The fp8 kernel's view of every sequence: context lengths [num_seqs] int32 and
    # row offsets [num_seqs + 1] int64.
    seq_lens_tensor: torch.Tensor | None = None
    query_start_tensor: torch.Tensor | None = None
    # The step's attention output, shared by all layers of one head shape
    # (cpu_bound.step_output): (num_heads, head_dim, dtype) -> (3-D, 2-D view).
    outputs: dict = field(default_factory=dict)


def decode_only_metadata(layout: BatchLayout, arrays) -> CPUAttentionMetadata:
    """Every sequence has one new row (most steps): the same metadata as
    mixed_metadata's, from the layout's arrays as they are, with no
    per-sequence Python (about half its 26-48 us per step)."""
    num_seqs = layout.num_seqs
    # A copy: the tensors below must not change if the batch's arrays are reused.
    seq_lens = np.array(layout.seq_lens, dtype=np.int32)
    block_tables = arrays["block_tables"]
    decode_tables = block_tables.contiguous()
    lens = torch.from_numpy(seq_lens)
    return CPUAttentionMetadata(
        num_tokens=num_seqs,
        slot_mapping=arrays["slot_mapping"],
        block_tables=block_tables,
        query_start_loc=list(range(num_seqs + 1)),
        seq_lens=seq_lens.tolist(),
        decode_rows=torch.arange(num_seqs, dtype=torch.int64),
        decode_block_tables=decode_tables,
        decode_seq_lens=lens,
        decode_seq_ids=list(range(num_seqs)),
        prefills=[],
        prefill_block_tables=block_tables[:0],
        prefill_seq_lens=lens[:0],
        prefill_ranges=_NO_RANGES,
        cascade_blocks=shared_leading_blocks(decode_tables) if num_seqs >= CASCADE_MIN_SEQS else 0,
        decode_min_len=int(seq_lens.min()),
        seq_lens_tensor=lens,
        query_start_tensor=torch.arange(num_seqs + 1, dtype=torch.int64),
    )


def mixed_metadata(layout: BatchLayout, arrays) -> CPUAttentionMetadata:
    starts = layout.query_start_loc.tolist()
    seq_lens = layout.seq_lens.tolist()
    num_seqs = len(seq_lens)
    block_tables = arrays["block_tables"]
    decode_ids = [i for i in range(num_seqs) if starts[i + 1] - starts[i] == 1]
    prefills = [
        (i, starts[i], starts[i + 1], seq_lens[i])
        for i in range(num_seqs)
        if starts[i + 1] - starts[i] > 1
    ]
    index = torch.tensor(decode_ids, dtype=torch.int64)
    prefill_index = torch.tensor([p[0] for p in prefills], dtype=torch.int64)
    decode_tables = block_tables.index_select(0, index).contiguous()
    decode_lens = [seq_lens[i] for i in decode_ids]
    return CPUAttentionMetadata(
        num_tokens=layout.num_tokens,
        slot_mapping=arrays["slot_mapping"],
        block_tables=block_tables,
        query_start_loc=starts,
        seq_lens=seq_lens,
        decode_rows=torch.tensor([starts[i] for i in decode_ids], dtype=torch.int64),
        decode_block_tables=decode_tables,
        decode_seq_lens=torch.tensor(decode_lens, dtype=torch.int32),
        decode_seq_ids=decode_ids,
        prefills=prefills,
        prefill_block_tables=block_tables.index_select(0, prefill_index).contiguous(),
        prefill_seq_lens=torch.tensor([p[3] for p in prefills], dtype=torch.int32),
        prefill_ranges=torch.tensor([p[1:3] for p in prefills], dtype=torch.int64).view(-1, 2),
        cascade_blocks=shared_leading_blocks(decode_tables)
        if len(decode_ids) >= CASCADE_MIN_SEQS
        else 0,
        decode_min_len=min(decode_lens, default=0),
        seq_lens_tensor=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_tensor=torch.tensor(starts, dtype=torch.int64),
    )
