"""The attention layer models use: Hugging Face-shaped in, paged cache inside."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from worker.attention import forward_context
from worker.attention.backends import AttentionBackend

# (query, key, value, metadata) -> [num_tokens, num_heads * head_dim]; q/k/v as
# Attention.forward takes them. Made by AttentionBackend.bind_layer.
LayerAttention = Callable[..., torch.Tensor]


class Attention(nn.Module):
    """Reads the step's metadata from the forward context; the model runner
    binds `kv_cache` and `backend` before the first forward.

    The first forward asks the backend for this layer's attention bound to its
    cache and head shape (`bind_layer`): what is the same for every step (the
    cache's K/V views, shape checks, kernel choice) is then done once, not in
    each of a step's per-layer calls. Rebinding kv_cache or backend drops it.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        # An fp8 KV cache holds K / k_scale, V / v_scale: 1.0 unless the checkpoint
        # carries calibrated scales (worker/models/kv_scales.py).
        self.k_scale = self.v_scale = 1.0
        self._kv_cache: torch.Tensor | None = None  # in the backend's layout
        # The activations' dtype, known at the first forward: the cache's, or float32
        # over a bf16/fp16 cache (worker/runner/kv_memory.py).
        self.query_dtype: torch.dtype | None = None
        self._backend: AttentionBackend | None = None
        self._bound: LayerAttention | None = None

    @property
    def kv_cache(self) -> torch.Tensor | None:
        return self._kv_cache

    @kv_cache.setter
    def kv_cache(self, kv_cache: torch.Tensor | None) -> None:
        self._kv_cache, self._bound = kv_cache, None

    @property
    def backend(self) -> AttentionBackend | None:
        return self._backend

    @backend.setter
    def backend(self, backend: AttentionBackend | None) -> None:
        self._backend, self._bound = backend, None

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """q: [num_tokens, num_heads * head_dim], k/v: [num_tokens, num_kv_heads * head_dim]."""
        bound = self._bound
        if bound is None:
            assert self._kv_cache is not None and self._backend is not None, "KV cache not bound"
            self.query_dtype = query.dtype
            bound = self._bound = self._backend.bind_layer(self)
        metadata = forward_context._current
        assert metadata is not None, "attention layer called outside forward_context()"
        return bound(query, key, value, metadata)
