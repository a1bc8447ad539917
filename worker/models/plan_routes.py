"""Which kernels a decode plan's linears bind, per row count (decode_plan.py).

The routes are those the module path takes for the same rows: cpu_packed's for
bf16 panels (the GEMV kernels up to its rows, the panel kernel above) and
cpu_half_f32.half_linear's for float32 over half-stored weights (its GEMV, its
panel GEMM, then oneDNN's float32 copy). Each bound call also carries `native`:
its kernel's C++ entry point and arguments, which the native decode loop
(decode_stack.py) binds instead of the Python call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.cpu import load_cpu_kernels
from worker.layers import cpu_half_f32, cpu_packed
from worker.layers.quantization.unquantized import UnquantizedLinearMethod

# The rows cpu_packed sends to the bf16 GEMV kernels; more go to the panel kernel.
MAX_ROWS = cpu_packed.GEMV_MAX_ROWS

# A linear module -> its call on x [tokens, in] contiguous, for one row range.
Binder = Callable[[object], Callable[[torch.Tensor], torch.Tensor]]


def is_bf16_panel_linear(linear) -> bool:
    return (
        type(linear.quant_method) is UnquantizedLinearMethod
        and getattr(linear, "weight_is_packed", False)
        and linear.weight.dim() == 3  # the panel layout (a 2-D packed one is oneDNN's)
        and linear.weight.dtype == torch.bfloat16
    )


def is_half_f32_linear(linear) -> bool:
    return type(linear.quant_method) is UnquantizedLinearMethod and getattr(
        linear, "weight_is_half_f32", False
    )


def bf16_routes(elementwise) -> list[tuple[int, Binder, Binder]] | None:
    """cpu_packed's routes: the GEMV kernels up to MAX_ROWS rows, the panel kernel above."""
    gemv = cpu_packed._gemv_kernels()
    panel = load_cpu_kernels()
    if gemv is None or panel is None or not panel.bf16_gemm_supported():
        return None
    return [
        (
            MAX_ROWS,
            _binder(gemv.gemv_bf16_linear, gemv.gemv_bf16_linear_fn),
            _binder(gemv.gemv_bf16_linear_silu, gemv.gemv_bf16_linear_silu_fn),
        ),
        (
            torch.iinfo(torch.int64).max,
            _binder(panel.bf16_panel_linear, panel.bf16_panel_linear_fn),
            _binder(panel.bf16_panel_linear_silu, panel.bf16_panel_linear_silu_fn),
        ),
    ]


def half_f32_routes(elementwise) -> list[tuple[int, Binder, Binder]] | None:
    """cpu_half_f32.half_linear's routes: its GEMV, its panel GEMM, then oneDNN's float32
    copy where the layer has one. The gate/up SiLU is fused into the panel GEMM
    (half_panel_linear_silu) and elsewhere the activation kernel after the linear,
    as the module path (half_linear_silu, else SiluAndMul) runs it."""
    gemv = cpu_half_f32._gemv_kernels()
    gemm = cpu_half_f32.load_half_f32_kernels()  # what half_linear calls
    if gemv is None or gemm is None:
        return None
    silu_and_mul = elementwise.silu_and_mul

    def with_silu(bind: Binder) -> Binder:
        def bind_silu(linear):
            call = bind(linear)

            def call_silu(x):
                return silu_and_mul(call(x))

            native = getattr(call, "native", None)
            if native is not None:  # the same kernel, then silu_and_mul
                call_silu.native = (*native[:3], True)
            return call_silu

        return bind_silu

    gemv_linear = _binder(gemv.gemv_half_f32_linear, gemv.gemv_half_f32_linear_fn)
    panel = _binder(gemm.half_panel_linear, gemm.half_panel_linear_fn)
    panel_silu = _binder(gemm.half_panel_linear_silu, gemm.half_panel_linear_silu_fn)

    def copy_or_gemm(linear):
        if linear.weight_f32 is None:
            return panel(linear)
        weight, bias, kernel = linear.weight_f32, linear.bias, cpu_packed.packed_linear
        return lambda x: kernel(x, weight, bias)  # oneDNN's: no native entry

    def copy_or_gemm_silu(linear):
        return panel_silu(linear) if linear.weight_f32 is None else with_silu(copy_or_gemm)(linear)

    return [
        (cpu_half_f32._GEMV_MAX_ROWS, gemv_linear, with_silu(gemv_linear)),
        (cpu_half_f32._GEMM_MAX_ROWS, panel, panel_silu),
        (torch.iinfo(torch.int64).max, copy_or_gemm, copy_or_gemm_silu),
    ]


def _binder(kernel, native_fn) -> Binder:
    """kernel(x, packed, bias) bound to a linear's own weight and bias; the call
    carries `native` = (native_fn, packed, bias, False), what the native decode loop
    binds (kernel's C++ entry point capsule, linear_fn.h; no SiLU after it)."""

    def bind(linear):
        packed, bias = linear.weight, linear.bias

        def call(x):
            return kernel(x, packed, bias)

        call.native = (native_fn, packed, bias, False)
        return call

    return bind
