"""Which fused elementwise kernels a tensor goes through: the C++ ones for CPU
tensors (kernels/cpu), the Triton ones for CUDA tensors (kernels/triton); None
means the layer's plain-PyTorch twin. Both families share one calling contract
(rms_norm, add_rms_norm, silu_and_mul, rotary_embedding)."""

from __future__ import annotations

from types import ModuleType

import torch

from kernels.cpu import fused_elementwise_kernels

_TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def elementwise_kernels(x: torch.Tensor) -> ModuleType | None:
    # x.is_cuda, not x.device.type: a norm, RoPE or activation asks on every call,
    # and x.device makes a device object each time (0.25 us, 90 times a step).
    if x.is_cuda:
        from kernels.triton import triton_available

        if x.dtype not in _TRITON_DTYPES or not triton_available():
            return None
        from kernels.triton import elementwise

        return elementwise
    return fused_elementwise_kernels(x)
