"""The reference backend: plain PyTorch, one sequence at a time."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.paged_attention_reference import paged_attention_reference, write_kv_reference
from worker.attention.backends.base import AttentionBackend
from worker.attention.metadata import AttentionMetadata, BatchLayout


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int32, on the device
    query_start_loc: list[int]  # num_seqs + 1, on the host: the loop over sequences
    seq_lens: list[int]  # num_seqs


class TorchReferenceBackend(AttentionBackend):
    name = "torch"
    extra_kv_dtypes = (torch.float8_e4m3fn,)
    half_kv_under_float32 = True

    def device_arrays(self, layout):
        return {"slot_mapping": layout.slot_mapping, "block_tables": layout.block_tables}

    def build_metadata(self, layout: BatchLayout, arrays) -> TorchAttentionMetadata:
        return TorchAttentionMetadata(
            num_tokens=layout.num_tokens,
            slot_mapping=arrays["slot_mapping"],
            block_tables=arrays["block_tables"],
            query_start_loc=layout.query_start_loc.tolist(),
            seq_lens=layout.seq_lens.tolist(),
        )

    def forward(
        self,
        query,
        key,
        value,
        kv_cache,
        metadata,
        scale,
        sliding_window,
        k_scale=1.0,
        v_scale=1.0,
    ):
        key_cache, value_cache = self.split_kv_cache(kv_cache)
        if kv_cache.dtype not in self.extra_kv_dtypes:  # the model's dtype: no scales
            k_scale = v_scale = 1.0
        write_kv_reference(
            key, value, key_cache, value_cache, metadata.slot_mapping, k_scale, v_scale
        )
        return paged_attention_reference(
            query,
            key_cache,
            value_cache,
            metadata.block_tables,
            metadata.query_start_loc,
            metadata.seq_lens,
            scale,
            sliding_window,
            k_scale,
            v_scale,
        )
