"""The fixtures' packer writes the words compressed-tensors' own packer writes
(compressed-tensors is a dev dependency): the same little-endian codes + 2**(bits-1)
it stores for pack-quantized, and, packed along dim 0, GPTQ's qweight layout."""

from __future__ import annotations

import pytest
import torch

from bench.quantized_checkpoints import pack_columns, pack_rows, quantize_gptq

pack_to_int32 = pytest.importorskip("compressed_tensors.compressors").pack_to_int32


@pytest.mark.parametrize("bits", [4, 8])
def test_packs_bit_for_bit_as_compressed_tensors(bits):
    gen = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (48, 64), generator=gen)
    signed = (codes - 2 ** (bits - 1)).to(torch.int8)
    assert torch.equal(pack_columns(codes, bits), pack_to_int32(signed, bits, packed_dim=1))
    assert torch.equal(pack_rows(codes, bits), pack_to_int32(signed, bits, packed_dim=0))


def test_gptq_fixture_words_and_zero_minus_one():
    weight = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)) * 0.1
    tensors, dense = quantize_gptq(weight, bits=4, group_size=32, sym=True)
    assert tensors["qweight"].shape == (8, 32) and tensors["qweight"].dtype == torch.int32
    assert tensors["qzeros"].shape == (2, 4) and tensors["scales"].dtype == torch.float16
    # Symmetric 4-bit: zero 8 stored as 7 in every nibble.
    assert int(tensors["qzeros"][0, 0]) == 0x77777777
    assert torch.equal(tensors["g_idx"], torch.arange(64, dtype=torch.int32) // 32)
    assert (dense - weight).abs().max() <= tensors["scales"].float().max()
