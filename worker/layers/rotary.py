"""Rotary position embedding (rotate-half / NeoX layout), with Llama-3 scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch
from torch import nn

from kernels.elementwise import elementwise_kernels


@dataclass(frozen=True)
class RopeSpec:
    theta: float = 10000.0
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(head_dim: int, rope: RopeSpec) -> torch.Tensor:
    """[head_dim // 2] inverse frequencies, computed as Hugging Face does."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type != "llama3":
        return inv_freq
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are stretched by `factor`, short ones kept, the middle blended.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(
        self, head_dim: int, max_position: int, rope: RopeSpec, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv_freq = rope_inv_freq(head_dim, rope)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        # [max_position, head_dim] each; not parameters, never loaded.
        self.register_buffer("cos_cache", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin_cache", emb.sin().to(dtype), persistent=False)
        self._cached_for: torch.Tensor | None = None
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None

    def _lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Every layer of a step passes the same positions tensor: gather once per step.
        if positions is not self._cached_for:
            half = self.head_dim // 2
            # [num_tokens, 1, head_dim // 2]: both halves of the cache are equal.
            cos = self.cos_cache[positions, :half].unsqueeze(1)
            sin = self.sin_cache[positions, :half].unsqueeze(1)
            self._cached_for, self._cos_sin = positions, (cos, sin)
        return self._cos_sin

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query: [num_tokens, num_heads * head_dim], key: [num_tokens, num_kv_heads * head_dim].

        out = x * cos + rotate_half(x) * sin, written per half:
            out1 = x1 * cos - x2 * sin,   out2 = x2 * cos + x1 * sin
        which rounds exactly as the Hugging Face form does.
        """
        kernels = elementwise_kernels(query)
        if kernels is not None and key.dtype == query.dtype:
            # In place: q and k are views of this step's fresh qkv projection.
            kernels.rotary_embedding(
                query, key, positions, self.cos_cache, self.sin_cache, self.head_dim
            )
            return query, key
        cos, sin = self._lookup(positions)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x.view(x.shape[0], -1, self.head_dim)
        x1, x2 = x.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return out.view(x.shape[0], -1)


def get_rope(
    head_dim: int, max_position: int, rope: RopeSpec, dtype: torch.dtype
) -> RotaryEmbedding:
    """One shared instance per configuration and device, so all layers reuse a step's cos/sin."""
    return _shared_rope(head_dim, max_position, rope, dtype, torch.get_default_device())


@cache
def _shared_rope(head_dim, max_position, rope, dtype, device) -> RotaryEmbedding:
    with torch.device(device):
        return RotaryEmbedding(head_dim, max_position, rope, dtype)
