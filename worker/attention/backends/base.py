"""The interface attention backends implement."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from worker.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    """Writes a step's new K/V into the paged cache and attends over it."""

    name: str

    def prepare(self, metadata: AttentionMetadata) -> Any:
        """Per-step work shared by all layers (partitioning, index tensors); the
        runner stores the result in `metadata.backend_plan`."""
        return None

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """Return [num_tokens, num_heads, head_dim]."""
