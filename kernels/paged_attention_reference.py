"""Paged attention in plain PyTorch: gather a sequence's blocks, then attend.

KV cache layout, per layer:
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
A token at position p of a sequence with block table `bt` lives in slot
bt[p // block_size] * block_size + p % block_size.

Queries of one sequence are the last `num_query` positions of its context
(cached prefix | earlier chunks | new tokens), so the causal mask is aligned
bottom-right.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def write_kv_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Scatter new tokens' K/V ([num_tokens, num_kv_heads, head_dim]) into their slots
    (caches at any strides, e.g. the K and V halves of one tensor). An fp8 cache
    stores x / scale (k_scale, v_scale: per-tensor, 1.0 uncalibrated)."""
    block_size = key_cache.shape[1]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    key_cache[blocks, offsets] = _to_cache(key, key_cache.dtype, k_scale)
    value_cache[blocks, offsets] = _to_cache(value, value_cache.dtype, v_scale)


def _to_cache(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """x in the cache's dtype; into fp8 (e4m3) as x * (1 / scale) in float32, the
    reciprocal rounded to float32 first (the kernels' arithmetic), saturating at
    +-448 where a plain cast would give NaN."""
    if x.dtype == dtype:
        return x
    if dtype == torch.float8_e4m3fn:
        inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(scale, dtype=torch.float32)
        x = (x.float() * inv.to(x.device)).clamp(-448.0, 448.0)
    return x.to(dtype)


def paged_attention_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: Sequence[int],
    seq_lens: Sequence[int],
    scale: float,
    sliding_window: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim].

    block_tables: [num_seqs, max_num_blocks]; query_start_loc: num_seqs + 1
    offsets into the flattened queries; seq_lens: context length of each
    sequence including its new tokens. An fp8 cache holds K / k_scale and
    V / v_scale: k_scale folds into the softmax scale, v_scale into the output.
    """
    _, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        num_query = end - start
        blocks = block_tables[i, : -(-seq_len // block_size)].long()
        # [seq_len, num_kv_heads, head_dim], in the query's dtype (an fp8 cache widens)
        key = key_cache[blocks].flatten(0, 1)[:seq_len].to(query.dtype)
        value = value_cache[blocks].flatten(0, 1)[:seq_len].to(query.dtype)
        # [num_kv_heads, group, num_query, head_dim]
        q = query[start:end].view(num_query, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        # [num_kv_heads, group, num_query, seq_len]
        scores = torch.matmul(q, key.permute(1, 2, 0).unsqueeze(1)) * (scale * k_scale)
        # On the query's device: a mask built on the host cannot index CUDA scores.
        q_pos = torch.arange(seq_len - num_query, seq_len, device=query.device).unsqueeze(1)
        k_pos = torch.arange(seq_len, device=query.device).unsqueeze(0)
        allowed = k_pos <= q_pos
        if sliding_window is not None:
            allowed &= q_pos - k_pos < sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        o = torch.matmul(probs, value.permute(1, 0, 2).unsqueeze(1))
        if v_scale != 1.0:
            o = o * v_scale
        out[start:end] = o.permute(2, 0, 1, 3).reshape(num_query, num_heads, head_dim)
    return out
