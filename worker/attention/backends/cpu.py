"""The CPU backend: C++ kernels for decode rows and for prefill rows.

Decode (one new token per sequence) dominates steps and is memory-bound: the
kernel reads K/V blocks in place instead of gathering them. Prefill rows are
compute-bound: one flash-style kernel call attends all of a step's prefill
sequences from the paged cache, cached prefix included (bf16 on CPUs with AMX or
AVX512-BF16, float32 everywhere). Otherwise (bf16 elsewhere, or
PAGODA_CPU_PREFILL_KERNEL=0) torch's fused SDPA does them per sequence (the
prefill's plain twin), straight from the new K/V when the sequence has no cached
context.
Without a compiler, or for head shapes the kernels do not cover, the reference
backend runs instead.

An fp8 cache (--kv-cache-dtype fp8) takes kernels of its own
(paged_attention_fp8.cpp): the cache write quantizes to e4m3 with the layer's
k_scale / v_scale, and one flash-style kernel attends decode and prefill rows
alike, reading e4m3 in place (no cascade: every row reads its whole context).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from kernels.cpu import load_cpu_kernels, load_fp8_kv_kernels
from shared import env
from worker.attention.backends.base import AttentionBackend
from worker.attention.backends.cpu_bound import bind_cpu_layer
from worker.attention.backends.cpu_metadata import (
    CPUAttentionMetadata,
    cascade_prefix_len,
    decode_only_metadata,
    mixed_metadata,
    shared_leading_blocks,
)
from worker.attention.backends.torch_reference import TorchReferenceBackend
from worker.attention.metadata import BatchLayout

__all__ = ["CPUAttentionBackend", "CPUAttentionMetadata", "shared_leading_blocks"]


class CPUAttentionBackend(AttentionBackend):
    name = "cpu"
    extra_kv_dtypes = (torch.float8_e4m3fn,)
    half_kv_under_float32 = True  # the float32 kernels widen bf16/fp16 rows (kv_half.h)

    def __init__(self) -> None:
        self.kernels = load_cpu_kernels()
        self.fp8_kernels = None  # built on the first fp8 forward: most servers never need it
        self.reference = TorchReferenceBackend()
        self.prefill_kernel = env.cpu_prefill_kernel()
        self._supported: dict[tuple[int, int, int], bool] = {}

    def _supports(self, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        """Whether the kernels take this head shape; asked once per shape, not per layer call."""
        shape = (num_heads, num_kv_heads, head_dim)
        if shape not in self._supported:
            self._supported[shape] = self.kernels is not None and self.kernels.supports(*shape)
        return self._supported[shape]

    def bind_layer(self, layer):
        kv_cache = layer.kv_cache
        if kv_cache.dtype == torch.float8_e4m3fn or not self._supports(
            layer.num_heads, layer.num_kv_heads, layer.head_dim
        ):
            return super().bind_layer(layer)
        return bind_cpu_layer(self, layer)

    def device_arrays(self, layout):
        return {"slot_mapping": layout.slot_mapping, "block_tables": layout.block_tables}

    def build_metadata(self, layout: BatchLayout, arrays) -> CPUAttentionMetadata:
        if layout.num_seqs and (np.diff(layout.query_start_loc) == 1).all():
            return decode_only_metadata(layout, arrays)
        return mixed_metadata(layout, arrays)

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
        if kv_cache.dtype == torch.float8_e4m3fn:
            return self._forward_fp8(
                query, key, value, kv_cache, metadata, scale, sliding_window, k_scale, v_scale
            )
        if not self._supports(query.shape[1], key.shape[1], query.shape[2]):
            return self.reference.forward(
                query, key, value, kv_cache, metadata, scale, sliding_window
            )
        key_cache, value_cache = self.split_kv_cache(kv_cache)
        plan: CPUAttentionMetadata = metadata
        self.kernels.write_kv_cache(key, value, key_cache, value_cache, metadata.slot_mapping)
        # query is a view into the fused QKV rows: the kernels take its row stride,
        # which saves a copy per layer (17 us at 32 decode rows).
        out = torch.empty(query.shape, dtype=query.dtype)  # [num_tokens, heads, head_dim]
        if plan.decode_seq_ids:
            self._decode(query, key_cache, value_cache, plan, out, scale, sliding_window)
        if plan.prefills and self._kernel_prefill(query):
            self.kernels.paged_attention_prefill(
                query,
                key_cache,
                value_cache,
                plan.prefill_block_tables,
                plan.prefill_seq_lens,
                plan.prefill_ranges,
                out,
                scale,
                sliding_window or 0,
            )
            return out
        for seq, first, end, seq_len in plan.prefills:
            out[first:end] = self._prefill(
                query[first:end],
                key[first:end],
                value[first:end],
                key_cache,
                value_cache,
                metadata.block_tables[seq],
                seq_len,
                scale,
                sliding_window,
            )
        return out

    def _forward_fp8(
        self, query, key, value, kv_cache, metadata, scale, sliding_window, k_scale, v_scale
    ):
        """An e4m3 cache: its own kernels, or the reference where they cannot run."""
        if self.fp8_kernels is None:
            self.fp8_kernels = load_fp8_kv_kernels() or False
        kernels = self.fp8_kernels
        if (
            not kernels
            or query.dtype not in (torch.float32, torch.bfloat16, torch.float16)
            or not kernels.supports(query.shape[1], key.shape[1], query.shape[2])
        ):
            return self.reference.forward(
                query, key, value, kv_cache, metadata, scale, sliding_window, k_scale, v_scale
            )
        key_cache, value_cache = self.split_kv_cache(kv_cache)
        kernels.write_kv_cache_fp8(
            key, value, key_cache, value_cache, metadata.slot_mapping, k_scale, v_scale
        )
        out = torch.empty(query.shape, dtype=query.dtype)
        kernels.paged_attention_fp8(
            query,
            key_cache,
            value_cache,
            metadata.block_tables,
            metadata.seq_lens_tensor,
            metadata.query_start_tensor,
            out,
            scale,
            k_scale,
            v_scale,
            sliding_window or 0,
        )
        return out

    def _decode(self, query, key_cache, value_cache, plan, out, scale, sliding_window) -> None:
        """Decode rows; where they all share a long enough cached prefix (a cascade),
        the prefix is attended once for all of them and merged into each row."""
        prefix_len = self._cascade_prefix_len(query, key_cache, plan, sliding_window)
        prefix_out = prefix_lse = None
        if prefix_len:
            num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
            rows = len(plan.decode_seq_ids) * (query.shape[1] // num_kv_heads)
            # [kv head, seq * group + g, dim] and [kv head, seq * group + g]
            prefix_out = torch.empty(num_kv_heads, rows, head_dim)
            prefix_lse = torch.empty(num_kv_heads, rows)
            self.kernels.attention_over_prefix(
                query,
                key_cache,
                value_cache,
                plan.decode_block_tables[0],
                prefix_len,
                plan.decode_rows,
                prefix_out,
                prefix_lse,
                scale,
            )
        self.kernels.paged_attention_decode(
            query,
            key_cache,
            value_cache,
            plan.decode_block_tables,
            plan.decode_seq_lens,
            plan.decode_rows,
            out,
            scale,
            sliding_window or 0,
            prefix_len,
            prefix_out,
            prefix_lse,
        )

    def _cascade_prefix_len(self, query, key_cache, plan, sliding_window) -> int:
        """Tokens of the shared prefix to attend as a cascade, or 0 (cpu_metadata's
        cascade_prefix_len, where these layers' kernels take a cascade)."""
        if not plan.cascade_blocks or sliding_window or not self._kernel_prefill(query):
            return 0
        return cascade_prefix_len(plan, key_cache.shape[1])

    def _kernel_prefill(self, query: torch.Tensor) -> bool:
        """Whether prefill rows (and a cascade's prefix) go through the C++ tiles."""
        return self.kernel_prefill_for(query.dtype, query.shape[2])

    def kernel_prefill_for(self, dtype: torch.dtype, head_dim: int) -> bool:
        """Whether the C++ tiles take prefill rows of this query dtype: bf16 (over a
        bf16 cache) where the CPU has AMX or AVX512-BF16, float32 (over a float32,
        bf16 or fp16 cache) on any build."""
        return bool(
            dtype in (torch.bfloat16, torch.float32)
            and self.prefill_kernel
            and self.kernels.prefill_supported(head_dim, dtype == torch.bfloat16)
        )

    @staticmethod
    def _prefill(query, key, value, key_cache, value_cache, block_table, seq_len, scale, window):
        """query/key/value: this sequence's new rows [num_new, heads, head_dim]."""
        num_new = query.shape[0]
        # A cached prefix or earlier chunks, or a half cache under float32 (whose
        # rounded rows are what every later step reads): the context from the cache.
        if seq_len > num_new or key_cache.dtype != query.dtype:
            block_size = key_cache.shape[1]
            blocks = block_table[: -(-seq_len // block_size)].long()
            key = key_cache[blocks].flatten(0, 1)[:seq_len].to(query.dtype)
            value = value_cache[blocks].flatten(0, 1)[:seq_len].to(query.dtype)
        mask = None
        if seq_len > num_new or window is not None:
            q_pos = torch.arange(seq_len - num_new, seq_len).unsqueeze(1)
            k_pos = torch.arange(seq_len).unsqueeze(0)
            mask = k_pos <= q_pos
            if window is not None:
                mask &= q_pos - k_pos < window
        # Torch's fused CPU kernel wants contiguous [1, heads, len, head_dim] inputs
        # with K/V heads repeated; enable_gqa or strided views fall back to a slow path.
        group = query.shape[1] // key.shape[1]
        out = F.scaled_dot_product_attention(
            query.transpose(0, 1).contiguous().unsqueeze(0),
            key.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0),
            value.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
        )
        return out[0].transpose(0, 1)
