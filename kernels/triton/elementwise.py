"""Fused RMSNorm (+ residual add), NeoX rotary embedding, SiLU-and-mul.

The same calling contract as the C++ CPU kernels (kernels/cpu/module.cpp), so
the layers call either through one name; twins in worker/layers/{layernorm,
rotary,activation}.py. Each kernel rounds where its twin rounds (every
intermediate the twin holds in the model dtype is rounded to it here), so
half-precision results track the twins closely and float32 matches to within
summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    x_ptr,
    residual_ptr,
    weight_ptr,
    eps,
    stride_x,
    stride_r,
    stride_o,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:  # residual = x + residual, in the model dtype, as the twin adds
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(residual_ptr + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=0) / HIDDEN + eps)
    normed = (xf * inv_rms).to(x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def _rms_norm(x, residual, weight, eps) -> torch.Tensor:
    rows, hidden = x.shape
    assert x.stride(1) == 1 and weight.is_contiguous()
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(rows,)](
        out,
        x,
        x if residual is None else residual,
        weight,
        eps,
        x.stride(0),
        0 if residual is None else residual.stride(0),
        out.stride(0),
        HIDDEN=hidden,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        num_warps=min(16, max(1, block // 256)),
    )
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [rows, hidden] (rows at any stride) -> RMSNorm(x) * weight, [rows, hidden]."""
    return _rms_norm(x, None, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual += x (in place), then return RMSNorm(residual) * weight."""
    assert residual.stride(1) == 1
    return _rms_norm(x, residual, weight, eps)


@triton.jit
def _silu_and_mul_kernel(out_ptr, x_ptr, stride_x, stride_o, D: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + D + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (silu * up.to(tl.float32)).to(gate.dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[rows, 2 * d] (gate | up) -> [rows, d] = silu(gate) * up."""
    rows, width = x.shape
    d = width // 2
    assert x.stride(1) == 1
    out = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(d))
    _silu_and_mul_kernel[(rows, triton.cdiv(d, block))](
        out, x, x.stride(0), out.stride(0), D=d, BLOCK=block, num_warps=4
    )
    return out


@triton.jit
def _rotary_kernel(
    x_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    stride_x,
    stride_cache,
    NUM_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """In place on one token's heads: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin."""
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF_PAD)
    heads = tl.arange(0, HEADS_PAD)
    dim_mask = dims < HALF
    cos = tl.load(cos_ptr + pos * stride_cache + dims, mask=dim_mask, other=0.0)[None, :]
    sin = tl.load(sin_ptr + pos * stride_cache + dims, mask=dim_mask, other=0.0)[None, :]
    mask = (heads < NUM_HEADS)[:, None] & dim_mask[None, :]
    first = x_ptr + token * stride_x + heads[:, None] * HEAD_DIM + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + HALF, mask=mask, other=0.0)
    dt = x1.dtype
    # Each product rounds to the model dtype, then the sum does: as the twin computes.
    a = (x1.to(tl.float32) * cos.to(tl.float32)).to(dt).to(tl.float32)
    b = (x2.to(tl.float32) * sin.to(tl.float32)).to(dt).to(tl.float32)
    c = (x2.to(tl.float32) * cos.to(tl.float32)).to(dt).to(tl.float32)
    d = (x1.to(tl.float32) * sin.to(tl.float32)).to(dt).to(tl.float32)
    tl.store(first, (a - b).to(dt), mask=mask)
    tl.store(first + HALF, (c + d).to(dt), mask=mask)


def rotary_embedding(
    query: torch.Tensor,
    key: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    head_dim: int,
) -> None:
    """NeoX-style RoPE in place. query: [num_tokens, num_heads * head_dim], key:
    [num_tokens, num_kv_heads * head_dim] (rows at any stride, e.g. views of the
    fused QKV output); cos/sin_cache: [max_position, head_dim], both halves equal."""
    num_tokens = query.shape[0]
    if num_tokens == 0:
        return
    half = head_dim // 2
    assert cos_cache.stride(1) == 1 and sin_cache.stride(0) == cos_cache.stride(0)
    for x in (query, key):
        assert x.stride(1) == 1
        num_heads = x.shape[1] // head_dim
        _rotary_kernel[(num_tokens,)](
            x,
            positions,
            cos_cache,
            sin_cache,
            x.stride(0),
            cos_cache.stride(0),
            NUM_HEADS=num_heads,
            HEADS_PAD=triton.next_power_of_2(num_heads),
            HALF=half,
            HALF_PAD=triton.next_power_of_2(half),
            HEAD_DIM=head_dim,
            num_warps=1 if num_heads * half <= 256 else 4,
        )
