"""The Triton weight-only GEMMs (int4 in groups, FP8 per row and per block)
against the dequantize-then-matmul twins, directly and through the layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worker.layers.linear import ReplicatedLinear
from worker.layers.quantization.fp8_weight import (
    FP8,
    apply_fp8_weight,
    dequantize_fp8,
    quantize_fp8_rows,
    set_fp8_weight,
)
from worker.layers.quantization.int_weight import (
    apply_int_weight,
    choose_kernel,
    dequantize,
    pack_nibbles,
    set_int_weight,
)

# float32: summation order only. Half precision: W is rounded to it once here but
# per factor in the twin (the fp8 twin rounds each row's scale to it: a relative
# 5e-4 on outputs of size ~10), and the output rounds once: an ulp or so apart.
TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-5),
    torch.float16: dict(atol=1e-2, rtol=2e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}


def _dtypes(device):
    """bf16 too in the interpreter: the kernels upcast its dot tiles to float32 there."""
    return [torch.float32, torch.float16, torch.bfloat16]


def _int4(n, k, group, seed):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    scales = torch.rand(n, k // group, generator=gen) * 0.02 + 0.001
    zeros = torch.randint(0, 16, (n, k // group), generator=gen).float()  # asymmetric
    return codes, scales, zeros


def _x(m, k, seed, dtype):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize(
    ("m", "n", "k", "group", "tiles"),
    [
        (1, 48, 64, 32, (16, 32, 32)),  # decode row; N not a multiple of the N tile
        (19, 32, 128, 64, (16, 32, 32)),  # M past one tile; two K tiles per group
        (5, 16, 96, 16, (16, 16, 16)),  # the smallest group, six of them
    ],
)
def test_int4_gemm_matches_twin(triton_device, m, n, k, group, tiles):
    from kernels.triton.weight_only_gemm import GemmTiles, int4_gemm

    device = triton_device
    codes, scales, zeros = _int4(n, k, group, seed=m)
    g_idx = torch.arange(k) // group
    bias = torch.randn(n, generator=torch.Generator().manual_seed(7))
    packed = pack_nibbles(codes).contiguous()
    for dtype in _dtypes(device):
        x = _x(m, k, seed=k, dtype=dtype)
        want = F.linear(x, dequantize(codes, scales, zeros, g_idx, dtype), bias.to(dtype))
        got = int4_gemm(
            x.to(device),
            packed.to(device),
            scales.to(device),
            zeros.to(device),
            group,
            bias.to(dtype).to(device),
            GemmTiles(*tiles),
        )
        assert got.dtype == dtype and got.shape == (m, n)
        torch.testing.assert_close(got.cpu().float(), want.float(), **TOL[dtype])
    got = int4_gemm(x.to(device), packed.to(device), scales.to(device), zeros.to(device), group)
    want = F.linear(x, dequantize(codes, scales, zeros, g_idx, x.dtype))
    torch.testing.assert_close(got.cpu().float(), want.float(), **TOL[x.dtype])  # no bias


def _assert_fp8_close(got, want, x, w):
    """float32: TOL. Half precision: the twin rounds each weight twice (the scale to
    the dtype, then the product), the kernel at most once, and on a GPU its dot
    multiplies half tiles: each product may differ by 3 units of roundoff, so an
    output by up to 3u (|x| @ |W|^T) plus its own rounding. A fixed atol fails
    here by luck of the draw (an H200, bf16: 0.039 off where 0.03 was allowed); a
    wrong block scale or a dropped K tail is off by far more than this bound."""
    if want.dtype == torch.float32:
        torch.testing.assert_close(got.cpu(), want, **TOL[torch.float32])
        return
    u = torch.finfo(want.dtype).eps / 2
    bound = 3 * u * (x.float().abs() @ w.float().abs().T) + u * want.float().abs() + u
    diff = (got.cpu().float() - want.float()).abs()
    assert (diff <= bound).all(), f"{int((diff > bound).sum())} outputs past the bound"


def test_fp8_gemm_per_row_and_block_scales_match_twin(triton_device):
    from kernels.triton.weight_only_gemm import GemmTiles, fp8_gemm

    device = triton_device
    gen = torch.Generator().manual_seed(3)
    tiles = GemmTiles(16, 32, 32)
    # Per row, K not a multiple of the K tile.
    weight, scales = quantize_fp8_rows(torch.randn(40, 72, generator=gen))
    # Per [32, 64] block, with partial blocks at both edges.
    block_w = (torch.randn(40, 80, generator=gen) * 100).clamp(-448, 448).to(FP8)
    block_s = torch.rand(2, 2, generator=gen) * 0.01 + 1e-3
    bias = torch.randn(40, generator=gen)
    for dtype in _dtypes(device):
        x = _x(3, 72, seed=4, dtype=dtype)
        w = dequantize_fp8(weight, scales, dtype)
        want = F.linear(x, w, bias.to(dtype))
        got = fp8_gemm(
            x.to(device),
            weight.to(device),
            scales.to(device),
            None,
            bias.to(dtype).to(device),
            tiles,
        )
        _assert_fp8_close(got, want, x, w)
        x = _x(17, 80, seed=5, dtype=dtype)
        w = dequantize_fp8(block_w, block_s, dtype, (32, 64))
        want = F.linear(x, w)
        got = fp8_gemm(x.to(device), block_w.to(device), block_s.to(device), (32, 64), None, tiles)
        _assert_fp8_close(got, want, x, w)


def test_fp8_decode_covers_every_finite_byte(triton_device):
    """Each e4m3 byte (subnormals, both zeros, the max) against torch's own cast."""
    from kernels.triton.weight_only_gemm import GemmTiles, fp8_gemm

    device = triton_device
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 127) != 127].view(FP8).view(1, -1)  # [1, 254] (no NaNs)
    weight = torch.zeros(16, codes.shape[1], dtype=FP8)
    weight[0] = codes
    eye = torch.eye(codes.shape[1])  # x = I: y[i, 0] = w[0, i]
    got = fp8_gemm(
        eye.to(device),
        weight.to(device),
        torch.ones(16, 1).to(device),
        tiles=GemmTiles(64, 16, 64),
    )
    assert torch.equal(got.cpu()[:, 0], codes[0].to(torch.float32))


