"""Dense bf16 and float32 weights on CPU, reordered once into oneDNN's blocked layout.

`F.linear` on a plain [out, in] bf16 weight lets oneDNN reorder the weight
for its micro-kernel on every call; at decode batch sizes that reorder costs
as much as the multiply. Packing at load time moves it out of the step
(measured: 1.2-1.5x per linear at 16 rows, 1.1-1.3x at 64, on AVX512-BF16).
float32 goes through MKL's sgemm in `F.linear`, which on an AVX2 EPYC ran
10-40% slower than packed oneDNN from 8 to 2048 rows and at half its speed on
the 49152-row LM head (it is vLLM's CPU path for both dtypes too).
The plain twin is `F.linear` on the unpacked weight, used everywhere else
(GPU, half precision, builds of torch without oneDNN, and CPUs oneDNN has no
bf16 kernels for).
"""

from __future__ import annotations

import functools

import torch

from shared import env

# oneDNN picks the blocked layout for this many rows; the packed weight still
# takes any number of rows (and gives the same results).
_PACK_ROWS_HINT = 64


def can_pack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dim() == 2
        and env.cpu_packed_linear()
        and _onednn_linear_available()
        and (
            weight.dtype == torch.float32
            or (weight.dtype == torch.bfloat16 and _cpu_can_pack_bf16())
        )
    )


def _onednn_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def _cpu_can_pack_bf16() -> bool:
    """oneDNN packs bf16 only where the CPU converts bf16 natively (AVX-512
    BW/VL/DQ or AVX-NE-CONVERT); elsewhere, on AVX2-only CPUs, the reorder
    raises. Ask it once with a tiny weight rather than mirror its CPU checks."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] strided -> [out, in] in oneDNN's opaque layout (same bytes count)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACK_ROWS_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x: [..., in] -> [..., out], as F.linear(x, weight, bias)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
