"""One paged attention kernel for every step (decode rows and prefill chunks
in the same launch), in the manner of vLLM's unified Triton attention.

Twin: kernels/paged_attention_reference.py. Shapes (any strides where noted):
    query, out          [num_tokens, num_heads, head_dim]       rows at any stride
    key/value cache     [num_blocks, block_size, num_kv_heads, head_dim] by strides
    block_tables        [num_seqs, max_num_blocks] int32
    query_start_loc     [num_seqs + 1] int32;  seq_lens [num_seqs] int32

Work split. Sequence i's query rows are cut into q-blocks of BLOCK_Q positions;
a program takes one q-block and one KV head, and packs the GROUP query heads
of that KV head into its tile rows (row r = position r // GROUP, head
r % GROUP), so a group shares every K/V tile it loads:

    tile rows:  | pos 0: h0 h1 .. h(G-1) | pos 1: h0 .. | ... | unused |  = BLOCK_M

Causality comes from context_len = seq_len - query_len: query position p (of
this step's rows) sits at absolute position context_len + p and sees keys
<= that. Tiles past the q-block's last query, and (with a sliding window)
before its first query's window, are never visited.

Grid axis 0 has an upper bound of q-blocks, num_tokens // BLOCK_Q + num_seqs,
so the launch depends on the batch's shape only and a CUDA graph can replay
it; each program finds its sequence by binary search over query_start_loc.

Split-K: when the grid would be too small to fill the GPU (few decode
sequences), a third grid axis splits each sequence's tiles into NUM_SPLITS
ranges whose partial results (unnormalized output, running max and sum) a
second kernel merges.

FP8 KV cache (KV_FP8): the caches come as their uint8 views, each K/V tile is
decoded from e4m3 with integer ops (no fp8 instructions: every GPU generation
and the interpreter alike) into the query's dtype, the softmax scale carries
k_scale and the output v_scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton import interpreted
from kernels.triton.attention_config import AttentionConfig


@triton.jit
def _paged_attention_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    part_out_ptr,  # [num_tokens, NUM_HEADS, NUM_SPLITS, HEAD_PAD] fp32 (split-K only)
    part_max_ptr,  # [num_tokens, NUM_HEADS, NUM_SPLITS] fp32
    part_sum_ptr,
    scale,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    WINDOW: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_F32: tl.constexpr,
    IEEE: tl.constexpr,
    v_scale=1.0,
    KV_FP8: tl.constexpr = False,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # NOTE: helpers stay inlined: each call of a jit helper costs the interpreter ~1 ms.
    # Binary search: sequence i's first q-block is query_start_loc[i] // BLOCK_Q + i.
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= query_len:
        return  # past this sequence's rows: the grid is an upper bound
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    rows = tl.arange(0, BLOCK_M)
    q_pos = local_block * BLOCK_Q + rows // GROUP  # position among this step's rows
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows < BLOCK_Q * GROUP) & (q_pos < query_len)
    dims = tl.arange(0, HEAD_PAD)
    dim_valid = dims < HEAD_DIM
    token = (q_start + q_pos).to(tl.int64)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
        mask=row_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )
    q_abs = context_len + q_pos  # [BLOCK_M] absolute positions

    # Keys this q-block can see: [kv_lo, kv_hi).
    block_first = local_block * BLOCK_Q
    block_last = tl.minimum(block_first + BLOCK_Q, query_len) - 1
    kv_hi = context_len + block_last + 1
    kv_lo = 0
    if WINDOW > 0:
        kv_lo = tl.maximum(context_len + block_first - WINDOW + 1, 0)
    tile_lo = kv_lo // TILE
    tile_hi = (kv_hi + TILE - 1) // TILE
    if NUM_SPLITS > 1:
        per_split = (tile_hi - tile_lo + NUM_SPLITS - 1) // NUM_SPLITS
        tile_lo = tile_lo + split * per_split
        tile_hi = tl.minimum(tile_lo + per_split, tile_hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_M, HEAD_PAD], 0.0, dtype=tl.float32)
    offs = tl.arange(0, TILE)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for t in range(tile_lo, tile_hi):
        k_pos = t * TILE + offs
        k_valid = k_pos < kv_hi
        block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_valid, other=0).to(tl.int64)
        in_block = k_pos % BLOCK_SIZE
        k = tl.load(  # [HEAD_PAD, TILE]
            k_cache_ptr
            + block[None, :] * stride_kb
            + in_block[None, :] * stride_ks
            + kv_head * stride_kh
            + dims[:, None],
            mask=dim_valid[:, None] & k_valid[None, :],
            other=0.0,
        )
        v = tl.load(  # [TILE, HEAD_PAD]
            v_cache_ptr
            + block[:, None] * stride_vb
            + in_block[:, None] * stride_vs
            + kv_head * stride_vh
            + dims[None, :],
            mask=k_valid[:, None] & dim_valid[None, :],
            other=0.0,
        )
        if KV_FP8:
            k = _widen_e4m3(k).to(q.dtype)
            v = _widen_e4m3(v).to(q.dtype)
        if DOT_F32:
            s = tl.dot(q.to(tl.float32), k.to(tl.float32))  # [BLOCK_M, TILE]
        elif IEEE:
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        s = s * scale
        allowed = row_valid[:, None] & k_valid[None, :] & (k_pos[None, :] <= q_abs[:, None])
        if WINDOW > 0:
            allowed = allowed & (q_abs[:, None] - k_pos[None, :] < WINDOW)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row with nothing visible yet keeps max -inf; shift by 0 so exp() gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_shift[:, None])
        alpha = tl.exp(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p = p.to(v.dtype)
        if DOT_F32:
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float32), v.to(tl.float32))
        elif IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new

    if KV_FP8:
        acc = acc * v_scale
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & dim_valid[None, :],
        )
    else:
        part = (token * NUM_HEADS + head) * NUM_SPLITS + split  # [BLOCK_M]
        tl.store(
            part_out_ptr + part[:, None] * HEAD_PAD + dims[None, :],
            acc,
            mask=row_valid[:, None] & (dims[None, :] < HEAD_PAD),
        )
        tl.store(part_max_ptr + part, m_i, mask=row_valid)
        tl.store(part_sum_ptr + part, l_i, mask=row_valid)


@triton.jit
def _widen_e4m3(byte):
    """e4m3fn bytes -> float32: s eeee mmm, bias 7; exponent 0 is m * 2^-9."""
    b = byte.to(tl.int32)
    exp = (b >> 3) & 15
    mant = b & 7
    normal = (((exp + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(exp == 0, mant.to(tl.float32) * 0.001953125, normal)
    return tl.where((b & 128) != 0, -mag, mag)


@triton.jit
def _merge_splits_kernel(
    out_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    """One (token, head): out = sum_s acc_s e^(m_s - m) / sum_s l_s e^(m_s - m)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, HEAD_PAD)
    part = (token * NUM_HEADS + head) * NUM_SPLITS + splits
    m = tl.load(part_max_ptr + part)
    l_s = tl.load(part_sum_ptr + part)
    m_all = tl.max(m, axis=0)
    weight = tl.exp(m - tl.where(m_all == float("-inf"), 0.0, m_all))  # empty splits: 0
    denom = tl.sum(l_s * weight, axis=0)
    acc = tl.load(part_out_ptr + part[:, None] * HEAD_PAD + dims[None, :])
    out = tl.sum(acc * weight[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    num_seqs: int,
    scale: float,
    sliding_window: int | None,
    config: AttentionConfig,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Attention of every query row over its sequence's paged context; see the
    module docstring. num_seqs is the length of seq_lens, passed as an int so
    the launch reads no device value. k_scale / v_scale: an fp8 cache's."""
    fp8 = key_cache.dtype == torch.float8_e4m3fn
    if fp8:
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
        scale = scale * k_scale
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    assert query.stride(2) == 1 and key_cache.stride(3) == 1 and value_cache.stride(3) == 1
    assert config.block_m >= group, "a tile must hold a whole query group"
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_tokens == 0:
        return out
    block_q = config.block_m // group
    head_pad = max(16, triton.next_power_of_2(head_dim))
    splits = config.num_splits
    grid = (num_tokens // block_q + num_seqs, num_kv_heads, splits)
    if splits > 1:
        # [num_tokens, num_heads, splits, head_pad] partial outputs, then max and sum
        part_out = torch.empty(
            (num_tokens, num_heads, splits, head_pad), dtype=torch.float32, device=query.device
        )
        part_max = torch.empty(
            (num_tokens, num_heads, splits), dtype=torch.float32, device=query.device
        )
        part_sum = torch.empty_like(part_max)
    else:
        part_out = part_max = part_sum = out  # never touched: NUM_SPLITS == 1
    _paged_attention_kernel[grid](
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        part_out,
        part_max,
        part_sum,
        scale,
        num_seqs,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        block_tables.stride(0),
        NUM_HEADS=num_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        HEAD_PAD=head_pad,
        BLOCK_SIZE=key_cache.shape[1],
        TILE=config.tile,
        BLOCK_M=config.block_m,
        BLOCK_Q=block_q,
        WINDOW=sliding_window or 0,
        NUM_SPLITS=splits,
        DOT_F32=interpreted(),
        IEEE=query.dtype == torch.float32,
        v_scale=v_scale,
        KV_FP8=fp8,
        num_warps=config.num_warps,
    )
    if splits > 1:
        _merge_splits_kernel[(num_tokens, num_heads)](
            out,
            part_out,
            part_max,
            part_sum,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_DIM=head_dim,
            HEAD_PAD=head_pad,
            NUM_SPLITS=splits,
        )
    return out
