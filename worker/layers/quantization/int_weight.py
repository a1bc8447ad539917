"""Integer weight-only linears: the one form every integer format repacks into.

GPTQ, AWQ, compressed-tensors pack-quantized and int8/int4 on the fly differ
only in how their codes lie on disk. After loading, each hands
`set_int_weight` the same thing:

    codes   [out, in]      integers in [0, 2**bits)
    scales  [out, groups]  float
    zeros   [out, groups]  float, in code units (w = (code - zero) * scale)
    g_idx   [in]           the group of each input feature (None: in // group_size)

and the layer keeps it in the form the kernel chosen for its shape reads:

* `int8panel`: Pagoda's AVX512-BF16 weight-only linear (kernels/cpu/
  gemm_weight_only.cpp), for 8-bit symmetric per-row codes with bf16
  activations: the codes in the bf16 panel layout at a byte each;
* `int4panel`: the same kernel file's 4-bit linear, for 4-bit codes in groups
  that are runs of inputs (act-order ones once sorted) with bf16 activations:
  nibbles in the panel layout, each group summed apart and scaled once;
* `int8pack`: torch's `_weight_int8pack_mm` (int8 [out, in] x per-output scale),
  for 8-bit codes with one group per row and the zero at 128 (symmetric);
* `int4pack`: torch's `_weight_int4pack_mm_for_cpu` (its own packed layout,
  scales and zeros per group of 32-256 inputs), for 4-bit codes whose groups
  are contiguous once the inputs are sorted by group (act-order GPTQ sorts x's
  features by the same permutation each call);
* `triton_int4`: kernels/triton/weight_only_gemm.py's int4 GEMM, the choice on
  CUDA for 4-bit codes in contiguous groups of a multiple of 16 inputs:
  `pack_nibbles` bytes [out, in / 2], float32 scales and zeros [out, groups]
  (forced on CPU tensors, it runs in Triton's interpreter: the tests);
* `dequant`: the plain twin, codes packed into bytes and dequantized to the
  activation dtype each call, then `F.linear`; any shape, any device.

`dequantize` is the oracle the kernels are tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu import load_weight_only_kernels
from shared import env
from worker.layers.quantization.base import replace_params

INT4_GROUP_SIZES = (256, 128, 64, 32)


def byte_panels_fit(shape: tuple[int, int], act_dtype: torch.dtype) -> bool:
    """Whether kernels/cpu/gemm_weight_only.cpp runs an 8-bit weight of this
    [out, in] shape: bf16 activations, out % 32 == 0, even in, AVX512-BF16."""
    if act_dtype != torch.bfloat16 or shape[0] % 32 or shape[1] % 2:
        return False
    kernels = load_weight_only_kernels()
    return kernels is not None and kernels.supported()


def dequantize(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """codes [out, in], scales/zeros [out, groups], g_idx [in] -> W [out, in]."""
    s, z = scales[:, g_idx].to(torch.float32), zeros[:, g_idx].to(torch.float32)
    return ((codes.to(torch.float32) - z) * s).to(dtype)


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words holding 32 / bits codes each, the first in the lowest bits,
    along `dim` -> the codes as int32, `dim` 32 / bits times longer."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=packed.device)
    dim = dim % packed.dim()
    words = packed.unsqueeze(dim + 1)  # the codes of each word go in a new dim beside it
    view = [1] * words.dim()
    view[dim + 1] = -1
    codes = (words >> shifts.view(view)) & ((1 << bits) - 1)
    shape = list(packed.shape)
    shape[dim] *= 32 // bits
    return codes.reshape(shape)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[out, in] codes in [0, 16) -> [out, in / 2] uint8, even inputs in the low nibble."""
    pairs = codes.to(torch.uint8).view(codes.shape[0], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """pack_nibbles' inverse: [out, in / 2] uint8 -> [out, in] uint8."""
    return torch.stack([packed & 15, packed >> 4], dim=-1).view(packed.shape[0], -1)


def _contiguous_groups(g_idx: torch.Tensor, num_groups: int) -> tuple[torch.Tensor | None, int]:
    """(input permutation or None, group size) when sorting the inputs by group
    leaves every group one run of equal length; (None, 0) otherwise."""
    in_features = g_idx.numel()
    if in_features % num_groups:
        return None, 0
    size = in_features // num_groups
    perm = torch.argsort(g_idx, stable=True)
    if not torch.equal(g_idx[perm], torch.arange(in_features, device=g_idx.device) // size):
        return None, 0
    identity = torch.equal(perm, torch.arange(in_features, device=g_idx.device))
    return (None if identity else perm), size


def _triton_int4_fits(group_size: int) -> bool:
    from kernels.triton import triton_available

    if not triton_available():
        return False
    from kernels.triton.weight_only_gemm import int4_tile_fits

    return int4_tile_fits(group_size)


def choose_kernel(
    bits: int,
    group_size: int,
    symmetric_per_row: bool,
    shape: tuple[int, int],
    device: torch.device,
    act_dtype: torch.dtype,
) -> str:
    """`int8panel`, `int8pack`, `int4panel`, `int4pack`, `triton_int4` or `dequant` for
    codes of this shape (group_size 0: groups not contiguous)."""
    out_features = shape[0]
    if device.type == "cuda":
        return "triton_int4" if bits == 4 and _triton_int4_fits(group_size) else "dequant"
    if device.type != "cpu" or not env.cpu_quantized_kernels():
        return "dequant"
    if bits == 8 and symmetric_per_row:
        return "int8panel" if byte_panels_fit(shape, act_dtype) else "int8pack"
    if bits == 4 and group_size > 0 and group_size % 2 == 0 and byte_panels_fit(shape, act_dtype):
        return "int4panel"
    fits_int4 = group_size > 0 and any(group_size % g == 0 for g in INT4_GROUP_SIZES)
    if bits == 4 and fits_int4 and out_features % 16 == 0:
        return "int4pack"
    return "dequant"


def set_int_weight(
    layer: nn.Module,
    drop: list[str],
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor,
    bits: int,
    act_dtype: torch.dtype,
    kernel: str | None = None,
) -> None:
    """Replace the checkpoint-format parameters `drop` of `layer` by the kernel
    form of (codes, scales, zeros, g_idx); `kernel` forces one (tests)."""
    num_groups = scales.shape[1]
    perm, group_size = _contiguous_groups(g_idx, num_groups)
    one_group = num_groups == 1 and bool((zeros == 2 ** (bits - 1)).all())
    kernel = kernel or choose_kernel(
        bits, group_size, one_group, tuple(codes.shape), codes.device, act_dtype
    )
    layer.int_kernel, layer.int_bits = kernel, bits
    if kernel in ("int8pack", "int8panel"):
        assert one_group, f"{kernel} takes symmetric per-output scales"
        weight = (codes.to(torch.int16) - 128).to(torch.int8).contiguous()  # [out, in]
        if kernel == "int8panel":  # [out / 32, in / 2, 64] bytes, float32 scales
            weight = load_weight_only_kernels().pack_byte_panels(weight)
        scale_dtype = torch.float32 if kernel == "int8panel" else act_dtype
        replace_params(
            layer, drop, int_weight=weight, int_scales=scales[:, 0].to(scale_dtype).contiguous()
        )
        layer.input_perm = None
        return
    if kernel == "int4panel":
        assert bits == 4 and group_size > 0
        sorted_codes = codes if perm is None else codes[:, perm]
        s = scales.to(torch.float32)
        replace_params(
            layer,
            drop,
            int_weight=load_weight_only_kernels().pack_int4_panels(sorted_codes.to(torch.uint8)),
            int_scales=s.t().contiguous(),  # [groups, out]
            int_offsets=(s * (zeros.to(torch.float32) - 8)).t().contiguous(),
        )
        layer.int_group_size, layer.input_perm = group_size, perm
        return
    if kernel == "triton_int4":
        assert bits == 4 and _triton_int4_fits(group_size), "triton_int4 takes groups of 16k"
        sorted_codes = codes if perm is None else codes[:, perm]
        replace_params(
            layer,
            drop,
            int_weight=pack_nibbles(sorted_codes).contiguous(),  # [out, in / 2]
            int_scales=scales.to(torch.float32).contiguous(),  # [out, groups]
            int_zeros=zeros.to(torch.float32).contiguous(),
        )
        layer.int_group_size, layer.input_perm = group_size, perm
        return
    if kernel == "int4pack":
        assert bits == 4 and group_size > 0
        sorted_codes = codes if perm is None else codes[:, perm]
        kernel_group = next(g for g in INT4_GROUP_SIZES if group_size % g == 0)
        repeat = group_size // kernel_group
        s = scales.to(torch.float32).repeat_interleave(repeat, dim=1)  # [out, in / kernel_group]
        z = zeros.to(torch.float32).repeat_interleave(repeat, dim=1)
        # torch's form: w = (code - 8) * scale + offset, so offset = (8 - zero) * scale.
        scales_and_zeros = torch.stack([s.t(), ((8 - z) * s).t()], dim=-1)  # [groups, out, 2]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            sorted_codes.to(torch.int32).contiguous(), 1
        )
        replace_params(
            layer,
            drop,
            int_weight=packed,
            int_scales=scales_and_zeros.to(act_dtype).contiguous(),
        )
        layer.int_group_size, layer.input_perm = kernel_group, perm
        return
    if group_size > 0:  # groups as runs: the twin broadcasts scales over them, x is sorted
        codes, g_idx = (codes, g_idx) if perm is None else (codes[:, perm], g_idx[perm])
    stored = pack_nibbles(codes) if bits == 4 else codes.to(torch.uint8).contiguous()
    replace_params(
        layer,
        drop,
        int_weight=stored,
        int_scales=scales.to(act_dtype).contiguous(),
        int_zeros=zeros.to(act_dtype).contiguous(),
        int_g_idx=g_idx.to(torch.int64).contiguous(),
    )
    layer.int_group_size, layer.input_perm = group_size, perm


def int_weight_dense(layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """The twin's weight of a `dequant` layer: [out, in] in `dtype`."""
    codes = unpack_nibbles(layer.int_weight) if layer.int_bits == 4 else layer.int_weight
    size = layer.int_group_size
    if not size:
        return dequantize(codes, layer.int_scales, layer.int_zeros, layer.int_g_idx, dtype)
    # Runs of `size` inputs per group: no [out, in] gather of scales. Where dtype is
    # bf16 both factors are bf16 and their product rounds once, as in `dequantize`.
    out_features, in_features = codes.shape
    grouped = codes.view(out_features, -1, size).to(dtype)  # [out, groups, size]
    zeros, scales = layer.int_zeros.to(dtype)[..., None], layer.int_scales.to(dtype)[..., None]
    return ((grouped - zeros) * scales).view(out_features, in_features)


def apply_int_weight(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x: [num_tokens, in] -> [num_tokens, out] through the layer's kernel."""
    kernel = layer.int_kernel
    if layer.input_perm is not None:
        x = x.index_select(-1, layer.input_perm)
    if kernel == "dequant":
        return F.linear(x, int_weight_dense(layer, x.dtype), bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # the kernels read rows densely
    if kernel == "triton_int4":
        from kernels.triton.weight_only_gemm import int4_gemm

        out = int4_gemm(
            x2, layer.int_weight, layer.int_scales, layer.int_zeros, layer.int_group_size, bias
        )
        return out.view(*lead, out.shape[-1])
    if kernel == "int8panel":
        out = load_weight_only_kernels().weight_only_linear(
            x2, layer.int_weight, layer.int_scales, bias
        )
        return out.view(*lead, out.shape[-1])
    if kernel == "int4panel":
        out = load_weight_only_kernels().int4_linear(
            x2, layer.int_weight, layer.int_scales, layer.int_offsets, layer.int_group_size, bias
        )
        return out.view(*lead, out.shape[-1])
    if kernel == "int8pack":
        out = torch.ops.aten._weight_int8pack_mm(x2, layer.int_weight, layer.int_scales)
    else:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x2, layer.int_weight, layer.int_group_size, layer.int_scales
        )
    out = out.view(*lead, out.shape[-1])
    return out if bias is None else out + bias
