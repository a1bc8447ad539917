"""The attention layer models use: Hugging Face-shaped in, paged cache inside."""

from __future__ import annotations

import torch
from torch import nn

from worker.attention.backends import AttentionBackend
from worker.attention.forward_context import get_forward_context


class Attention(nn.Module):
    """Reads the step's metadata from the forward context; the model runner
    binds `kv_cache` and `backend` before the first forward."""

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
        self.kv_cache: torch.Tensor | None = None  # in the backend's layout
        self.backend: AttentionBackend | None = None

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """q: [num_tokens, num_heads * head_dim], k/v: [num_tokens, num_kv_heads * head_dim]."""
        assert self.kv_cache is not None and self.backend is not None, "KV cache not bound"
        metadata = get_forward_context()
        num_tokens = query.shape[0]
        out = self.backend.forward(
            query.view(num_tokens, self.num_heads, self.head_dim),
            key.view(num_tokens, self.num_kv_heads, self.head_dim),
            value.view(num_tokens, self.num_kv_heads, self.head_dim),
            self.kv_cache,
            metadata,
            self.scale,
            self.sliding_window,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
        )
        return out.view(num_tokens, self.num_heads * self.head_dim)
