"""The 8-bit weight-only linear (int8 and FP8 e4m3 codes, one scale per output
row, AVX512-BF16): codes decode to their exact values, and products match a
float64 product of the dequantized weight."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import load_weight_only_kernels

kernels = load_weight_only_kernels()
pytestmark = pytest.mark.skipif(
    kernels is None or not kernels.supported(),
    reason="the weight-only linear needs the C++ build on a CPU with AVX512-BF16",
)
FP8 = torch.float8_e4m3fn


def _codes(kind: str, n: int, k: int, gen) -> torch.Tensor:
    if kind == "int8":
        return torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    # Every e4m3 bit pattern but the two NaNs: subnormals, zeros of both signs, 448.
    bits = torch.randint(0, 256, (n, k), generator=gen, dtype=torch.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0x7E
    return bits.view(FP8)


def test_panels_hold_column_pairs():
    weight = torch.arange(64 * 6).view(64, 6).to(torch.int8)
    packed = kernels.pack_byte_panels(weight)
    assert packed.shape == (2, 3, 64) and packed.dtype == torch.uint8
    assert packed[1, 2, :4].tolist() == [weight[32, 4], weight[32, 5], weight[33, 4], weight[33, 5]]


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_every_code_decodes_exactly(kind):
    gen = torch.Generator().manual_seed(0)
    weight = _codes(kind, 64, 256, gen)
    if kind == "fp8":  # all 254 non-NaN patterns, in order, twice over the rows
        weight = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(64, 1)
        weight[(weight & 0x7F) == 0x7F] = 0
        weight = weight.view(FP8)
    eye = torch.eye(256, dtype=torch.bfloat16)  # row i picks input i: out = W^T, one product each
    out = kernels.weight_only_linear(
        eye, kernels.pack_byte_panels(weight), torch.ones(64), None, fp8=kind == "fp8"
    )
    assert torch.equal(out, weight.to(torch.float32).to(torch.bfloat16).T)


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("rows", [1, 5, 12, 13, 32, 70])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_a_float64_product(kind, rows, bias):
    gen = torch.Generator().manual_seed(rows)
    weight = _codes(kind, 96, 200, gen)
    scales = torch.rand(96, generator=gen) * 0.01 + 1e-3
    x = torch.randn(rows, 200, generator=gen).to(torch.bfloat16)
    b = torch.randn(96, generator=gen).to(torch.bfloat16) if bias else None
    out = kernels.weight_only_linear(
        x, kernels.pack_byte_panels(weight), scales, b, fp8=kind == "fp8"
    )
    dense = weight.to(torch.float64) * scales.double()[:, None]
    expected = x.double() @ dense.T + (b.double() if bias else 0)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 96)
    # bf16 output rounding (2**-8 relative) over float32 accumulation.
    torch.testing.assert_close(
        out.double(), expected, atol=1e-2 * expected.abs().max().item(), rtol=8e-3
    )


def _int4(n, k, group, gen):
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = torch.rand(k // group, n, generator=gen) * 0.02 + 1e-3  # [groups, n]
    zeros = torch.randint(0, 16, (k // group, n), generator=gen).float()
    return codes, scales, zeros


def test_int4_panels_hold_nibble_pairs():
    codes = torch.randint(0, 16, (64, 6), dtype=torch.uint8)
    packed = kernels.pack_int4_panels(codes)
    assert packed.shape == (2, 3, 32)
    assert int(packed[1, 2, 1]) == int(codes[33, 4]) | int(codes[33, 5]) << 4


def test_every_nibble_decodes_exactly():
    codes = torch.arange(16, dtype=torch.uint8).repeat(32, 16)  # [32, 256]
    eye = torch.eye(256, dtype=torch.bfloat16)
    ones, zeros = torch.ones(1, 32), torch.zeros(1, 32)  # one group, zero point 8
    out = kernels.int4_linear(eye, kernels.pack_int4_panels(codes), ones, zeros, 256)
    assert torch.equal(out, (codes.float() - 8).to(torch.bfloat16).T)


@pytest.mark.parametrize("group", [32, 64, 200])
@pytest.mark.parametrize("rows", [1, 7, 12, 13, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_int4_linear_matches_a_float64_product(group, rows, bias):
    gen = torch.Generator().manual_seed(rows + group)
    codes, scales, zeros = _int4(64, 400 if group == 200 else 256, group, gen)
    k = codes.shape[1]
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(64, generator=gen).to(torch.bfloat16) if bias else None
    offsets = (scales * (zeros - 8)).contiguous()
    out = kernels.int4_linear(x, kernels.pack_int4_panels(codes), scales, offsets, group, b)
    g_idx = torch.arange(k) // group
    dense = (codes.double() - zeros.double().T[:, g_idx]) * scales.double().T[:, g_idx]
    expected = x.double() @ dense.T + (b.double() if bias else 0)
    torch.testing.assert_close(
        out.double(), expected, atol=1e-2 * expected.abs().max().item(), rtol=8e-3
    )
