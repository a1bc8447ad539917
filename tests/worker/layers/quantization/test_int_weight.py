"""The integer weight-only kernels against their dequantize-then-matmul twin,
and the on-disk unpacking against the fixtures' own packer."""

from __future__ import annotations

import pytest
import torch

from bench.quantized_checkpoints import AWQ_ORDER, pack_columns, pack_rows
from worker.layers.linear import ReplicatedLinear
from worker.layers.quantization.awq import unpack_awq
from worker.layers.quantization.int_weight import (
    apply_int_weight,
    dequantize,
    int_weight_dense,
    pack_nibbles,
    set_int_weight,
    unpack_int32,
    unpack_nibbles,
)

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=0.05, rtol=0.02)}


def _codes(out_features, in_features, bits, num_groups, seed=0, act_order=False):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (out_features, in_features), generator=gen)
    scales = torch.rand(out_features, num_groups, generator=gen) * 0.02 + 0.001
    zeros = torch.randint(0, 2**bits, (out_features, num_groups), generator=gen).float()
    g_idx = torch.arange(in_features) // (in_features // num_groups)
    if act_order:
        g_idx = g_idx[torch.randperm(in_features, generator=gen)]
    return codes, scales, zeros, g_idx


def _layer(codes, scales, zeros, g_idx, bits, dtype, kernel=None):
    layer = ReplicatedLinear(codes.shape[1], codes.shape[0], params_dtype=dtype)
    set_int_weight(layer, ["weight"], codes, scales, zeros, g_idx, bits, dtype, kernel)
    return layer


