"""The prefill kernel against its plain-PyTorch twin: bf16 (on CPUs with AMX or
AVX512-BF16) and float32 (on every build)."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import load_cpu_kernels
from kernels.paged_attention_reference import paged_attention_reference
from tests.kernels.tile_dtypes import TILE_DTYPES, TILE_TOLERANCE

kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="the C++ kernels did not build here")


def _paged_batch(
    seq_lens, num_new, num_heads, num_kv_heads, head_dim, block_size, seed=0, dtype=torch.bfloat16
):
    """Random caches with each sequence's blocks scattered, queries for its last rows.

    Each sequence's rows are followed by one row of another (decode) sequence,
    as in a mixed step: `ranges` [num_seqs, 2] says which rows are whose."""
    gen = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // block_size) for n in seq_lens)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen).to(dtype)
    value_cache = torch.randn(shape, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    block_tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    for i, n in enumerate(seq_lens):
        blocks = [perm.pop() for _ in range(-(-n // block_size))]
        block_tables[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    ranges, row = [], 0
    for n in num_new:
        ranges.append((row, row + n))
        row += n + 1
    # As the engine passes it: a view of the fused QKV rows, at their wider row stride.
    qkv = torch.randn(row, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    query = qkv[:, : num_heads * head_dim].view(row, num_heads, head_dim)
    return query, key_cache, value_cache, block_tables, ranges


@pytest.mark.parametrize(
    "seq_lens, num_new, num_heads, num_kv_heads, head_dim, block_size, window",
    [
        # whole prompts: lengths around the 16-row tiles and 32-key chunks
        ([1, 15, 16, 17, 33, 100], [1, 15, 16, 17, 33, 100], 9, 3, 64, 16, None),
        # cached prefixes / later chunks: few new rows over a long context
        ([300, 64, 77], [5, 64, 40], 9, 3, 64, 16, None),
        # another block size, MHA, head_dim 128, a sliding window
        ([129, 50], [129, 20], 4, 4, 128, 8, None),
        ([200, 90], [120, 90], 8, 2, 64, 16, 37),
    ],
)
@pytest.mark.parametrize("dtype", TILE_DTYPES)
def test_prefill_matches_reference(
    seq_lens, num_new, num_heads, num_kv_heads, head_dim, block_size, window, dtype
):
    query, key_cache, value_cache, block_tables, ranges = _paged_batch(
        seq_lens, num_new, num_heads, num_kv_heads, head_dim, block_size, dtype=dtype
    )
    out = torch.zeros(query.shape, dtype=query.dtype)
    scale = head_dim**-0.5
    kernels.paged_attention_prefill(
        query,
        key_cache,
        value_cache,
        block_tables,
        torch.tensor(seq_lens, dtype=torch.int32),
        torch.tensor(ranges, dtype=torch.int64),
        out,
        scale,
        window or 0,
    )
    rows = torch.cat([torch.arange(first, end) for first, end in ranges])
    starts = [0]
    for first, end in ranges:
        starts.append(starts[-1] + end - first)
    # The twin in fp32: the kernel rounds probabilities to bf16 before P @ V.
    expected = paged_attention_reference(
        query[rows].float(),
        key_cache.float(),
        value_cache.float(),
        block_tables,
        starts,
        seq_lens,
        scale,
        window,
    )
    tol = TILE_TOLERANCE[dtype]
    torch.testing.assert_close(out[rows].float(), expected, atol=tol, rtol=tol)
    untouched = torch.ones(query.shape[0], dtype=torch.bool)
    untouched[rows] = False
    assert out[untouched].abs().sum() == 0


@pytest.mark.parametrize("dtype", TILE_DTYPES)
def test_prefill_with_scores_that_keep_rising_along_the_context(dtype):
    """Keys scaled up with their position: each query's running max climbs by
    a few log2 units a chunk, so the AMX path's lazily moved softmax shift (head_dim
    64) both holds across chunks and moves mid-context, many times a row."""
    seq_lens, block_size = [300, 213], 16
    query, key_cache, value_cache, block_tables, ranges = _paged_batch(
        seq_lens, [300, 70], 9, 3, 64, block_size, seed=3, dtype=dtype
    )
    for i, n in enumerate(seq_lens):
        for b in range(-(-n // block_size)):
            growth = 1 + torch.arange(b * block_size, (b + 1) * block_size) / 40
            block = block_tables[i, b]
            key_cache[block] = (key_cache[block].float() * growth[:, None, None]).to(dtype)
    out = torch.zeros(query.shape, dtype=query.dtype)
    args = (torch.tensor(seq_lens, dtype=torch.int32), torch.tensor(ranges, dtype=torch.int64))
    kernels.paged_attention_prefill(
        query, key_cache, value_cache, block_tables, *args, out, 0.125, 0
    )
    rows = torch.cat([torch.arange(first, end) for first, end in ranges])
    expected = paged_attention_reference(
        query[rows].float(),
        key_cache.float(),
        value_cache.float(),
        block_tables,
        [0, 300, 370],
        seq_lens,
        0.125,
        None,
    )
    tol = TILE_TOLERANCE[dtype]
    torch.testing.assert_close(out[rows].float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "seq_lens, num_new, window", [([1, 17, 100], [1, 17, 100], None), ([300, 77], [5, 40], 37)]
)
def test_float32_prefill_over_a_half_cache(seq_lens, num_new, window, cache_dtype):
    """A float32 model's bf16/fp16 cache (kv_half.h): the tile widens each step's
    rows, so the result is float32 attention over the half values."""
    query, key_cache, value_cache, block_tables, ranges = _paged_batch(
        seq_lens, num_new, 9, 3, 64, 16, seed=5, dtype=torch.float32
    )
    key_cache, value_cache = key_cache.to(cache_dtype), value_cache.to(cache_dtype)
    out = torch.zeros(query.shape, dtype=torch.float32)
    args = (torch.tensor(seq_lens, dtype=torch.int32), torch.tensor(ranges, dtype=torch.int64))
    kernels.paged_attention_prefill(
        query, key_cache, value_cache, block_tables, *args, out, 0.125, window or 0
    )
    rows = torch.cat([torch.arange(first, end) for first, end in ranges])
    starts = [0]
    for first, end in ranges:
        starts.append(starts[-1] + end - first)
    expected = paged_attention_reference(
        query[rows], key_cache.float(), value_cache.float(), block_tables, starts, seq_lens,
        0.125, window,
    )  # fmt: skip
    tol = TILE_TOLERANCE[torch.float32]
    torch.testing.assert_close(out[rows], expected, atol=tol, rtol=tol)


def test_prefill_rejects_a_short_block_table():
    query, key_cache, value_cache, block_tables, ranges = _paged_batch(
        [40], [40], 2, 1, 64, 16, dtype=torch.float32
    )
    with pytest.raises(RuntimeError, match="block table too short"):
        kernels.paged_attention_prefill(
            query,
            key_cache,
            value_cache,
            block_tables[:, :2],
            torch.tensor([40], dtype=torch.int32),
            torch.tensor(ranges, dtype=torch.int64),
            torch.zeros(query.shape, dtype=query.dtype),
            0.125,
            0,
        )


def test_prefill_rejects_mixed_dtypes():
    query, key_cache, value_cache, block_tables, ranges = _paged_batch(
        [20], [20], 2, 1, 64, 16, dtype=torch.float32
    )
    with pytest.raises(RuntimeError, match="the same for query, caches and out"):
        kernels.paged_attention_prefill(
            query.to(torch.bfloat16),
            key_cache,
            value_cache,
            block_tables,
            torch.tensor([20], dtype=torch.int32),
            torch.tensor(ranges, dtype=torch.int64),
            torch.zeros(query.shape, dtype=query.dtype),
            0.125,
            0,
        )
