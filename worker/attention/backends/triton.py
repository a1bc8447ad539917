"""The Triton backend: the GPU default, and selectable on CPU, where the same
kernels run in Triton's interpreter (kernels/triton).

KV cache layout: one tensor per layer, [num_blocks, 2, block_size, num_kv_heads,
head_dim], so a block's K and V sit side by side (vLLM's flash layout); the
kernels take each half by its strides. An fp8 cache (--kv-cache-dtype fp8) is
written and read as e4m3 bytes with per-tensor k/v scales (kernels/triton).

Metadata holds only device tensors and the batch's shape, so a CUDA graph
captured for a shape replays it from static buffers (supports_cuda_graphs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.triton.attention_config import AttentionConfig, choose_config
from worker.attention.backends.base import AttentionBackend
from worker.attention.metadata import AttentionMetadata, BatchLayout

# Programs to keep a GPU busy (a few per SM); fewer, and decode splits its keys.
_PROGRAMS_PER_SM = 2
_CPU_TARGET_PROGRAMS = 8  # the interpreter: small grids, but split-K still exercised


@dataclass
class TritonAttentionMetadata(AttentionMetadata):
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int32
    num_seqs: int
    max_query_len: int


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    supports_cuda_graphs = True
    extra_kv_dtypes = (torch.float8_e4m3fn,)  # e4m3 decoded in the kernels

    def __init__(self, device: torch.device) -> None:
        from kernels.triton import check_device

        check_device(device)
        from kernels.triton import cache_write, paged_attention

        self._write = cache_write.write_kv_cache
        self._attend = paged_attention.paged_attention
        if device.type == "cuda":
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            self.target_programs = sms * _PROGRAMS_PER_SM
        else:
            self.target_programs = _CPU_TARGET_PROGRAMS
        self._configs: dict[tuple, AttentionConfig] = {}

    def kv_cache_shape(self, num_blocks, block_size, num_kv_heads, head_dim):
        return (num_blocks, 2, block_size, num_kv_heads, head_dim)

    def split_kv_cache(self, kv_cache):
        return kv_cache[:, 0], kv_cache[:, 1]

    def device_arrays(self, layout):
        return {
            "slot_mapping": layout.slot_mapping,
            "query_start_loc": layout.query_start_loc,
            "seq_lens": layout.seq_lens,
            "block_tables": layout.block_tables,
        }

    def build_metadata(self, layout: BatchLayout, arrays) -> TritonAttentionMetadata:
        return TritonAttentionMetadata(
            num_tokens=layout.num_tokens,
            slot_mapping=arrays["slot_mapping"],
            query_start_loc=arrays["query_start_loc"],
            seq_lens=arrays["seq_lens"],
            block_tables=arrays["block_tables"],
            num_seqs=layout.num_seqs,
            max_query_len=layout.max_query_len,
        )

    def _config(self, num_heads, num_kv_heads, meta: TritonAttentionMetadata) -> AttentionConfig:
        key = (num_heads, num_kv_heads, meta.num_seqs, meta.max_query_len == 1)
        config = self._configs.get(key)
        if config is None:
            config = choose_config(
                num_heads, num_kv_heads, meta.num_seqs, meta.max_query_len, self.target_programs
            )
            self._configs[key] = config
        return config

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
        if kv_cache.dtype != torch.float8_e4m3fn:  # scales belong to fp8 caches only
            k_scale = v_scale = 1.0
        self._write(key, value, key_cache, value_cache, metadata.slot_mapping, k_scale, v_scale)
        return self._attend(
            query,
            key_cache,
            value_cache,
            metadata.block_tables,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.num_seqs,
            scale,
            sliding_window,
            self._config(query.shape[1], key.shape[1], metadata),
            k_scale=k_scale,
            v_scale=v_scale,
        )
