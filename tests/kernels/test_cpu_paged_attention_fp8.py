"""The FP8 KV cache kernels (kernels/cpu/paged_attention_fp8.cpp) against their
plain-PyTorch twins: the cache bytes they write, and attention over e4m3 caches
for decode rows, whole prompts, chunks over a cached context and sliding windows."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import load_fp8_kv_kernels
from kernels.paged_attention_reference import paged_attention_reference, write_kv_reference

kernels = load_fp8_kv_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="the C++ kernels did not build here")
FP8 = torch.float8_e4m3fn


def _every_rounding_case(gen: torch.Generator) -> torch.Tensor:
    """Random floats over 7 decades, every finite e4m3 value, the midpoints between
    neighbours (ties) and one float32 step either side of them, overflow and zeros."""
    finite = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    finite = finite[~finite.isnan()].sort().values
    mids = (finite[1:] + finite[:-1]) / 2
    up, down = torch.tensor(float("inf")), torch.tensor(float("-inf"))
    return torch.cat(
        [
            *(torch.randn(4096, generator=gen) * s for s in (1e-4, 1e-2, 1.0, 100.0, 1e3)),
            finite,
            mids,
            torch.nextafter(mids, up),
            torch.nextafter(mids, down),
            torch.tensor([448.0, 449.0, 464.0, 480.0, 1e30, -1e30, 0.0, -0.0]),
        ]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.37, 3.0)])
def test_cache_write_bytes_equal_twin(dtype, scales):
    gen = torch.Generator().manual_seed(0)
    values = _every_rounding_case(gen)
    values = torch.cat([values, torch.zeros(-values.numel() % 32)]).to(dtype)
    rows = values.view(-1, 2, 16)  # [tokens, kv_heads, head_dim]
    num_tokens = rows.shape[0]
    slots = torch.randperm(num_tokens + 5, generator=gen)[:num_tokens]
    shape = (-(-(num_tokens + 5) // 4), 4, 2, 16)
    got = [torch.zeros(shape, dtype=FP8) for _ in range(2)]
    want = [torch.zeros(shape, dtype=FP8) for _ in range(2)]
    value_rows = rows.flip(0)
    kernels.write_kv_cache_fp8(rows, value_rows, *got, slots, *scales)
    write_kv_reference(rows, value_rows, *want, slots, *scales)
    for g, w in zip(got, want):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


def test_every_byte_widens_exactly():
    """Attention over one token returns v_scale * its V row: every finite byte,
    subnormals included, comes back as torch widens it."""
    finite = torch.arange(256, dtype=torch.uint8)
    finite = finite[~finite.view(FP8).float().isnan()]  # 254 codes
    codes = torch.cat([finite, finite[:2]]).view(1, 1, 16, 16)  # [block, token, kv head, dim]
    value_cache = codes.view(FP8).reshape(1, 1, 16, 16)
    key_cache = torch.zeros_like(value_cache)
    query = torch.ones(1, 16, 16)
    out = torch.zeros_like(query)
    kernels.paged_attention_fp8(
        query,
        key_cache,
        value_cache,
        torch.zeros(1, 1, dtype=torch.int32),
        torch.ones(1, dtype=torch.int32),
        torch.tensor([0, 1], dtype=torch.int64),
        out,
        0.25,
        1.0,
        2.0,
    )
    assert torch.equal(out[0], value_cache[0, 0].float() * 2.0)


def _batch(seq_lens, num_new, num_heads, num_kv_heads, head_dim, block_size, dtype, gen):
    """An fp8 cache filled by the twin (scattered blocks), queries for each
    sequence's last num_new positions as a view of fused QKV rows."""
    max_blocks = max(-(-n // block_size) for n in seq_lens)
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 2
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    slots = []
    for i, n in enumerate(seq_lens):
        blocks = [perm.pop() for _ in range(-(-n // block_size))]
        tables[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(n)]
    total = sum(seq_lens)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.zeros(shape, dtype=FP8) for _ in range(2)]
    rows = sum(num_new)
    qkv = torch.randn(rows, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    query = qkv[:, : num_heads * head_dim].view(rows, num_heads, head_dim)
    kv = (torch.randn(2, total, num_kv_heads, head_dim, generator=gen) * 3).to(dtype)
    return query, kv, caches, tables, torch.tensor(slots, dtype=torch.int64)


@pytest.mark.parametrize(
    "seq_lens, num_new, num_heads, num_kv_heads, head_dim, block_size, window",
    [
        # decode rows: a GQA group of 6 (Qwen2.5-1.5B's 12/2), lengths around 16
        ([1, 15, 16, 17, 40, 300], [1] * 6, 12, 2, 128, 16, None),
        # whole prompts and chunks over a cached context, mixed with decode rows
        ([33, 100, 64, 7], [33, 40, 1, 7], 9, 3, 64, 16, None),
        # MHA, head_dim 32, another block size, a sliding window
        ([129, 50, 20], [129, 1, 5], 4, 4, 32, 8, 37),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_matches_twin(
    seq_lens, num_new, num_heads, num_kv_heads, head_dim, block_size, window, dtype
):
    gen = torch.Generator().manual_seed(1)
    query, kv, caches, tables, slots = _batch(
        seq_lens, num_new, num_heads, num_kv_heads, head_dim, block_size, dtype, gen
    )
    k_scale, v_scale = (
        0.05,
        0.02,
    )  # |K| and |V| up to ~15: saturates some codes, as a real scale would not
    write_kv_reference(kv[0], kv[1], *caches, slots, k_scale, v_scale)
    starts = [0]
    for n in num_new:
        starts.append(starts[-1] + n)
    scale = head_dim**-0.5
    out = torch.zeros(query.shape, dtype=dtype)
    kernels.paged_attention_fp8(
        query,
        *caches,
        tables,
        torch.tensor(seq_lens, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int64),
        out,
        scale,
        k_scale,
        v_scale,
        window or 0,
    )
    # The twin in float32: the kernel accumulates in float32 and rounds once.
    want = paged_attention_reference(
        query.float(), *caches, tables, starts, seq_lens, scale, window, k_scale, v_scale
    )
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)


def test_bad_input_is_refused():
    cache = torch.zeros(2, 4, 1, 16, dtype=FP8)
    rows = torch.zeros(1, 1, 16)
    with pytest.raises(RuntimeError, match="out of range"):
        kernels.write_kv_cache_fp8(rows, rows, cache, cache.clone(), torch.tensor([8]))
    with pytest.raises(RuntimeError, match="float8_e4m3fn"):
        kernels.write_kv_cache_fp8(rows, rows, cache.float(), cache.float(), torch.tensor([0]))
    out = torch.zeros(1, 1, 16)
    with pytest.raises(RuntimeError, match="block 7 out of range"):
        kernels.paged_attention_fp8(
            rows,
            cache,
            cache,
            torch.tensor([[7]], dtype=torch.int32),
            torch.tensor([3], dtype=torch.int32),
            torch.tensor([0, 1]),
            out,
            1.0,
        )
