"""Dense bf16 and float32 weights on CPU, reordered once at load for the CPU's
fastest linear: Pagoda's bf16 panel kernel where the CPU has AVX512-BF16 or AMX
(kernels/cpu/gemm_bf16.cpp: 10-17% faster than oneDNN at 32-64 rows on a Zen 5,
2.4x with AMX on a Xeon; level from 512 up), oneDNN's blocked layout otherwise.

`F.linear` on a plain [out, in] bf16 weight lets oneDNN reorder the weight
for its micro-kernel on every call; at decode batch sizes that reorder costs
as much as the multiply. Packing at load time moves it out of the step
(measured: 1.2-1.5x per linear at 16 rows, 1.1-1.3x at 64, on AVX512-BF16).
float32 goes through MKL's sgemm in `F.linear`, which on an AVX2 EPYC ran
10-40% slower than packed oneDNN from 8 to 2048 rows and at half its speed on
the 49152-row LM head (vLLM 0.32's CPU linears prepack for oneDNN too,
`onednn_mm`).
The plain twin is `F.linear` on the unpacked weight, used everywhere else
(GPU, half precision, builds of torch without oneDNN, and CPUs oneDNN has no
bf16 kernels for).
"""

from __future__ import annotations

import functools

import torch

from kernels.cpu import load_cpu_kernels, load_gemv_kernels
from shared import env
from worker.huge_pages import place_weight

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


def _panel_kernels(weight: torch.Tensor):
    """The C++ kernels when `weight` fits the bf16 panel kernel here, else None."""
    if weight.dtype != torch.bfloat16 or not env.cpu_bf16_gemm():
        return None
    if weight.shape[0] % 32 or weight.shape[1] % 2:
        return None
    kernels = load_cpu_kernels()
    return kernels if kernels is not None and kernels.bf16_gemm_supported() else None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] strided -> the panel kernel's [out / 32, in / 2, 64] where it
    applies (placed in huge pages), else [out, in] in oneDNN's opaque layout
    (same bytes count either way)."""
    kernels = _panel_kernels(weight)
    if kernels is not None:
        _gemv_kernels()  # built now, at load, not at the first decode step
        return place_weight(kernels.pack_bf16_panels(weight))
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACK_ROWS_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x: [..., in] -> [..., out], as F.linear(x, weight, bias). A 3-D `packed`
    is the panel layout (pack() made it so), a 2-D one oneDNN's."""
    if packed.dim() == 3:
        gemv = _gemv_for(x)
        if gemv is not None:
            return _over_rows(gemv.gemv_bf16_linear, x, packed, bias)
        return _over_rows(load_cpu_kernels().bf16_panel_linear, x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def packed_linear_silu(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor | None:
    """silu(gate) * up for a packed [gate; up] weight in one pass: [..., in] ->
    [..., out / 2], bit for bit packed_linear then silu_and_mul. The [tokens, out]
    product is never written: 6% of `prefill`'s time went to that round trip.
    None for oneDNN's layout, or where gate and up do not split at a panel."""
    if packed.dim() != 3 or packed.shape[0] % 2:
        return None
    gemv = _gemv_for(x)
    if gemv is not None:
        return _over_rows(gemv.gemv_bf16_linear_silu, x, packed, bias)
    return _over_rows(load_cpu_kernels().bf16_panel_linear_silu, x, packed, bias)


def _gemv_for(x: torch.Tensor):
    """The GEMV kernels (kernels/cpu/gemv_bf16.cpp) for x of 1-6 rows, else None.
    It reads the same panels as the panel kernel, with the same sums (bit for
    bit), faster with the weights streaming from DRAM (SmolLM2's on a Zen 5,
    bench/gemv_ab.py: 2 threads, 48-53 -> 52-68 GB/s per linear at one row; one
    thread, a step's linears 0.80-0.90x the time at 1-4 rows; bench/small_m_ab.py:
    0.85x at 5-6 rows)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not 1 <= rows <= GEMV_MAX_ROWS:
        return None
    return _gemv_kernels()


GEMV_MAX_ROWS = 6


@functools.cache
def _gemv_kernels():
    # Panels exist only where PAGODA_CPU_BF16_GEMM allowed them at load.
    kernels = load_gemv_kernels()
    return kernels if kernels is not None and kernels.gemv_bf16_supported() else None


def _over_rows(kernel, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None):
    """A panel kernel over x's rows: [..., in] -> [..., out]. The model's own calls
    pass [tokens, in] contiguous and skip the reshapes (each ~3 us of dispatch)."""
    if x.dim() == 2 and x.is_contiguous():
        return kernel(x, packed, bias)
    out = kernel(x.reshape(-1, x.shape[-1]).contiguous(), packed, bias)  # [tokens, in]
    return out.view(*x.shape[:-1], out.shape[-1])
