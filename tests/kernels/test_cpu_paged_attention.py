"""The C++ decode kernel against its plain-PyTorch twin."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import load_cpu_kernels
from kernels.paged_attention_reference import paged_attention_reference, write_kv_reference

kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="no C++ toolchain to build the CPU kernels")


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, dtype, window",
    [
        (9, 3, 64, torch.float32, None),
        (4, 4, 16, torch.float32, None),
        (8, 1, 32, torch.float32, 7),
        (12, 2, 32, torch.float32, None),
        (4, 2, 64, torch.bfloat16, None),
        # 16-bit caches go in tiles of at most 16 / (head_dim / 16) query heads:
        (9, 3, 64, torch.bfloat16, None),  # one tile of 3 per KV head
        (8, 1, 128, torch.bfloat16, 7),  # four tiles of 2
        (10, 2, 64, torch.float16, None),  # 4 + 1, no pair dots
        (12, 2, 32, torch.bfloat16, None),  # 4 + 2
        (4, 4, 16, torch.bfloat16, None),  # odd chunk count: no pair dots
        # Pair dots score the keys in walks of whole row slices, as many KV heads
        # at once as fit 16 KB of queries and pending dots: here 2 of 8, 4 walks.
        (32, 8, 128, torch.bfloat16, None),
    ],
)
# 6 sequences, and 24: from 4 per thread (2 threads here) each thread reads the KV
# of the sequence it claimed next while attending the one before. "pairs": spans
# at the edges of the bf16 pair dots' 32-token reductions (an odd span's last
# token goes with a zero row; at 31 mod 32 that pair closes a full 16).
@pytest.mark.parametrize(
    "seq_lens",
    [
        [1, 5, 16, 17, 100, 33],
        [1 + (i * 37) % 120 for i in range(24)],
        [31, 32, 33, 63, 64, 65, 95, 2],
    ],
    ids=["6", "24", "pairs"],
)
def test_decode_matches_reference(num_heads, num_kv_heads, head_dim, dtype, window, seq_lens):
    torch.manual_seed(0)
    block_size, num_blocks = 16, 8 * len(seq_lens) + 16
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    perm = torch.randperm(num_blocks).tolist()
    block_tables = torch.zeros(len(seq_lens), 8, dtype=torch.int32)
    for i, n in enumerate(seq_lens):
        blocks = [perm.pop() for _ in range(-(-n // block_size))]
        block_tables[i, : len(blocks)] = torch.tensor(blocks)
    # Decode rows sit among other rows: rows 1, 3, 4, 7, ... of a batch twice as long.
    num_rows = 2 * len(seq_lens)
    rows = torch.tensor([2 * i + (0 if i % 3 == 2 else 1) for i in range(len(seq_lens))])
    # As the engine passes it: a view of the fused QKV rows, at their wider row stride.
    qkv = torch.randn(num_rows, (num_heads + 2 * num_kv_heads) * head_dim).to(dtype)
    query = qkv[:, : num_heads * head_dim].view(num_rows, num_heads, head_dim)
    out = torch.zeros(query.shape, dtype=dtype)
    scale = head_dim**-0.5
    kernels.paged_attention_decode(
        query,
        key_cache,
        value_cache,
        block_tables,
        torch.tensor(seq_lens, dtype=torch.int32),
        rows,
        out,
        scale,
        window or 0,
    )
    _assert_matches_reference(
        out[rows], query[rows], key_cache, value_cache, block_tables, seq_lens, window
    )
    untouched = torch.ones(num_rows, dtype=torch.bool)
    untouched[rows] = False
    assert out[untouched].abs().sum() == 0


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, window",
    # V in runs of 16 tokens for groups up to 8 (register slices of 4, 2 or 1
    # vectors a head by the group's size), token by token above
    [(9, 3, 64, None), (8, 1, 32, 7), (4, 4, 16, None), (12, 2, 32, None), (12, 1, 64, None)],
)
@pytest.mark.parametrize(
    "seq_lens",
    [[1, 5, 16, 17, 100, 33], [1 + (i * 37) % 120 for i in range(24)], [1000]],
    ids=["6", "24", "split"],
)
def test_float32_decode_over_a_half_cache(
    num_heads, num_kv_heads, head_dim, window, seq_lens, cache_dtype
):
    """A float32 model's bf16/fp16 cache (kv_half.h): float32 attention over the
    half values, widened as they load; one long sequence goes in parts."""
    torch.manual_seed(3)
    block_size = 16
    width = -(-max(seq_lens) // block_size)
    num_blocks = width * len(seq_lens) + 4
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(cache_dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(cache_dtype)
    block_tables = torch.randperm(num_blocks)[: width * len(seq_lens)].int().view(-1, width)
    qkv = torch.randn(len(seq_lens), (num_heads + 2 * num_kv_heads) * head_dim)
    query = qkv[:, : num_heads * head_dim].view(len(seq_lens), num_heads, head_dim)
    out = torch.zeros(query.shape)
    kernels.paged_attention_decode(
        query, key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32),
        torch.arange(len(seq_lens)), out, head_dim**-0.5, window or 0,
    )  # fmt: skip
    # The twin widens the cache to the query's dtype: float32 over the same values.
    _assert_matches_reference(out, query, key_cache, value_cache, block_tables, seq_lens, window)


def test_decode_rejects_a_float32_cache_under_a_bf16_query():
    query = torch.zeros(1, 2, 16, dtype=torch.bfloat16)
    cache = torch.zeros(2, 4, 2, 16)
    with pytest.raises(RuntimeError, match="query's dtype"):
        kernels.paged_attention_decode(
            query, cache, cache, torch.zeros(1, 2, dtype=torch.int32),
            torch.tensor([3], dtype=torch.int32), torch.tensor([0]), torch.zeros_like(query), 0.25, 0,
        )  # fmt: skip


def _assert_matches_reference(out, query, key_cache, value_cache, block_tables, seq_lens, window):
    """out: the kernel's rows, one per sequence, as query's."""
    head_dim = query.shape[-1]
    expected = paged_attention_reference(
        query,
        key_cache,
        value_cache,
        block_tables,
        list(range(len(seq_lens) + 1)),
        seq_lens,
        head_dim**-0.5,
        window or None,
    )
    tolerance = 1e-5 if query.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize(
    "dtype, cache_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.bfloat16),
        (torch.float32, torch.float16),
    ],
)
def test_write_kv_cache_matches_reference(dtype, cache_dtype):
    torch.manual_seed(0)
    num_blocks, block_size, heads, head_dim = 8, 4, 3, 24  # 72: 16-lane groups and a tail
    # K and V as the attention layer passes them: column slices of one fused qkv row.
    qkv = torch.randn(5, 4 * heads * head_dim).to(dtype)
    # Rounding's edges when narrowed: ties (bf16 and fp16), fp16's overflow and
    # subnormals, infinities, NaN.
    qkv[0, -8:] = torch.tensor(
        [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 7e4, 3e-6, -float("inf"), float("nan"), 0.0]
    )
    key = qkv[:, 2 * heads * head_dim : 3 * heads * head_dim].view(5, heads, head_dim)
    value = qkv[:, 3 * heads * head_dim :].view(5, heads, head_dim)
    slots = torch.tensor([31, 0, 7, 12, 13])
    caches = [
        torch.zeros(num_blocks, block_size, heads, head_dim, dtype=cache_dtype) for _ in range(4)
    ]
    kernels.write_kv_cache(key, value, caches[0], caches[1], slots)
    write_kv_reference(key, value, caches[2], caches[3], slots)
    # Exact; NaN's bits may differ (torch's own vector and scalar bf16 conversions do).
    for got, want in zip(caches[:2], caches[2:]):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(caches[0].view(-1, heads, head_dim)[31], key[0].to(cache_dtype))


def test_write_kv_cache_rejects_a_slot_outside_the_cache():
    cache = torch.zeros(2, 4, 1, 16)
    rows = torch.zeros(1, 1, 16)
    with pytest.raises(RuntimeError, match="out of range"):
        kernels.write_kv_cache(rows, rows, cache, cache.clone(), torch.tensor([8]))


@pytest.mark.parametrize(
    "seq_lens, threads, window, parts",
    [
        ([600], 2, 0, [(0, 0, 300), (0, 300, 600)]),
        ([255], 2, 0, []),  # two parts would be under 128 tokens each
        ([256], 2, 0, [(0, 0, 128), (0, 128, 256)]),
        # Two near-equal sequences are a thread's share each (rounded, not ceil'd:
        # the longer one in two parts left three tasks for two threads).
        ([324, 348], 2, 0, []),
        ([1000], 4, 0, [(0, 0, 250), (0, 250, 500), (0, 500, 750), (0, 750, 1000)]),
        ([300], 4, 0, [(0, 0, 150), (0, 150, 300)]),  # 2 parts of 128+
        # A long context among short ones: its share of 4 threads is 4, 128+ tokens a part.
        (
            [1000, 100],
            4,
            0,
            [(0, 0, 250), (0, 250, 500), (0, 500, 750), (0, 750, 1000), (1, 0, 100)],
        ),
        ([4000, 100, 100], 2, 0, [(0, 0, 2000), (0, 2000, 4000), (1, 0, 100), (2, 0, 100)]),
        ([600, 600], 2, 0, []),  # a sequence per thread already
        ([2000] + [100] * 7, 2, 0, []),  # 4 sequences per thread: the read-ahead path
        ([1000], 1, 0, []),
        ([1000], 2, 600, [(0, 400, 700), (0, 700, 1000)]),  # the window's tokens only
        ([1000], 2, 200, []),
        ([4096], 64, 0, [(0, 256 * i, 256 * (i + 1)) for i in range(16)]),  # 16 at most
    ],
)
def test_decode_splits_few_long_sequences_over_the_threads(seq_lens, threads, window, parts):
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    assert kernels.paged_attention_decode_parts(lens, threads, window) == parts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "seq_lens, threads, window",
    [([1000], 2, 0), ([700, 90], 4, 0), ([900], 3, 600), ([520], 2, 0), ([1500, 60, 200], 2, 0)],
)
def test_split_sequences_match_reference(dtype, seq_lens, threads, window):
    """Long sequences in parts on several threads, merged by log-sum-exp."""
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    assert kernels.paged_attention_decode_parts(lens, threads, window), "the case must split"
    torch.manual_seed(1)
    num_heads, num_kv_heads, head_dim, block_size = 9, 3, 64, 8
    width = -(-max(seq_lens) // block_size)
    num_blocks = width * len(seq_lens) + 8
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    block_tables = (
        torch.randperm(num_blocks)[: width * len(seq_lens)].int().view(len(seq_lens), width)
    )
    query = torch.randn(len(seq_lens), num_heads, head_dim).to(dtype)
    out = torch.zeros(query.shape, dtype=dtype)
    scale = head_dim**-0.5
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernels.paged_attention_decode(
            query,
            key_cache,
            value_cache,
            block_tables,
            lens,
            torch.arange(len(seq_lens)),
            out,
            scale,
            window,
        )
    finally:
        torch.set_num_threads(before)
    _assert_matches_reference(out, query, key_cache, value_cache, block_tables, seq_lens, window)
