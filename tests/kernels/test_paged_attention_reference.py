"""The reference paged attention equals dense causal attention over the same K/V."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.paged_attention_reference import paged_attention_reference, write_kv_reference


def dense_attention(q, k, v, num_cached, window=None):
    """q: [n, H, D], k/v: [L, Hkv, D]; q are the last n of L positions."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    n, length = q.shape[0], k.shape[0]
    q_pos = torch.arange(num_cached, num_cached + n)[:, None]
    k_pos = torch.arange(length)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= q_pos - k_pos < window
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    )
    return out.transpose(0, 1)


@pytest.mark.parametrize("window", [None, 5])
def test_mixed_prefill_chunk_and_decode_batch(window):
    torch.manual_seed(0)
    num_heads, num_kv_heads, head_dim, block_size, num_blocks = 4, 2, 8, 4, 32
    key_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim)
    value_cache = torch.zeros_like(key_cache)
    # (cached tokens, new tokens) per sequence: fresh prefill, chunk after a prefix, decode.
    shapes = [(0, 7), (9, 4), (13, 1)]
    perm = torch.randperm(num_blocks).tolist()
    block_tables = torch.zeros(len(shapes), 8, dtype=torch.int32)
    queries, full_k, full_v, slots = [], [], [], []
    for i, (cached, new) in enumerate(shapes):
        total = cached + new
        blocks = [perm.pop() for _ in range(-(-total // block_size))]
        block_tables[i, : len(blocks)] = torch.tensor(blocks)
        k = torch.randn(total, num_kv_heads, head_dim)
        v = torch.randn(total, num_kv_heads, head_dim)
        full_k.append(k)
        full_v.append(v)
        pos = torch.arange(total)
        slot = torch.tensor(blocks)[pos // block_size] * block_size + pos % block_size
        # Cached positions were written by earlier steps.
        write_kv_reference(k[:cached], v[:cached], key_cache, value_cache, slot[:cached])
        slots.append(slot[cached:])
        queries.append(torch.randn(new, num_heads, head_dim))
    new_k = torch.cat([k[c:] for k, (c, _) in zip(full_k, shapes)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(full_v, shapes)])
    write_kv_reference(new_k, new_v, key_cache, value_cache, torch.cat(slots))
    query_start_loc = [0, 7, 11, 12]
    out = paged_attention_reference(
        torch.cat(queries),
        key_cache,
        value_cache,
        block_tables,
        query_start_loc,
        [c + n for c, n in shapes],
        head_dim**-0.5,
        window,
    )
    for i, (cached, _) in enumerate(shapes):
        expected = dense_attention(queries[i], full_k[i], full_v[i], cached, window)
        got = out[query_start_loc[i] : query_start_loc[i + 1]]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
