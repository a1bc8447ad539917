"""The C++ decode kernel against its plain-PyTorch twin."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import load_cpu_kernels
from kernels.paged_attention_reference import paged_attention_reference

kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="no C++ toolchain to build the CPU kernels")


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, dtype, window",
    [
        (9, 3, 64, torch.float32, None),
        (4, 4, 16, torch.float32, None),
        (8, 1, 32, torch.float32, 7),
        (4, 2, 64, torch.bfloat16, None),
    ],
)
def test_decode_matches_reference(num_heads, num_kv_heads, head_dim, dtype, window):
    torch.manual_seed(0)
    block_size, num_blocks = 16, 64
    seq_lens = [1, 5, 16, 17, 100, 33]
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    perm = torch.randperm(num_blocks).tolist()
    block_tables = torch.zeros(len(seq_lens), 8, dtype=torch.int32)
    for i, n in enumerate(seq_lens):
        blocks = [perm.pop() for _ in range(-(-n // block_size))]
        block_tables[i, : len(blocks)] = torch.tensor(blocks)
    # Decode rows sit among other rows: rows 1, 3, 4, ... of a 12-row batch.
    rows = torch.tensor([1, 3, 4, 7, 9, 11])
    query = torch.randn(12, num_heads, head_dim).to(dtype)
    out = torch.zeros_like(query)
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
    expected = paged_attention_reference(
        query[rows],
        key_cache,
        value_cache,
        block_tables,
        list(range(len(seq_lens) + 1)),
        seq_lens,
        scale,
        window,
    )
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out[rows], expected, atol=tolerance, rtol=tolerance)
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[rows] = False
    assert out[untouched].abs().sum() == 0
