"""What the attention layers need to know about one engine step's batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    """The flattened batch: num_seqs sequences, num_tokens new tokens in all.

    Sequence i's new tokens are rows query_start_loc[i]:query_start_loc[i+1]
    of every [num_tokens, ...] tensor; its context after this step holds
    seq_lens[i] tokens, the last (query_start_loc[i+1] - query_start_loc[i])
    of which are new.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64, where each new token's K/V goes
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int32
    query_start_loc: list[int]  # num_seqs + 1
    seq_lens: list[int]  # num_seqs
    max_query_len: int
    max_seq_len: int
    backend_plan: Any = None  # what the backend's prepare() derived for this step

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
