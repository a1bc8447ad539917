"""The Triton paged attention kernel equals the reference
(kernels/paged_attention_reference.py) on mixed batches: decode rows, fresh
prefills and chunks over a cached prefix in one launch, lengths off the block
grid, GQA packings, sliding windows and the split-K path. Interpreted on CPU in
the default suite (tiny grids), on CUDA in bf16/fp16 under the gpu marker."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_attention_reference import paged_attention_reference
from kernels.triton.attention_config import AttentionConfig, choose_config
from tests.triton_devices import gpu_only

# (query_len, seq_len): a first-token decode, a decode over 16 cached tokens, a fresh
# 7-token prefill, a 5-token chunk over a 32-token prefix, a decode at a block edge.
MIXED = [(1, 1), (1, 17), (7, 7), (5, 37), (1, 64)]


def make_batch(shapes, num_heads, num_kv_heads, head_dim, block_size, dtype, device, first_block=0):
    """Random query and paged K/V for `shapes`; blocks drawn in shuffled order from
    [first_block, first_block + needed + 3)."""
    gen = torch.Generator().manual_seed(len(shapes) * 7 + head_dim + num_heads)
    needed = sum(-(-s // block_size) for _, s in shapes)
    num_blocks = first_block + needed + 3
    ids = (torch.randperm(needed + 3, generator=gen) + first_block).tolist()
    width = max(-(-s // block_size) for _, s in shapes) + 1  # one spare column of padding
    block_tables = torch.zeros(len(shapes), width, dtype=torch.int32)
    for i, (_, seq_len) in enumerate(shapes):
        n = -(-seq_len // block_size)
        block_tables[i, :n] = torch.tensor([ids.pop() for _ in range(n)])
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    value_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    query_start_loc = [0]
    for q, _ in shapes:
        query_start_loc.append(query_start_loc[-1] + q)
    query = torch.randn(query_start_loc[-1], num_heads, head_dim, generator=gen).to(dtype)
    seq_lens = [s for _, s in shapes]
    return [t.to(device) for t in (query, key_cache, value_cache, block_tables)] + [
        query_start_loc,
        seq_lens,
    ]


def run_both(batch, config, window=None, scale=0.125):
    from kernels.triton.paged_attention import paged_attention

    query, key_cache, value_cache, block_tables, query_start_loc, seq_lens = batch
    device = query.device
    got = paged_attention(
        query,
        key_cache,
        value_cache,
        block_tables,
        torch.tensor(query_start_loc, dtype=torch.int32, device=device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        len(seq_lens),
        scale,
        window,
        config,
    )
    want = paged_attention_reference(
        query.float(),
        key_cache.float(),
        value_cache.float(),
        block_tables,
        query_start_loc,
        seq_lens,
        scale,
        window,
    )
    return got, want


def tolerance(dtype):
    return 2e-5 if dtype == torch.float32 else 2e-2


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, block_size, tile, first_block",
    [
        (4, 4, 64, 16, 16, 0),
        (8, 2, 128, 32, 32, 900),
        (5, 1, 64, 16, 32, 0),
    ],
    ids=["mha-d64-bs16", "gqa4-d128-bs32-high-ids", "group5-d64"],
)
def test_mixed_batch_matches_reference(
    triton_device, num_heads, num_kv_heads, head_dim, block_size, tile, first_block
):
    device = triton_device
    dtypes = [torch.float32] if device.type == "cpu" else [torch.bfloat16, torch.float16]
    for dtype in dtypes:
        batch = make_batch(
            MIXED, num_heads, num_kv_heads, head_dim, block_size, dtype, device, first_block
        )
        got, want = run_both(batch, AttentionConfig(block_m=16, tile=tile))
        tol = tolerance(dtype)
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


def test_sliding_window_and_wide_tiles(triton_device):
    """A window of 5 over a 20-token chunk after 30 cached tokens: early tiles are
    skipped; 64-row tiles (the prefill choice) cover several positions per program."""
    device = triton_device
    shapes = [(20, 50), (1, 40), (3, 3)]
    batch = make_batch(shapes, 8, 2, 64, 16, torch.float32, device)
    for config in (AttentionConfig(block_m=16, tile=16), AttentionConfig(block_m=64, tile=32)):
        got, want = run_both(batch, config, window=5)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_split_k_decode_matches_reference(triton_device):
    """Decode rows with their tiles split over 4 ranges and merged by log-sum-exp;
    the first row's 3 tiles leave one range empty."""
    device = triton_device
    shapes = [(1, 90), (1, 130), (1, 7)]
    batch = make_batch(shapes, 8, 2, 64, 16, torch.float32, device)
    got, want = run_both(batch, AttentionConfig(block_m=16, tile=32, num_splits=4))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision(triton_device, dtype):
    """In the interpreter bf16 tiles are upcast before tl.dot (its bf16 dot is wrong)."""
    device = triton_device
    batch = make_batch([(1, 20), (6, 22)], 8, 2, 64, 16, dtype, device)
    got, want = run_both(batch, AttentionConfig(block_m=16, tile=32))
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_strided_query_and_interleaved_cache(triton_device):
    """The query as a view into fused QKV rows, the caches as K/V halves of one
    [num_blocks, 2, block_size, heads, dim] tensor (the triton backend's layout)."""
    device = triton_device
    from kernels.triton.paged_attention import paged_attention

    query, key_cache, value_cache, block_tables, qsl, seq_lens = make_batch(
        MIXED[:4], 4, 2, 64, 16, torch.float32, device
    )
    qkv = torch.randn(query.shape[0], 8 * 64, device=device)
    qkv[:, : 4 * 64] = query.flatten(1)
    strided = qkv[:, : 4 * 64].view(-1, 4, 64)
    kv = torch.stack([key_cache, value_cache], dim=1)  # [num_blocks, 2, bs, heads, dim]
    got = paged_attention(
        strided,
        kv[:, 0],
        kv[:, 1],
        block_tables,
        torch.tensor(qsl, dtype=torch.int32, device=device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        len(seq_lens),
        0.125,
        None,
        AttentionConfig(block_m=16, tile=32),
    )
    want = paged_attention_reference(
        query, key_cache, value_cache, block_tables, qsl, seq_lens, 0.125
    )
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_long_gpu_batch(triton_device):
    """GPU-sized: 64 decodes of up to 2k tokens and two 300-token chunks, default configs."""
    device = triton_device
    gpu_only(device)
    gen = torch.Generator().manual_seed(3)
    shapes = [(1, int(n)) for n in torch.randint(1, 2048, (64,), generator=gen)]
    shapes += [(300, 700), (300, 300)]
    for dtype in (torch.bfloat16, torch.float16):
        batch = make_batch(shapes, 14, 2, 64, 16, dtype, device)
        max_query_len = max(q for q, _ in shapes)
        config = choose_config(14, 2, len(shapes), max_query_len, target_programs=264)
        got, want = run_both(batch, config)
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
        decode = make_batch(shapes[:8], 14, 2, 64, 16, dtype, device)
        config = choose_config(14, 2, 8, 1, target_programs=264)
        assert config.num_splits > 1
        got, want = run_both(decode, config)
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_choose_config():
    decode_few = choose_config(14, 2, num_seqs=2, max_query_len=1, target_programs=264)
    assert (decode_few.block_m, decode_few.num_splits) == (16, 16)
    decode_many = choose_config(14, 2, num_seqs=128, max_query_len=1, target_programs=264)
    assert decode_many.num_splits == 1
    assert choose_config(32, 1, 4, 1, 264).block_m == 32  # a group of 32 needs 32 rows
    mixed = choose_config(14, 2, num_seqs=8, max_query_len=300, target_programs=264)
    assert (mixed.block_m, mixed.num_splits) == (64, 1)