def _int_layer(codes, scales, zeros, g_idx, dtype, kernel, device):
    layer = ReplicatedLinear(codes.shape[1], codes.shape[0], params_dtype=dtype)
    set_int_weight(
        layer,
        ["weight"],
        codes.to(device),
        scales.to(device),
        zeros.to(device),
        g_idx.to(device),
        4,
        dtype,
        kernel,
    )
    return layer


@pytest.mark.parametrize(
    ("act_order", "dtype"), [(False, torch.float32), (True, torch.float32), (False, torch.float16)]
)
def test_triton_int4_layer_matches_dequant_layer(triton_device, act_order, dtype):
    device = triton_device
    codes, scales, zeros = _int4(48, 128, 32, seed=11)
    g_idx = torch.arange(128) // 32
    if act_order:  # the layer sorts x's features by the same permutation
        g_idx = g_idx[torch.randperm(128, generator=torch.Generator().manual_seed(12))]
    triton_layer = _int_layer(codes, scales, zeros, g_idx, dtype, "triton_int4", device)
    twin = _int_layer(codes, scales, zeros, g_idx, dtype, "dequant", "cpu")
    assert triton_layer.int_kernel == "triton_int4" and triton_layer.int_weight.shape == (48, 64)
    x = _x(6, 128, seed=13, dtype=dtype)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(14)).to(dtype)
    got = apply_int_weight(triton_layer, x.to(device), bias.to(device))
    want = apply_int_weight(twin, x, bias)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu().float(), want.float(), **TOL[dtype])
    dense = dequantize(codes, scales, zeros, g_idx, dtype)
    torch.testing.assert_close(want.float(), F.linear(x, dense, bias).float(), **TOL[dtype])


@pytest.mark.parametrize("block", [None, (16, 32)])
def test_triton_fp8_layer_matches_twin_layer(triton_device, block):
    device = triton_device
    gen = torch.Generator().manual_seed(15)
    if block is None:
        weight, scales = quantize_fp8_rows(torch.randn(32, 64, generator=gen))
    else:
        weight = (torch.randn(32, 64, generator=gen) * 50).to(FP8)
        scales = torch.rand(2, 2, generator=gen) * 0.01 + 1e-3  # [32 / 16, 64 / 32]
    layers = []
    for dev, triton in ((device, True), ("cpu", False)):
        layer = ReplicatedLinear(64, 32, params_dtype=torch.float32)
        set_fp8_weight(
            layer,
            ["weight"],
            weight.to(dev),
            scales.to(dev),
            torch.float32,
            block,
            use_kernel=False,
            triton=triton,
        )
        layers.append(layer)
    assert layers[0].fp8_triton and not layers[0].fp8_kernel and not layers[1].fp8_triton
    x = _x(4, 64, seed=16, dtype=torch.float32)
    bias = torch.randn(32, generator=gen)
    got = apply_fp8_weight(layers[0], x.to(device), bias.to(device))
    want = apply_fp8_weight(layers[1], x, bias)
    torch.testing.assert_close(got.cpu(), want, **TOL[torch.float32])


def test_cuda_chooses_triton_int4_where_groups_fit_and_cpu_does_not():
    from kernels.triton import triton_available

    if not triton_available():
        pytest.skip("triton is not installed")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    shape = (64, 256)
    assert choose_kernel(4, 64, False, shape, cuda, torch.bfloat16) == "triton_int4"
    assert choose_kernel(4, 0, False, shape, cuda, torch.bfloat16) == "dequant"  # not runs
    assert choose_kernel(4, 8, False, shape, cuda, torch.bfloat16) == "dequant"  # under a tile
    assert choose_kernel(8, 64, True, shape, cuda, torch.bfloat16) == "dequant"
    assert choose_kernel(4, 64, False, shape, cpu, torch.float32) != "triton_int4"
    weight, scales = quantize_fp8_rows(torch.randn(32, 64))
    layer = ReplicatedLinear(64, 32, params_dtype=torch.float32)
    set_fp8_weight(layer, ["weight"], weight, scales, torch.float32)
    assert not layer.fp8_triton  # CPU tensors keep the CPU choice
