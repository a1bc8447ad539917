"""Weight-only GEMMs: y = x @ dequant(W)^T + bias with W kept quantized in memory.

Two weight forms, each beside its plain-PyTorch twin, which stays the oracle:

* int4 in groups (twin: worker/layers/quantization/int_weight.py `dequantize`):
      packed  [N, K / 2]       uint8, input 2j in the low nibble of byte j,
                               input 2j+1 in the high one (`pack_nibbles`)
      scales  [N, K / group]   float32
      zeros   [N, K / group]   float32, in code units: w = (code - zero) * scale
  groups are runs of `group` inputs (act-order callers sort x's features
  first) and `group` is a multiple of the K tile, so each tile reads one
  scale and one zero per output row.
* FP8 e4m3 (twin: worker/layers/quantization/fp8_weight.py `dequantize_fp8`):
      weight  [N, K]                     float8_e4m3fn, read as its bytes
      scales  [ceil(N / bn), ceil(K / bk)] float32: per row (bn = 1, bk = K)
                                          or per block (weight_block_size)
  the bytes are decoded to float32 with integer ops, which the interpreter and
  every GPU generation run alike (no fp8 conversion instructions needed).

Each tile of W is dequantized to float32, rounded to x's dtype (as the twin's
dense weight is) and fed to `tl.dot` with a float32 accumulator; the output is
in x's dtype. In the interpreter both dot tiles are float32 (DOT_F32: its bf16
dot is wrong). Block sizes are plain arguments (no autotune without a driver).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.triton import interpreted


@dataclass(frozen=True)
class GemmTiles:
    """One launch configuration: BLOCK_M x BLOCK_N outputs per program, K in BLOCK_K steps."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4


def choose_tiles(m: int, k_tile_divides: int) -> GemmTiles:
    """Tiles for `m` rows where the K tile must divide `k_tile_divides` (a power-of-2
    multiple of 16: the int4 group, the fp8 scale block's width, or 64 for per-row)."""
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_k = next(b for b in (64, 32, 16) if k_tile_divides % b == 0)
    return GemmTiles(block_m, 64, block_k)


def int4_tile_fits(group: int) -> bool:
    """Whether groups of `group` inputs hold a whole K tile (tl.dot needs K >= 16)."""
    return group > 0 and group % 16 == 0


@triton.jit
def _int4_gemm_kernel(
    out_ptr,
    x_ptr,
    w_ptr,
    scales_ptr,
    zeros_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    stride_wn,
    stride_sn,
    GROUP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_F32: tl.constexpr,
    IEEE: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    shift = (ks % 2) * 4  # odd inputs sit in the high nibble
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_ok = k < K
        x = tl.load(
            x_ptr + rows64[:, None] * stride_xm + k[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )  # [BLOCK_M, BLOCK_K]
        w_mask = col_ok[:, None] & k_ok[None, :]
        byte = tl.load(
            w_ptr + cols64[:, None] * stride_wn + (k // 2)[None, :], mask=w_mask, other=0
        )
        code = ((byte.to(tl.int32) >> shift[None, :]) & 15).to(tl.float32)  # [BLOCK_N, BLOCK_K]
        group = k0 // GROUP  # one group per tile: GROUP % BLOCK_K == 0
        s = tl.load(scales_ptr + cols64 * stride_sn + group, mask=col_ok, other=0.0)
        z = tl.load(zeros_ptr + cols64 * stride_sn + group, mask=col_ok, other=0.0)
        w = ((code - z[:, None]) * s[:, None]).to(x.dtype)  # rounded as the twin's dense W
        if DOT_F32:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)))
        elif IEEE:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + rows64[:, None] * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


@triton.jit
def _fp8_gemm_kernel(
    out_ptr,
    x_ptr,
    w_ptr,
    scales_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    stride_wn,
    stride_sn,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_F32: tl.constexpr,
    IEEE: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    scale_rows = cols64 // SCALE_BN
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_ok = k < K
        x = tl.load(
            x_ptr + rows64[:, None] * stride_xm + k[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        byte = tl.load(
            w_ptr + cols64[:, None] * stride_wn + k[None, :],
            mask=col_ok[:, None] & k_ok[None, :],
            other=0,
        ).to(tl.int32)
        # e4m3fn: s eeee mmm, bias 7; exponent 0 is subnormal (m * 2^-9). Normal
        # values become float32 bits directly (exponent rebiased by 127 - 7).
        exp = (byte >> 3) & 15
        mant = byte & 7
        normal = (((exp + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
        mag = tl.where(exp == 0, mant.to(tl.float32) * 0.001953125, normal)
        code = tl.where((byte & 128) != 0, -mag, mag)  # [BLOCK_N, BLOCK_K]
        # One scale column per tile: BLOCK_K divides SCALE_BK (or SCALE_BK >= K).
        s = tl.load(scales_ptr + scale_rows * stride_sn + k0 // SCALE_BK, mask=col_ok, other=0.0)
        w = (code * s[:, None]).to(x.dtype)
        if DOT_F32:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)))
        elif IEEE:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + rows64[:, None] * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


def _check_x(x: torch.Tensor, k: int) -> None:
    assert x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1, "x: [M, K], rows dense"


def int4_gemm(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group: int,
    bias: torch.Tensor | None = None,
    tiles: GemmTiles | None = None,
) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype; packed [N, K / 2] uint8, scales/zeros [N, K / group]."""
    n, k = packed.shape[0], packed.shape[1] * 2
    _check_x(x, k)
    assert int4_tile_fits(group) and k % group == 0 and scales.shape == (n, k // group)
    assert packed.is_contiguous() and scales.is_contiguous() and zeros.is_contiguous()
    m = x.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    tiles = tiles or choose_tiles(m, group)
    assert group % tiles.block_k == 0, "the K tile must lie in one group"
    grid = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n))
    _int4_gemm_kernel[grid](
        out,
        x,
        packed,
        scales,
        zeros,
        bias if bias is not None else out,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        packed.stride(0),
        scales.stride(0),
        GROUP=group,
        HAS_BIAS=bias is not None,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        DOT_F32=interpreted(),
        IEEE=x.dtype == torch.float32,
        num_warps=tiles.num_warps,
    )
    return out


def fp8_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    block: tuple[int, int] | None = None,
    bias: torch.Tensor | None = None,
    tiles: GemmTiles | None = None,
) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype; weight [N, K] e4m3, scales [N, 1] (block None)
    or [ceil(N / block[0]), ceil(K / block[1])] float32."""
    n, k = weight.shape
    _check_x(x, k)
    assert weight.is_contiguous() and scales.is_contiguous() and scales.dtype == torch.float32
    scale_bn, scale_bk = (1, max(k, 1)) if block is None else block
    assert scales.shape == (triton.cdiv(n, scale_bn), triton.cdiv(k, scale_bk))
    m = x.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    tiles = tiles or choose_tiles(m, 64 if block is None else scale_bk)
    assert block is None or scale_bk % tiles.block_k == 0, "the K tile must lie in one block"
    grid = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n))
    _fp8_gemm_kernel[grid](
        out,
        x,
        weight.view(torch.uint8),
        scales,
        bias if bias is not None else out,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        weight.stride(0),
        scales.stride(0),
        SCALE_BN=scale_bn,
        SCALE_BK=scale_bk,
        HAS_BIAS=bias is not None,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        DOT_F32=interpreted(),
        IEEE=x.dtype == torch.float32,
        num_warps=tiles.num_warps,
    )
    return out
