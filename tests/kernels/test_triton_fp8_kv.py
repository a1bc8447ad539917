"""The Triton kernels over an FP8 (e4m3) KV cache against the plain-PyTorch twins:
the cache bytes written (every rounding case, scaled), and attention on mixed
batches (decode rows, prefills, chunks over a cached prefix, split-K) with
k/v scales. Interpreted on CPU in the default suite, on CUDA under `gpu`."""

from __future__ import annotations

import torch

from kernels.paged_attention_reference import paged_attention_reference, write_kv_reference
from kernels.triton.attention_config import AttentionConfig

FP8 = torch.float8_e4m3fn


def _rounding_cases() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    finite = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    finite = finite[~finite.isnan()].sort().values
    mids = (finite[1:] + finite[:-1]) / 2
    return torch.cat(
        [
            torch.randn(2048, generator=gen) * 30,
            torch.randn(1024, generator=gen) * 0.01,
            finite,
            mids,
            torch.nextafter(mids, torch.tensor(float("inf"))),
            torch.nextafter(mids, torch.tensor(float("-inf"))),
            torch.tensor([448.0, 449.0, 464.0, 480.0, 1e30, -1e30, 0.0, -0.0]),
        ]
    )


def test_fp8_cache_write_bytes_equal_twin(triton_device):
    from kernels.triton.cache_write import write_kv_cache

    values = _rounding_cases()
    values = torch.cat([values, torch.zeros(-values.numel() % 64)])
    rows = values.view(-1, 2, 32)  # [tokens, kv_heads, head_dim]
    num_tokens = rows.shape[0]
    gen = torch.Generator().manual_seed(1)
    slots = torch.randperm(num_tokens + 7, generator=gen)[:num_tokens]
    shape = (-(-(num_tokens + 7) // 8), 2, 8, 2, 32)  # the backend's [blocks, K|V, ...]
    for k_scale, v_scale in ((1.0, 1.0), (0.37, 3.0)):
        kv = torch.zeros(shape, dtype=FP8, device=triton_device)
        want = torch.zeros(shape, dtype=FP8)
        write_kv_cache(
            rows.to(triton_device),
            rows.flip(0).to(triton_device),
            kv[:, 0],
            kv[:, 1],
            slots.to(triton_device),
            k_scale,
            v_scale,
        )
        write_kv_reference(rows, rows.flip(0), want[:, 0], want[:, 1], slots, k_scale, v_scale)
        assert torch.equal(kv.cpu().view(torch.uint8), want.view(torch.uint8))


def _fp8_batch(shapes, num_heads, num_kv_heads, head_dim, block_size, k_scale, v_scale):
    gen = torch.Generator().manual_seed(2)
    needed = sum(-(-s // block_size) for _, s in shapes)
    ids = torch.randperm(needed + 2, generator=gen).tolist()
    width = max(-(-s // block_size) for _, s in shapes)
    tables = torch.zeros(len(shapes), width, dtype=torch.int32)
    for i, (_, seq_len) in enumerate(shapes):
        n = -(-seq_len // block_size)
        tables[i, :n] = torch.tensor([ids.pop() for _ in range(n)])
    shape = (needed + 2, block_size, num_kv_heads, head_dim)
    caches = []
    for _ in range(2):
        dense = torch.randn(shape, generator=gen) * 3
        cache = torch.zeros(shape, dtype=FP8)
        slots = torch.arange(dense.shape[0] * block_size)
        write_kv_reference(
            dense.flatten(0, 1), dense.flatten(0, 1), cache, cache, slots, k_scale, v_scale
        )
        caches.append(cache)
    starts = [0]
    for q, _ in shapes:
        starts.append(starts[-1] + q)
    query = torch.randn(starts[-1], num_heads, head_dim, generator=gen)
    return query, caches, tables, starts, [s for _, s in shapes]


def test_fp8_attention_matches_twin(triton_device):
    from kernels.triton.paged_attention import paged_attention

    k_scale, v_scale = 0.05, 0.02
    shapes = [(1, 1), (1, 17), (7, 7), (5, 37), (1, 64)]
    query, caches, tables, starts, lens = _fp8_batch(shapes, 8, 2, 32, 8, k_scale, v_scale)
    want = paged_attention_reference(
        query, *caches, tables, starts, lens, 0.125, None, k_scale, v_scale
    )
    for config in (AttentionConfig(block_m=16, tile=16), AttentionConfig(16, 16, num_splits=4)):
        d = triton_device
        got = paged_attention(
            query.to(d),
            caches[0].to(d),
            caches[1].to(d),
            tables.to(d),
            torch.tensor(starts, dtype=torch.int32, device=d),
            torch.tensor(lens, dtype=torch.int32, device=d),
            len(lens),
            0.125,
            None,
            config,
            k_scale=k_scale,
            v_scale=v_scale,
        )
        torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=2e-5)