@pytest.mark.parametrize(
    ("bits", "groups", "act_order", "symmetric", "kernel"),
    [
        (8, 1, False, True, "int8pack"),
        (8, 4, False, False, "dequant"),
        (4, 4, False, False, "int4pack"),  # groups of 64
        (4, 1, False, False, "int4pack"),  # one group of 256: torch's 256
        (4, 8, True, False, "int4pack"),  # act-order groups of 32, inputs sorted
        (4, 2, True, False, "int4pack"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_dequantize_twin(bits, groups, act_order, symmetric, kernel, dtype):
    codes, scales, zeros, g_idx = _codes(48, 256, bits, groups, act_order=act_order)
    if symmetric:
        zeros = torch.full_like(zeros, 2 ** (bits - 1))
    layer = _layer(codes, scales, zeros, g_idx, bits, dtype)
    assert layer.int_kernel == kernel
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(1)).to(dtype)
    bias = torch.randn(48).to(dtype)
    expected = torch.nn.functional.linear(
        x.float(),
        dequantize(codes, scales.to(dtype), zeros.to(dtype), g_idx, torch.float32),
        bias.float(),
    )
    got = apply_int_weight(layer, x, bias)
    assert got.dtype == dtype and got.shape == (7, 48)
    # float32: summation order; bf16: the kernels' bf16 rounding of x W.
    atol = 1e-4 if dtype == torch.float32 else 0.06 * expected.abs().max().item()
    torch.testing.assert_close(got.float(), expected, atol=atol, rtol=0.02)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_twin_weight_is_the_dequantized_weight_bit_for_bit(act_order, dtype):
    codes, scales, zeros, g_idx = _codes(40, 96, 4, 3, act_order=act_order)
    layer = _layer(codes, scales, zeros, g_idx, 4, dtype, kernel="dequant")
    assert layer.int_weight.dtype == torch.uint8 and layer.int_weight.shape == (40, 48)
    w = dequantize(codes, scales.to(dtype), zeros.to(dtype), g_idx, dtype)
    perm = layer.input_perm  # act-order: stored with inputs sorted by group
    assert (perm is not None) == act_order
    assert torch.equal(int_weight_dense(layer, dtype), w if perm is None else w[:, perm])
    x = torch.randn(3, 96).to(dtype)
    expected = torch.nn.functional.linear(x.float(), w.float())
    torch.testing.assert_close(apply_int_weight(layer, x, None).float(), expected, **TOL[dtype])


def test_twin_when_groups_differ_in_size():
    codes, scales, zeros, _ = _codes(32, 64, 4, 2)
    g_idx = torch.tensor([0] * 40 + [1] * 24)
    assert _layer(codes, scales, zeros, g_idx, 4, torch.float32).int_kernel == "dequant"


def test_nibble_packing_round_trips():
    codes = torch.randint(0, 16, (5, 12), dtype=torch.uint8)
    assert torch.equal(unpack_nibbles(pack_nibbles(codes)), codes)


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_words_unpack_to_the_packed_codes(bits):
    codes = torch.randint(0, 2**bits, (64, 24))
    assert torch.equal(unpack_int32(pack_rows(codes, bits), bits, dim=0), codes.int())
    assert torch.equal(unpack_int32(pack_columns(codes, bits), bits, dim=1), codes.int())


def test_awq_words_unpack_in_the_interleaved_order():
    codes = torch.arange(16).repeat(3, 1)  # column c holds c
    words = pack_columns(codes, 4, AWQ_ORDER)
    # Word 0 holds columns 0,2,4,6,1,3,5,7 from the lowest nibble up.
    assert [(int(words[0, 0]) >> (4 * k)) & 15 for k in range(8)] == list(AWQ_ORDER)
    assert torch.equal(unpack_awq(words), codes.int())


@pytest.mark.parametrize("method", ["int8", "fp8"])
def test_byte_panel_kernel_matches_its_twin_in_bf16(method):
    """8-bit per-row weights with bf16 activations take kernels/cpu/gemm_weight_only.cpp
    where it builds; its output equals the dequantize-then-matmul twin to bf16 rounding."""
    from kernels.cpu import load_weight_only_kernels
    from worker.layers.quantization import resolve_quantization
    from worker.layers.quantization.fp8_weight import dequantize_fp8

    kernels = load_weight_only_kernels()
    if kernels is None or not kernels.supported():
        pytest.skip("the weight-only kernel needs AVX512-BF16")
    layer = ReplicatedLinear(
        160, 96, bias=True, quant_config=resolve_quantization(None, method),
        params_dtype=torch.bfloat16,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(3)
    layer.weight.data.copy_(torch.randn(96, 160, generator=gen) * 0.05)
    layer.bias.data.copy_(torch.randn(96, generator=gen))
    layer.process_weights_after_loading()
    x = torch.randn(9, 160, generator=gen).to(torch.bfloat16)
    if method == "int8":
        assert layer.int_kernel == "int8panel" and layer.int_weight.shape == (3, 80, 64)
        w = (
            layer.int_weight.view(3, 80, 32, 2)
            .permute(0, 2, 1, 3)
            .reshape(96, 160)
            .view(torch.int8)
        )
        w = w.float() * layer.int_scales[:, None]
    else:
        assert layer.fp8_kernel and layer.fp8_weight.shape == (3, 80, 64)
        codes = layer.fp8_weight.view(3, 80, 32, 2).permute(0, 2, 1, 3).reshape(96, 160)
        w = dequantize_fp8(
            codes.view(torch.float8_e4m3fn), layer.fp8_scales[:, None], torch.float32
        )
    expected = torch.nn.functional.linear(x.float(), w, layer.bias.float())
    torch.testing.assert_close(layer(x).float(), expected, atol=0.03, rtol=0.01)


@pytest.mark.parametrize(("groups", "act_order"), [(4, False), (8, True), (1, False)])
def test_int4_panel_kernel_matches_its_twin_in_bf16(groups, act_order):
    from kernels.cpu import load_weight_only_kernels

    kernels = load_weight_only_kernels()
    if kernels is None or not kernels.supported():
        pytest.skip("the weight-only kernel needs AVX512-BF16")
    codes, scales, zeros, g_idx = _codes(96, 256, 4, groups, act_order=act_order)
    layer = _layer(codes, scales, zeros, g_idx, 4, torch.bfloat16)
    assert layer.int_kernel == "int4panel" and layer.int_weight.shape == (3, 128, 32)
    x = torch.randn(21, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    bias = torch.randn(96).to(torch.bfloat16)
    w = dequantize(codes, scales, zeros, g_idx, torch.float32)
    expected = torch.nn.functional.linear(x.float(), w, bias.float())
    atol = 0.02 * expected.abs().max().item()
    torch.testing.assert_close(
        apply_int_weight(layer, x, bias).float(), expected, atol=atol, rtol=0.02
    )
