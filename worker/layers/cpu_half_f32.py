"""Float32 linears with half-precision weight storage, on CPUs without fast bf16.

Where the CPU has no native bf16 arithmetic (AVX2-only x86: EPYC Rome/Milan,
older Xeons) the engine computes in float32 (worker/runner/platform.py). A bf16
or fp16 checkpoint's weights are then widened to float32 at load, which doubles
the bytes every decode step streams from memory. Instead, a float32 weight
whose every value is exactly a bf16 (or an fp16) value is stored back in that
half dtype, packed into gemm_half_f32.cpp's [N / 16, K, 16] panels, and widened
to float32 in registers inside the multiply: the same products and sums in
float32, so greedy output does not change, with half the weight bytes. A float32
checkpoint's weights are not exact halves and stay in float32 (oneDNN's path,
worker/layers/cpu_packed.py).

By rows (half_linear): 1-8 (decode at low concurrency) through the GEMV
(kernels/cpu/gemv_f32.cpp), which streams the bf16 panels at 82-91% of a plain
read at one row; more (batched decode, prefill) through gemm_half_f32.cpp, or
above 128 rows through oneDNN's float32 copy (float32_copy) where
PAGODA_CPU_HALF_WEIGHTS=copy (not the default: see below). A decode step's
linears read their weights from DRAM: there the half GEMM, reading half the
bytes and prefetching its next panel, took 0.46-0.91x oneDNN's time at 9-128
rows (84-90% of the FMA peak on the layers' linears at 36 rows, oneDNN 57-68%),
and 1.04-1.14x at 256-1024, where both are compute-bound at ~75-87% of the
peak (emulated AVX2 on a Zen 4, 2 threads, bench/avx2_small_m_ab.py).
One-row figures (emulated AVX2 on a Zen 5, one thread, bench/results/avx2-gemv/):
SmolLM2's linears 9.1 ms (GEMV) vs 24.4 ms (oneDNN float32).
On a real Zen 3 (2 threads, cold) the half GEMM also beats the copy at prefill
sizes: layers' linears 0.87x its time at 256 rows, 0.84x at 1024 (best per call),
and the engine's offline `prefill` is level (throughput 1.02x, median of 7
pairs). The copy costs memory: the half panels on top of the float32 weights,
1.5x the float32 linears (SmolLM2-135M: 920 MB against 651 MB for float32
storage and 382 MB for `1`, the default, which keeps the half panels alone).
So where asked for, the copy is taken only
while it leaves a quarter of the machine's memory available (_COPY_RESERVE): a
model that fits in float32 alone must not stop fitting because of it, and past
that point layers keep their half panels alone. The plain twin is
F.linear(x, weight.float(), bias).
"""

from __future__ import annotations

import functools

import torch

from kernels.cpu import load_gemv_f32_kernels, load_half_f32_kernels
from shared import env
from shared.logging import get_logger
from worker.huge_pages import place_weight
from worker.layers import cpu_packed
from worker.meminfo import meminfo as _meminfo

logger = get_logger(__name__)

_PANEL = 16
# The share of MemTotal a float32 copy must leave available (MemAvailable after it).
_COPY_RESERVE = 0.25


@functools.cache
def _kernels():
    """The kernels where this CPU lacks fast bf16 and the build has AVX2+FMA+F16C."""
    from worker.runner.platform import cpu_has_fast_bf16

    if not env.cpu_half_weights() or cpu_has_fast_bf16():
        return None
    kernels = load_half_f32_kernels()
    return kernels if kernels is not None and kernels.half_f32_supported() else None


@functools.cache
def _gemv_kernels():
    """The 1-8 row GEMV over the same panels, where its build has AVX2+FMA+F16C."""
    kernels = load_gemv_f32_kernels()
    return kernels if kernels is not None and kernels.gemv_f32_supported() else None


