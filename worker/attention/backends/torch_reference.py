"""The reference backend: plain PyTorch, one sequence at a time."""

from __future__ import annotations

from kernels.paged_attention_reference import paged_attention_reference, write_kv_reference
from worker.attention.backends.base import AttentionBackend


class TorchReferenceBackend(AttentionBackend):
    name = "torch"

    def forward(self, query, key, value, key_cache, value_cache, metadata, scale, sliding_window):
        write_kv_reference(key, value, key_cache, value_cache, metadata.slot_mapping)
        return paged_attention_reference(
            query,
            key_cache,
            value_cache,
            metadata.block_tables,
            metadata.query_start_loc,
            metadata.seq_lens,
            scale,
            sliding_window,
        )
