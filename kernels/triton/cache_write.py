"""KV cache write through the slot mapping: one program per new token.

Twin: kernels/paged_attention_reference.write_kv_reference. Shapes:
    key, value          [num_tokens, num_kv_heads, head_dim]   rows at any stride
    key/value cache     [num_blocks, block_size, num_kv_heads, head_dim] by strides
    slot_mapping        [num_tokens] int64: block * block_size + offset; -1 = skip
A slot of -1 marks a padded row (a CUDA graph's batch padded to a captured size).

An fp8 cache (float8_e4m3fn, written through its uint8 view) takes
e4m3(clamp(x * (1 / scale), +-448)), ties to even, encoded with integer ops as
kernels/cpu/fp8_e4m3.h does, so the bytes equal the twin's on every GPU
generation and in the interpreter (no fp8 conversion instructions needed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    k_inv_scale=1.0,
    v_inv_scale=1.0,
    KV_FP8: tl.constexpr = False,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    k = tl.load(key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(
        value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask
    )
    if KV_FP8:
        k = _e4m3_bytes(k.to(tl.float32) * k_inv_scale)
        v = _e4m3_bytes(v.to(tl.float32) * v_inv_scale)
    k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs
    tl.store(k_dst + heads[:, None] * stride_kch + dims[None, :], k, mask=mask)
    tl.store(v_dst + heads[:, None] * stride_vch + dims[None, :], v, mask=mask)


@triton.jit
def _e4m3_bytes(x):
    """float32 -> e4m3fn codes as uint8: saturating at +-448, ties to even."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.minimum(tl.abs(x), 448.0)
    a_bits = a.to(tl.int32, bitcast=True)
    # Normal: drop 20 mantissa bits rounding ties to even, rebias 127 -> 7.
    normal = ((a_bits + 0x7FFFF + ((a_bits >> 20) & 1)) >> 20) - (120 << 3)
    # Below 2^-6: the nearest multiple of 2^-9, ties to even (8 is 2^-6: code 0x08).
    q = a * 512.0
    r = tl.floor(q)
    frac = q - r
    r_int = r.to(tl.int32)
    up = (frac > 0.5) | ((frac == 0.5) & ((r_int & 1) == 1))
    sub = r_int + up.to(tl.int32)
    code = tl.where(a < 0.015625, sub, normal)
    code = tl.where(x != x, 0x7F, code)  # NaN
    return (code | sign).to(tl.uint8)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Copy row t of key/value into slot slot_mapping[t] of the caches (skip -1);
    into an fp8 cache as x / scale (k_scale, v_scale per tensor)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    fp8 = key_cache.dtype == torch.float8_e4m3fn
    if fp8:
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
    assert key.stride(2) == 1 and value.stride(2) == 1
    assert key_cache.stride(3) == 1 and value_cache.stride(3) == 1
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        HEAD_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=key_cache.shape[1],
        k_inv_scale=_reciprocal(k_scale),
        v_inv_scale=_reciprocal(v_scale),
        KV_FP8=fp8,
        num_warps=1 if num_kv_heads * head_dim <= 512 else 4,
    )


def _reciprocal(scale: float) -> float:
    """1 / scale rounded to float32, as the twin and the CPU kernel compute it."""
    return float(torch.tensor(1.0) / torch.tensor(scale, dtype=torch.float32))
