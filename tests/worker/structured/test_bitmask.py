from __future__ import annotations

import pytest
import torch

from worker.structured.bitmask import (
    allocate_bitmask,
    apply_bitmask,
    apply_bitmask_reference,
    unpack_bitmask,
)


def test_unpack_reads_bit_j_of_word_w_as_token_32w_plus_j():
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    bitmask[0, 0] = 1 - 2**31  # bits 0 and 31 (the sign bit): tokens 0 and 31
    bitmask[0, 1] = 1 << 3  # token 35
    allowed = unpack_bitmask(bitmask, 40)
    assert allowed.shape == (1, 40)
    assert allowed[0].nonzero().flatten().tolist() == [0, 31, 35]
    assert unpack_bitmask(allocate_bitmask(2, 40), 40).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_its_twin_on_the_constrained_rows_only(dtype):
    generator = torch.Generator().manual_seed(0)
    vocab_size, rows = 77, [0, 2]
    logits = torch.randn(3, vocab_size, generator=generator).to(dtype)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (2, 3), generator=generator, dtype=torch.int32)
    expected, got = logits.clone(), logits.clone()
    apply_bitmask_reference(expected, bitmask, rows)
    got = apply_bitmask(got, bitmask, rows)
    assert got.dtype == torch.float32  # on CPU: xgrammar's kernel, in float32
    assert torch.equal(got, expected.float())
    allowed = unpack_bitmask(bitmask, vocab_size)
    for i, row in enumerate(rows):
        assert torch.equal(got[row][allowed[i]], logits[row][allowed[i]])
        assert torch.isneginf(got[row][~allowed[i]]).all()
    assert torch.equal(got[1], logits[1])  # unconstrained row untouched
