"""A layer's bound CPU attention (cpu_bound.py) equals the backend's generic forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worker.attention.backends import get_attention_backend
from worker.attention.backends.cpu_metadata import mixed_metadata
from worker.attention.forward_context import forward_context
from worker.attention.metadata import BatchLayout
from worker.layers.attention import Attention


def _step(shapes, num_kv_heads, head_dim, block_size, num_blocks, dtype, seed, prefix=0):
    """Random caches and q/k/v for sequences of (cached, new) tokens, the decode
    ones sharing their first `prefix` blocks, with the step's layout:
    (layout, q2d, k2d, v2d, kv_cache [2, blocks, size, heads, dim])."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    shared = [perm.pop() for _ in range(prefix)]
    width = max(-(-(c + n) // block_size) for c, n in shapes)
    tables = np.zeros((len(shapes), width), dtype=np.int32)
    slots, starts, lens = [], [0], []
    for i, (cached, new) in enumerate(shapes):
        total = cached + new
        own = shared if new == 1 else []
        blocks = own + [perm.pop() for _ in range(-(-total // block_size) - len(own))]
        tables[i, : len(blocks)] = blocks
        pos = np.arange(cached, total)
        slots.append(np.asarray(blocks)[pos // block_size] * block_size + pos % block_size)
        starts.append(starts[-1] + new)
        lens.append(total)
    layout = BatchLayout(
        query_start_loc=np.asarray(starts, dtype=np.int32),
        seq_lens=np.asarray(lens, dtype=np.int32),
        block_tables=tables,
        slot_mapping=np.concatenate(slots).astype(np.int64),
    )
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    num_tokens = starts[-1]
    qkv = torch.randn(num_tokens, (6 + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    kv_size = num_kv_heads * head_dim
    q, k, v = qkv.split_with_sizes([6 * head_dim, kv_size, kv_size], -1)  # views, as in a model
    return layout, q, k, v, kv_cache.to(dtype)


MIXED = [(9, 1), (0, 7), (8, 5), (3, 1)]


@pytest.mark.parametrize(
    "shapes, prefix, window, head_dim, dtype",
    [
        (MIXED, 0, None, 16, torch.float32),
        (MIXED, 0, 6, 16, torch.float32),
        (MIXED, 0, None, 24, torch.float32),  # a head_dim the kernels do not take
        (MIXED, 0, 5, 64, torch.bfloat16),
        ([(20, 1), (3, 1), (40, 1)], 0, None, 64, torch.bfloat16),
        ([(160 + n, 1) for n in range(10)] + [(0, 20)], 10, None, 64, torch.float32),
        ([(160 + n, 1) for n in range(10)], 10, None, 64, torch.bfloat16),
    ],
    ids=["mixed", "window", "fallback", "bf16-window", "decode", "cascade", "cascade-bf16"],
)
def test_bound_layer_equals_backend_forward(shapes, prefix, window, head_dim, dtype):
    num_heads, num_kv_heads, block_size = 6, 2, 16
    num_blocks = sum(-(-(c + n) // block_size) for c, n in shapes) + 4
    layout, q, k, v, kv_cache = _step(
        shapes, num_kv_heads, head_dim, block_size, num_blocks, dtype, seed=3, prefix=prefix
    )
    backend = get_attention_backend("cpu", "cpu")
    arrays = {n: torch.from_numpy(a) for n, a in backend.device_arrays(layout).items()}
    n = q.shape[0]
    expected_cache = kv_cache.clone()
    expected = backend.forward(
        q.reshape(n, num_heads, head_dim),
        k.reshape(n, num_kv_heads, head_dim),
        v.reshape(n, num_kv_heads, head_dim),
        expected_cache,
        backend.build_metadata(layout, arrays),
        head_dim**-0.5,
        window,
    ).reshape(n, -1)
    layers = [
        Attention(num_heads, head_dim, head_dim**-0.5, num_kv_heads, window) for _ in range(2)
    ]
    caches = [kv_cache.clone() for _ in layers]
    for layer, cache in zip(layers, caches):
        layer.kv_cache, layer.backend = cache, backend
    metadata = backend.build_metadata(layout, arrays)
    assert metadata.cascade_blocks == prefix  # the cascade cases take the cascade
    with forward_context(metadata):
        first = layers[0].forward(q, k, v).clone()
        second = layers[1].forward(q, k, v)
    torch.testing.assert_close(first, expected, atol=0, rtol=0)
    torch.testing.assert_close(second, expected, atol=0, rtol=0)
    for cache in caches:
        torch.testing.assert_close(cache, expected_cache, atol=0, rtol=0)


def test_rebinding_the_cache_drops_the_bound_attention():
    backend = get_attention_backend("cpu", "cpu")
    layer = Attention(6, 16, 0.25, 2)
    layer.kv_cache, layer.backend = torch.zeros(2, 4, 16, 2, 16), backend
    layout, q, k, v, _ = _step([(3, 1)], 2, 16, 16, 4, torch.float32, seed=4)
    arrays = {n: torch.from_numpy(a) for n, a in backend.device_arrays(layout).items()}
    with forward_context(backend.build_metadata(layout, arrays)):
        layer.forward(q, k, v)
        assert layer._bound is not None
        fresh = torch.zeros(2, 4, 16, 2, 16)
        layer.kv_cache = fresh
        assert layer._bound is None
        layer.forward(q, k, v)
    assert fresh.abs().sum() > 0  # the new token's K/V landed in the new cache


@pytest.mark.parametrize("num_seqs", [1, 3, 10])
def test_decode_only_metadata_equals_the_mixed_build(num_seqs):
    backend = get_attention_backend("cpu", "cpu")
    shapes = [(160 + 7 * i, 1) for i in range(num_seqs)]
    layout = _step(shapes, 2, 16, 16, 200, torch.float32, seed=5, prefix=10)[0]
    arrays = {n: torch.from_numpy(a) for n, a in backend.device_arrays(layout).items()}
    fast = backend.build_metadata(layout, arrays)
    general = mixed_metadata(layout, arrays)
    assert fast.cascade_blocks == (10 if num_seqs >= 8 else 0)
    for name, value in vars(general).items():
        got = getattr(fast, name)
        if isinstance(value, torch.Tensor):
            assert got.dtype == value.dtype and got.shape == value.shape, name
            assert torch.equal(got, value), name
        else:
            assert got == value, name
