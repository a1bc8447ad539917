"""Gated activations over a fused gate/up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.elementwise import elementwise_kernels


class SiluAndMul(nn.Module):
    """[num_tokens, 2 * d] (gate | up) -> [num_tokens, d] = silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = elementwise_kernels(x)
        if kernels is not None and x.dim() == 2:
            return kernels.silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
