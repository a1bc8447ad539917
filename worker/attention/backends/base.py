"""The interface attention backends implement.

A backend owns three things the runner does not know about:
* its KV cache layout (`kv_cache_shape`, `split_kv_cache`): the runner
  allocates one tensor per layer of the shape the backend asks for;
* its metadata: `device_arrays` names the host arrays it needs on the device
  (they travel in the step's one host-to-device copy), `build_metadata` makes
  its metadata from their device copies;
* the attention itself (`forward`), which also writes the new K/V.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np
import torch

from worker.attention.metadata import AttentionMetadata, BatchLayout

if TYPE_CHECKING:
    from worker.layers.attention import Attention, LayerAttention


# The cache dtypes a float32 model may keep its K/V in where the backend allows it
# (`half_kv_under_float32`).
HALF_KV_DTYPES = (torch.bfloat16, torch.float16)


class AttentionBackend(ABC):
    name: str
    # Whether forward() reads nothing from the host, so a CUDA graph can replay it
    # from static buffers (its metadata built only from device arrays and shapes).
    supports_cuda_graphs: bool = False
    # Cache dtypes other than the model's this backend reads and writes (fp8).
    extra_kv_dtypes: tuple[torch.dtype, ...] = ()
    # Whether a float32 model's K/V may be stored in bf16/fp16 (rounded as written,
    # widened as read).
    half_kv_under_float32: bool = False

    def supports_kv_dtype(self, kv_dtype: torch.dtype, dtype: torch.dtype) -> bool:
        """Whether this backend serves a model computing in `dtype` over a `kv_dtype` cache."""
        if kv_dtype == dtype or kv_dtype in self.extra_kv_dtypes:
            return True
        return self.half_kv_under_float32 and dtype == torch.float32 and kv_dtype in HALF_KV_DTYPES

    def kv_cache_shape(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        """One layer's KV cache; by default K and V pools side by side,
        [2, num_blocks, block_size, num_kv_heads, head_dim]."""
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    def split_kv_cache(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(key_cache, value_cache), each [num_blocks, block_size, num_kv_heads,
        head_dim] by its strides."""
        return kv_cache[0], kv_cache[1]

    def device_arrays(self, layout: BatchLayout) -> dict[str, np.ndarray]:
        """The host arrays this backend reads on the device (in this order)."""
        return {"slot_mapping": layout.slot_mapping}

    @abstractmethod
    def build_metadata(
        self, layout: BatchLayout, arrays: dict[str, torch.Tensor]
    ) -> AttentionMetadata:
        """This step's metadata; `arrays` are the device copies of device_arrays()."""

    def bind_layer(self, layer: Attention) -> LayerAttention:
        """`layer`'s attention over its bound kv_cache, called once per layer per
        step with 2-D q [num_tokens, num_heads * head_dim], k/v [num_tokens,
        num_kv_heads * head_dim] and the step's metadata; returns [num_tokens,
        num_heads * head_dim]. Backends override it to do per-layer constant work
        (cache views, checks) once, at the first forward, instead of per call."""

        def attend(query, key, value, metadata):
            num_tokens = query.shape[0]
            out = self.forward(
                query.view(num_tokens, layer.num_heads, layer.head_dim),
                key.view(num_tokens, layer.num_kv_heads, layer.head_dim),
                value.view(num_tokens, layer.num_kv_heads, layer.head_dim),
                layer.kv_cache,
                metadata,
                layer.scale,
                layer.sliding_window,
                k_scale=layer.k_scale,
                v_scale=layer.v_scale,
            )
            return out.view(num_tokens, layer.num_heads * layer.head_dim)

        return attend

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # this layer's, of kv_cache_shape()
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> torch.Tensor:
        """Write the new K/V into the cache, return [num_tokens, num_heads, head_dim].
        k_scale / v_scale: an fp8 cache's per-tensor scales (it stores K / k_scale);
        caches in the model's dtype ignore them."""
