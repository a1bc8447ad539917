"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch
from torch import nn

from kernels.elementwise import elementwise_kernels


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, params_dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(
            torch.ones(hidden_size, dtype=params_dtype or torch.get_default_dtype()),
            requires_grad=False,
        )

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Same op order as Hugging Face, so float32 results match bit for bit.
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual).

        One kernel pass does it where one exists (C++ on CPU, Triton on CUDA; kernels/
        elementwise.py), updating `residual` in place."""
        kernels = elementwise_kernels(x)
        if kernels is not None and x.dim() == 2:  # [rows, hidden]: no reshapes
            if residual is None:
                return kernels.rms_norm(x, self.weight, self.eps)
            return kernels.add_rms_norm(x, residual, self.weight, self.eps), residual
        if kernels is not None:
            shape = x.shape
            x2d = x.reshape(-1, shape[-1])  # [rows, hidden]
            if residual is None:
                return kernels.rms_norm(x2d, self.weight, self.eps).view(shape)
            out = kernels.add_rms_norm(x2d, residual.view(-1, shape[-1]), self.weight, self.eps)
            return out.view(shape), residual
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
