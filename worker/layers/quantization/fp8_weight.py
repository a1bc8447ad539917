"""FP8 (e4m3) weight-only linears: the form fp8, compressed-tensors
float-quantized and FP8 at load repack into.

    weight  [out, in]                      float8_e4m3fn
    scales  [out, 1]                       float32, per output row, or
            [out / block, in / block_in]   per block (weight_block_size)

w = weight * scale. The activations stay in the model dtype (the checkpoint's
input scales, for FP8 activations on GPUs, are read and dropped): this is the
W8A16 path. No CPU has FP8 arithmetic: with bf16 activations on AVX512-BF16
the codes become bf16 in registers (kernels/cpu/gemm_weight_only.cpp), else
`apply` is the twin: dequantize to the activation dtype, then `F.linear`.
On CUDA the Triton FP8 GEMM (kernels/triton/weight_only_gemm.py) reads the
e4m3 weight and its row or block scales as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu import load_weight_only_kernels
from shared import env
from worker.layers.quantization.base import replace_params
from worker.layers.quantization.int_weight import byte_panels_fit

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


def quantize_fp8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [out, in] -> (fp8 [out, in], scales [out, 1] float32): max|w| / 448 per row."""
    w = weight.to(torch.float32)
    scales = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (w / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8), scales


def expand_block_scales(scales: torch.Tensor, block: tuple[int, int], shape) -> torch.Tensor:
    """[ceil(out / bo), ceil(in / bi)] -> [out, in], each block's scale over its cells."""
    rows = scales.repeat_interleave(block[0], dim=0)[: shape[0]]
    return rows.repeat_interleave(block[1], dim=1)[:, : shape[1]]


def dequantize_fp8(weight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, block=None):
    """The twin's W [out, in] in `dtype`."""
    if block is not None:
        scales = expand_block_scales(scales, block, weight.shape)
    if dtype == torch.float32:
        return weight.to(torch.float32) * scales
    return weight.to(dtype) * scales.to(dtype)


def set_fp8_weight(
    layer: nn.Module,
    drop: list[str],
    weight: torch.Tensor,
    scales: torch.Tensor,
    act_dtype: torch.dtype,
    block: tuple[int, int] | None = None,
    use_kernel: bool | None = None,
    triton: bool | None = None,
) -> None:
    """Replace the checkpoint-format parameters `drop` by (weight, scales): in
    the byte panels of kernels/cpu/gemm_weight_only.cpp where it runs them
    (per-row scales, bf16 activations, a CPU with AVX512-BF16), else as they
    are for the twin, which the Triton FP8 GEMM reads on CUDA. `use_kernel` and
    `triton` force a choice (tests: `triton` on CPU runs it interpreted)."""
    weight = weight.to(FP8).contiguous()
    if triton is None:
        triton = weight.device.type == "cuda" and _triton_fp8_fits(
            tuple(weight.shape), scales, block
        )
    if triton:
        use_kernel = False
    if use_kernel is None:
        use_kernel = (
            block is None
            and weight.device.type == "cpu"
            and env.cpu_quantized_kernels()
            and byte_panels_fit(tuple(weight.shape), act_dtype)
        )
    if use_kernel:
        weight = load_weight_only_kernels().pack_byte_panels(weight)  # [out / 32, in / 2, 64]
        scales = scales.reshape(-1)  # [out]
    replace_params(layer, drop, fp8_weight=weight, fp8_scales=scales.to(torch.float32).contiguous())
    layer.fp8_block, layer.fp8_kernel, layer.fp8_triton = block, use_kernel, triton


def _triton_fp8_fits(shape, scales: torch.Tensor, block: tuple[int, int] | None) -> bool:
    """Whether the Triton FP8 GEMM takes these scales for a weight of `shape`: per
    row, or one per block whose width is a multiple of 16 inputs (a whole K tile)."""
    from kernels.triton import triton_available

    if not triton_available() or scales.dim() != 2:
        return False
    if block is None:
        return tuple(scales.shape) == (shape[0], 1)
    grid = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    return block[1] % 16 == 0 and tuple(scales.shape) == grid


def apply_fp8_weight(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None):
    """x: [num_tokens, in] -> [num_tokens, out]."""
    if layer.fp8_triton:
        from kernels.triton.weight_only_gemm import fp8_gemm

        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = fp8_gemm(x2, layer.fp8_weight, layer.fp8_scales, layer.fp8_block, bias)
        return out.view(*x.shape[:-1], out.shape[-1])
    if layer.fp8_kernel:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = load_weight_only_kernels().weight_only_linear(
            x2, layer.fp8_weight, layer.fp8_scales, bias, fp8=True
        )
        return out.view(*x.shape[:-1], out.shape[-1])
    weight = dequantize_fp8(layer.fp8_weight, layer.fp8_scales, x.dtype, layer.fp8_block)
    return F.linear(x, weight, bias)
