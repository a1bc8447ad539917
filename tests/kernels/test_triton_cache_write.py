"""The Triton KV cache write equals the reference scatter; slot -1 writes nothing."""

from __future__ import annotations

import torch

from kernels.paged_attention_reference import write_kv_reference


def test_write_skips_padding_slots(triton_device):
    device = triton_device
    from kernels.triton.cache_write import write_kv_cache

    gen = torch.Generator().manual_seed(0)
    num_blocks, block_size, num_kv_heads, head_dim = 300, 16, 3, 64  # 3 heads: padded to 4
    for dtype in (torch.float32, torch.bfloat16):
        # The triton backend's layout: K and V halves of one tensor, strided views.
        kv = torch.randn(num_blocks, 2, block_size, num_kv_heads, head_dim, generator=gen)
        kv = kv.to(dtype).to(device)
        want = kv.clone()
        qkv = torch.randn(6, 2 * num_kv_heads * head_dim + 128, generator=gen).to(dtype).to(device)
        key = qkv[:, 128 : 128 + num_kv_heads * head_dim].view(6, num_kv_heads, head_dim)
        value = qkv[:, 128 + num_kv_heads * head_dim :].view(6, num_kv_heads, head_dim)
        slots = torch.tensor([5, -1, 4799, 16, -1, 2000], device=device)  # 4799: the last slot
        write_kv_cache(key, value, kv[:, 0], kv[:, 1], slots)
        keep = slots >= 0
        write_kv_reference(key[keep], value[keep], want[:, 0], want[:, 1], slots[keep])
        assert torch.equal(kv, want)
