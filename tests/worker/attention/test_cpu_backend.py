"""The CPU backend equals the reference backend on a mixed step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worker.attention.backends import get_attention_backend
from worker.attention.backends.cpu import shared_leading_blocks
from worker.attention.metadata import BatchLayout


def _run_step(
    name, qkv, caches, slot_mapping, block_tables, query_start_loc, seq_lens, scale, window
):
    """One attention call through backend `name` ("cpu", or "torch", the reference,
    run in float32 on the same values): (output, backend, metadata)."""
    backend = get_attention_backend(name, "cpu")
    layout = BatchLayout(
        query_start_loc=np.asarray(query_start_loc, dtype=np.int32),
        seq_lens=np.asarray(seq_lens, dtype=np.int32),
        block_tables=block_tables.numpy(),
        slot_mapping=slot_mapping.numpy(),
    )
    arrays = {n: torch.from_numpy(a) for n, a in backend.device_arrays(layout).items()}
    meta = backend.build_metadata(layout, arrays)
    q, k, v = (t.float() if name == "torch" else t for t in qkv)
    kv_cache = torch.stack(caches)  # [2, num_blocks, block_size, heads, dim]: the backends' layout
    out = backend.forward(q, k, v, kv_cache, meta, scale, window)
    for cache, written in zip(caches, kv_cache):
        cache.copy_(written)
    return out, backend, meta


@pytest.mark.parametrize(
    "window, head_dim, dtype",
    [
        (None, 16, torch.float32),
        (6, 16, torch.float32),
        (None, 24, torch.float32),
        (None, 64, torch.bfloat16),
        (5, 64, torch.bfloat16),
    ],
    ids=["full", "window", "fallback", "bf16", "bf16-window"],
)
def test_cpu_backend_matches_reference_on_a_mixed_step(window, head_dim, dtype):
    """head_dim 24 is not a multiple of 16: the backend falls back to the reference.
    bf16 with head_dim 64 takes the prefill kernel where the CPU has AMX or
    AVX512-BF16 (SDPA elsewhere); the reference then runs in fp32 on the same
    bf16 values."""
    torch.manual_seed(1)
    num_heads, num_kv_heads, block_size, num_blocks = 6, 2, 4, 40
    # (cached context, new tokens): decode, fresh prefill, chunk after a prefix, decode.
    shapes = [(9, 1), (0, 7), (8, 5), (3, 1)]
    perm = torch.randperm(num_blocks).tolist()
    block_tables = torch.zeros(len(shapes), 6, dtype=torch.int32)
    slots, query_start_loc, seq_lens = [], [0], []
    caches = {}
    for name in ("cpu", "torch"):
        caches[name] = (
            torch.zeros(num_blocks, block_size, num_kv_heads, head_dim),
            torch.zeros(num_blocks, block_size, num_kv_heads, head_dim),
        )
    for i, (cached, new) in enumerate(shapes):
        total = cached + new
        blocks = [perm.pop() for _ in range(-(-total // block_size))]
        block_tables[i, : len(blocks)] = torch.tensor(blocks)
        pos = torch.arange(total)
        slot = torch.tensor(blocks)[pos // block_size] * block_size + pos % block_size
        k, v = (
            torch.randn(cached, num_kv_heads, head_dim),
            torch.randn(cached, num_kv_heads, head_dim),
        )
        for key_cache, value_cache in caches.values():
            key_cache.view(-1, num_kv_heads, head_dim)[slot[:cached]] = k
            value_cache.view(-1, num_kv_heads, head_dim)[slot[:cached]] = v
        slots.append(slot[cached:])
        query_start_loc.append(query_start_loc[-1] + new)
        seq_lens.append(total)
    num_tokens = query_start_loc[-1]
    query = torch.randn(num_tokens, num_heads, head_dim).to(dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype)
    caches["cpu"] = tuple(c.to(dtype) for c in caches["cpu"])
    caches["torch"] = tuple(c.to(dtype).float() for c in caches["torch"])
    outputs = {
        name: _run_step(
            name, (query, key, value), cache_pair, torch.cat(slots), block_tables,
            query_start_loc, seq_lens, 0.25, window,
        )[0]
        for name, cache_pair in caches.items()
    }  # fmt: skip
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        outputs["cpu"].float(), outputs["torch"], atol=tolerance, rtol=tolerance
    )
    torch.testing.assert_close(caches["cpu"][0].float(), caches["torch"][0])


def test_shared_leading_blocks_counts_equal_columns_from_the_left():
    tables = torch.tensor([[4, 9, 2, 7], [4, 9, 3, 7], [4, 9, 2, 0]], dtype=torch.int32)
    assert shared_leading_blocks(tables) == 2
    assert shared_leading_blocks(tables[:1]) == 4
    assert shared_leading_blocks(torch.tensor([[1, 2], [3, 2]], dtype=torch.int32)) == 0


@pytest.mark.parametrize("shared", [0, 1, 7, 8, 9, 63, 64, 65, 511, 700])
def test_shared_leading_blocks_past_the_first_windows(shared):
    # 700 columns: runs that end inside, and at the edge of, the 1/8/64/512-column
    # windows the search widens through, and a run over the whole width.
    tables = torch.arange(3 * 700, dtype=torch.int32).reshape(3, 700)
    tables[:, :shared] = torch.arange(shared, dtype=torch.int32)
    tables[1:, shared + 1 :] = tables[0, shared + 1 :]  # equal again after the break
    assert shared_leading_blocks(tables) == shared
    assert shared_leading_blocks(tables[:, :shared]) == shared


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_rows_sharing_a_prefix_run_as_a_cascade(dtype):
    """10 decode sequences over one cached 160-token prefix, and a prefill in the
    same step: the cascade (float32 on every build, bf16 where the CPU runs the
    bf16 tiles) equals the reference."""
    torch.manual_seed(2)
    num_heads, num_kv_heads, head_dim, block_size = 6, 2, 64, 16
    own = [1, 5, 16, 17, 3, 30, 9, 2, 11, 20]  # tokens past the prefix, the last one new
    num_blocks = 10 + sum(-(-n // block_size) for n in own) + 4
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    perm = torch.randperm(num_blocks).tolist()
    prefix = [perm.pop() for _ in range(10)]
    block_tables = torch.zeros(len(own) + 1, 13, dtype=torch.int32)
    seq_lens, slots = [], []
    for i, n in enumerate(own):
        blocks = prefix + [perm.pop() for _ in range(-(-n // block_size))]
        block_tables[i, : len(blocks)] = torch.tensor(blocks)
        last = 160 + n - 1
        slots.append(blocks[last // block_size] * block_size + last % block_size)
        seq_lens.append(160 + n)
    prefill_blocks = [perm.pop() for _ in range(2)]  # a fresh 20-token prompt
    block_tables[len(own), :2] = torch.tensor(prefill_blocks)
    slots += [prefill_blocks[p // block_size] * block_size + p % block_size for p in range(20)]
    seq_lens.append(20)
    query_start_loc = list(range(len(own) + 1)) + [len(own) + 20]
    num_tokens = query_start_loc[-1]
    query = torch.randn(num_tokens, num_heads, head_dim).to(dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype)
    outputs = {}
    for name in ("cpu", "torch"):
        caches = [c.clone() if name == "cpu" else c.float() for c in (key_cache, value_cache)]
        outputs[name], backend, meta = _run_step(
            name, (query, key, value), caches, torch.tensor(slots), block_tables,
            query_start_loc, seq_lens, 0.125, None,
        )  # fmt: skip
        if name == "cpu":
            assert meta.cascade_blocks == 10
            assert meta.decode_min_len == 161
            prefix_len = backend._cascade_prefix_len(query, caches[0], meta, None)
            assert prefix_len == (160 if backend._kernel_prefill(query) else 0)
            assert backend._cascade_prefix_len(query, caches[0], meta, 64) == 0
    tolerance = 2e-2 if dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(
        outputs["cpu"].float(), outputs["torch"], atol=tolerance, rtol=tolerance
    )
