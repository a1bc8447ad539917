"""Cascade attention for decode rows (attention_over_prefix, then the decode kernel
merging it in) against the plain-PyTorch twin over the whole context."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import load_cpu_kernels
from kernels.paged_attention_reference import paged_attention_reference
from tests.kernels.tile_dtypes import TILE_DTYPES, TILE_TOLERANCE

kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="the C++ kernels did not build here")


def _shared_batch(
    prefix_blocks, own_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=0
):
    """Decode sequences whose block tables start with the same `prefix_blocks` blocks,
    then blocks of their own holding `own_lens` tokens each (the last one new); their
    query rows are spread out, with other rows between them, as in a mixed step."""
    gen = torch.Generator().manual_seed(seed)
    own_blocks = [-(-n // block_size) for n in own_lens]
    num_blocks = prefix_blocks + sum(own_blocks) + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen).to(dtype)
    value_cache = torch.randn(shape, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    prefix = [perm.pop() for _ in range(prefix_blocks)]
    width = prefix_blocks + max(own_blocks)
    block_tables = torch.zeros(len(own_lens), width, dtype=torch.int32)
    for i, n in enumerate(own_blocks):
        row = prefix + [perm.pop() for _ in range(n)]
        block_tables[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
    seq_lens = [prefix_blocks * block_size + n for n in own_lens]
    query_rows = torch.arange(len(own_lens), dtype=torch.int64) * 2 + 1
    # As the engine passes it: a view of the fused QKV rows, at their wider row stride.
    num_rows = 2 * len(own_lens) + 1
    qkv = torch.randn(num_rows, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    query = qkv[:, : num_heads * head_dim].view(num_rows, num_heads, head_dim)
    return query, key_cache, value_cache, block_tables, seq_lens, query_rows


def _cascade(query, key_cache, value_cache, block_tables, seq_lens, query_rows, prefix_len, scale):
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    rows = len(seq_lens) * (query.shape[1] // num_kv_heads)
    prefix_out = torch.empty(num_kv_heads, rows, head_dim)
    prefix_lse = torch.empty(num_kv_heads, rows)
    kernels.attention_over_prefix(
        query, key_cache, value_cache, block_tables[0].contiguous(), prefix_len, query_rows,
        prefix_out, prefix_lse, scale,
    )  # fmt: skip
    out = torch.zeros(query.shape, dtype=query.dtype)
    kernels.paged_attention_decode(
        query, key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32),
        query_rows, out, scale, 0, prefix_len, prefix_out, prefix_lse,
    )  # fmt: skip
    return out, prefix_out, prefix_lse


@pytest.mark.parametrize(
    "prefix_blocks, own_lens, num_heads, num_kv_heads, head_dim, block_size, prefix_len",
    [
        # 32 sequences over a 512-token prefix, GQA 9/3 (the benchmark's shape)
        (32, [1 + i % 40 for i in range(32)], 9, 3, 64, 16, 512),
        # a prefix ending inside a 32-key chunk; rows per kv head not a multiple of 16
        (5, [1, 7, 8, 9, 30], 8, 2, 64, 8, 40),
        # the prefix shorter than the shared blocks; MHA, head_dim 128
        (4, [3, 60, 17], 4, 4, 128, 16, 50),
    ],
)
@pytest.mark.parametrize("dtype", TILE_DTYPES)
def test_cascade_matches_reference(
    prefix_blocks, own_lens, num_heads, num_kv_heads, head_dim, block_size, prefix_len, dtype
):
    query, key_cache, value_cache, block_tables, seq_lens, query_rows = _shared_batch(
        prefix_blocks, own_lens, num_heads, num_kv_heads, head_dim, block_size, dtype
    )
    tol = TILE_TOLERANCE[dtype]
    scale = head_dim**-0.5
    out, _, _ = _cascade(
        query, key_cache, value_cache, block_tables, seq_lens, query_rows, prefix_len, scale
    )
    expected = paged_attention_reference(
        query[query_rows].float(), key_cache.float(), value_cache.float(), block_tables,
        list(range(len(seq_lens) + 1)), seq_lens, scale,
    )  # fmt: skip
    torch.testing.assert_close(out[query_rows].float(), expected, atol=tol, rtol=tol)
    untouched = torch.ones(query.shape[0], dtype=torch.bool)
    untouched[query_rows] = False
    assert out[untouched].abs().sum() == 0
    # The same rows through the decode kernel alone agree to bf16 rounding.
    plain = torch.zeros(query.shape, dtype=query.dtype)
    kernels.paged_attention_decode(
        query, key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32),
        query_rows, plain, scale, 0,
    )  # fmt: skip
    torch.testing.assert_close(out.float(), plain.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_float32_cascade_over_a_half_cache(cache_dtype):
    """A float32 model's bf16/fp16 cache (kv_half.h): the prefix tiles and the
    decode kernel both widen the half rows."""
    query, key_cache, value_cache, block_tables, seq_lens, query_rows = _shared_batch(
        5, [1, 7, 8, 9, 30], 8, 2, 64, 8, torch.float32, seed=2
    )
    key_cache, value_cache = key_cache.to(cache_dtype), value_cache.to(cache_dtype)
    scale = 0.125
    out, _, _ = _cascade(
        query, key_cache, value_cache, block_tables, seq_lens, query_rows, 40, scale
    )
    expected = paged_attention_reference(
        query[query_rows], key_cache.float(), value_cache.float(), block_tables,
        list(range(len(seq_lens) + 1)), seq_lens, scale,
    )  # fmt: skip
    tol = TILE_TOLERANCE[torch.float32]
    torch.testing.assert_close(out[query_rows], expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", TILE_DTYPES)
def test_prefix_half_is_attention_over_the_prefix_alone(dtype):
    """Row s * group + g of kv head h is query head h * group + g of sequence s,
    normalised over the prefix, with the log-sum-exp of its scaled scores."""
    query, key_cache, value_cache, block_tables, seq_lens, query_rows = _shared_batch(
        3, [5, 9], 6, 2, 64, 16, dtype
    )
    tol = TILE_TOLERANCE[dtype]
    scale, prefix_len = 0.125, 40
    _, prefix_out, prefix_lse = _cascade(
        query, key_cache, value_cache, block_tables, seq_lens, query_rows, prefix_len, scale
    )
    keys = key_cache[block_tables[0, :3].long()].flatten(0, 1)[:prefix_len].float()
    values = value_cache[block_tables[0, :3].long()].flatten(0, 1)[:prefix_len].float()
    for s, row in enumerate(query_rows.tolist()):
        for head in range(6):
            h, g = divmod(head, 3)
            scores = keys[:, h] @ query[row, head].float() * scale  # [prefix_len]
            expected = torch.softmax(scores, 0) @ values[:, h]
            torch.testing.assert_close(prefix_out[h, s * 3 + g], expected, atol=tol, rtol=tol)
            lse = torch.logsumexp(scores, 0)
            torch.testing.assert_close(prefix_lse[h, s * 3 + g], lse, atol=tol, rtol=tol)


def test_decode_rejects_a_prefix_covering_a_whole_sequence():
    query, key_cache, value_cache, block_tables, seq_lens, query_rows = _shared_batch(
        2, [1, 4], 2, 1, 64, 16, torch.float32
    )
    rows = 2 * 2  # sequences x group
    with pytest.raises(RuntimeError, match="has no token past the prefix"):
        kernels.paged_attention_decode(
            query, key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32),
            query_rows, torch.zeros(query.shape, dtype=query.dtype), 0.125, 0, 33,
            torch.zeros(1, rows, 64), torch.zeros(1, rows),
        )  # fmt: skip
