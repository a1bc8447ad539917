"""One engine step's batch as the attention layers see it.

The runner describes the flattened batch on the host (`BatchLayout`, numpy);
each backend turns that into its own metadata (`AttentionMetadata` subclasses),
from the device copies of the arrays it asked for, so a backend plugs in
without the runner knowing what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class BatchLayout:
    """num_seqs sequences, num_tokens new tokens in all, on the host.

    Sequence i's new tokens are rows query_start_loc[i]:query_start_loc[i+1] of
    every [num_tokens, ...] tensor; its context after this step holds
    seq_lens[i] tokens, the last query_len of which are new:

        |---------- context_len ----------|-- query_len --|
        |------------------ seq_len ----------------------|
    """

    query_start_loc: np.ndarray  # [num_seqs + 1] int32
    seq_lens: np.ndarray  # [num_seqs] int32
    block_tables: np.ndarray  # [num_seqs, max_num_blocks] int32
    slot_mapping: np.ndarray  # [num_tokens] int64; -1: write nothing (padding)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def max_query_len(self) -> int:
        return int(np.diff(self.query_start_loc).max()) if self.num_seqs else 0

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max()) if self.num_seqs else 0

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    def padded(self, num_seqs: int, max_num_blocks: int) -> BatchLayout:
        """This decode batch padded to num_seqs sequences and a block table
        max_num_blocks wide (a CUDA graph's static shapes). A padded sequence has
        one query row, an empty context (it reads no key) and slot -1."""
        assert self.is_decode_only and num_seqs >= self.num_seqs
        pad = num_seqs - self.num_seqs
        tables = np.zeros((num_seqs, max_num_blocks), dtype=np.int32)
        tables[: self.num_seqs, : self.block_tables.shape[1]] = self.block_tables
        return BatchLayout(
            query_start_loc=np.arange(num_seqs + 1, dtype=np.int32),
            seq_lens=np.concatenate([self.seq_lens, np.zeros(pad, dtype=np.int32)]),
            block_tables=tables,
            slot_mapping=np.concatenate([self.slot_mapping, np.full(pad, -1, dtype=np.int64)]),
        )


@dataclass
class AttentionMetadata:
    """What every backend's metadata carries; backends subclass it."""

    num_tokens: int
    slot_mapping: torch.Tensor  # [num_tokens] int64 on the device, -1: skip