_GEMV_MAX_ROWS = 8
# Up to here the half GEMM beats oneDNN's float32 copy (half the bytes from DRAM);
# above it both are compute-bound and a copy (PAGODA_CPU_HALF_WEIGHTS=copy) may take
# those rows: oneDNN won there by 4-14% on an emulated Zen 4, while on a real Zen 3
# the half GEMM took 0.84-0.87x oneDNN's time (so `1` is the default).
_GEMM_MAX_ROWS = 128


def exact_half_dtype(weight: torch.Tensor) -> torch.dtype | None:
    """bf16 or fp16 when every value of float32 `weight` is exactly one of that
    dtype (a half checkpoint loaded into float32), else None."""
    for dtype in (torch.bfloat16, torch.float16):
        if torch.equal(weight.to(dtype).float(), weight):
            return dtype
    return None


def pack_if_lossless(weight: torch.Tensor) -> torch.Tensor | None:
    """The half panels of a float32 CPU weight [N, K] that loses nothing in half
    precision, where the kernels apply here; else None (keep the weight as it is)."""
    if (
        weight.device.type != "cpu"
        or weight.dtype != torch.float32
        or weight.dim() != 2
        or weight.shape[0] % _PANEL
    ):
        return None
    kernels = _kernels()
    if kernels is None:
        return None
    dtype = exact_half_dtype(weight)
    if dtype is None:
        return None
    _gemv_kernels()  # built now, at load, not at the first decode step
    return place_weight(kernels.pack_half_panels(weight.to(dtype)))


def float32_copy(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's packed float32 copy of float32 `weight` [N, K], kept beside its
    half panels for more than 128 rows where PAGODA_CPU_HALF_WEIGHTS=copy; else None.
    NOTE: call it only for a weight pack_if_lossless packed."""
    if not env.cpu_half_weights_copy() or not cpu_packed.can_pack(weight):
        return None
    total, available = _meminfo()
    if available - weight.numel() * weight.element_size() < _COPY_RESERVE * total:
        _warn_no_copy(total, available)
        return None
    return cpu_packed.pack(weight)


@functools.cache
def _warn_no_copy(total: int, available: int) -> None:
    logger.warning(
        "half-stored float32 linears: no float32 copy from here on (%.1f of %.1f GiB "
        "available; a copy must leave %d%%): batches of more than %d rows take the "
        "half GEMM, as with PAGODA_CPU_HALF_WEIGHTS=1",
        available / 2**30,
        total / 2**30,
        round(_COPY_RESERVE * 100),
        _GEMM_MAX_ROWS,
    )


def half_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    f32: torch.Tensor | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., K] float32 and packed half panels:
    1-8 rows through the GEMV, 9-128 through the panel GEMM, more through `f32`
    (float32_copy's) where given, else the panel GEMM."""
    gemv = _gemv_for(x)
    if gemv is not None:
        return cpu_packed._over_rows(gemv.gemv_half_f32_linear, x, packed, bias)
    if _copy_takes(x, f32):
        return cpu_packed.packed_linear(x, f32, bias)
    return cpu_packed._over_rows(load_half_f32_kernels().half_panel_linear, x, packed, bias)


def half_linear_silu(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    f32: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """silu(gate) * up for packed [gate; up] half panels in one pass: [..., K] ->
    [..., N / 2], bit for bit half_linear then silu_and_mul (the [tokens, N]
    float32 product is never written). None where half_linear would not use
    the panel GEMM (1-8 rows: the GEMV; more than 128 with a float32 copy) or
    gate and up do not split at a panel."""
    if _gemv_for(x) is not None or _copy_takes(x, f32) or packed.shape[0] % 2:
        return None
    return cpu_packed._over_rows(load_half_f32_kernels().half_panel_linear_silu, x, packed, bias)


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _gemv_for(x: torch.Tensor):
    """The GEMV kernels for x of 1-8 rows, else None."""
    return _gemv_kernels() if 1 <= _rows(x) <= _GEMV_MAX_ROWS else None


def _copy_takes(x: torch.Tensor, f32: torch.Tensor | None) -> bool:
    """Whether oneDNN's float32 copy takes x's rows (more than 128, where kept)."""
    return f32 is not None and _rows(x) > _GEMM_MAX_ROWS
