"""The 1-8 row float32 GEMV over half panels (gemv_f32.cpp) against its twin
F.linear(x, weight.float(), bias), in this CPU's native build and in the AVX2
build (PAGODA_CPU_ISA=avx2's x86-64-v3 flags)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu import cpu_runs, load_gemv_f32_kernels, load_half_f32_kernels


@pytest.fixture(params=["avx2", "native"])
def isa(request):
    if not cpu_runs(request.param):
        pytest.skip(f"this CPU cannot run the {request.param} build (it lacks AVX2, FMA or F16C)")
    return request.param


@pytest.fixture
def kernels(isa):
    gemv, half = load_gemv_f32_kernels(isa), load_half_f32_kernels(isa)
    if gemv is None or half is None:
        pytest.skip("no C++ toolchain to build the CPU kernels")
    if not gemv.gemv_f32_supported():
        pytest.skip(f"the {isa} build has no AVX2+FMA+F16C (not an x86-64-v3 CPU)")
    return gemv, half.pack_half_panels


HALF = [torch.bfloat16, torch.float16]
ROWS = range(1, 9)  # 1-4: one pass per panel (4, 2, 2, 1 partial sums); 5-8: two
# K tails: the loop takes 4 k steps at a time at one row, 2 at more, then single
# steps; K below a loop step never enters the loop.
KS = [1, 2, 3, 4, 5, 6, 7, 9, 77]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", ROWS)
def test_integer_values_equal_the_twin_bit_for_bit(kernels, dtype, rows):
    # Small integers: every partial sum is exact in float32, so any summation
    # order gives the twin's result exactly.
    gemv, pack = kernels
    for k in KS:
        for n in (16, 48, 160):  # 1, 3 and 10 panels: fewer panels than threads too
            gen = torch.Generator().manual_seed(rows * 1000 + k * 10 + n)
            weight = torch.randint(-8, 9, (n, k), generator=gen).to(dtype)
            x = torch.randint(-8, 9, (rows, k), generator=gen).float()
            bias = torch.randint(-100, 100, (n,), generator=gen).float()
            packed = pack(weight)
            got = gemv.gemv_half_f32_linear(x, packed, bias)
            assert torch.equal(got, F.linear(x, weight.float(), bias)), (k, n)
            got = gemv.gemv_half_f32_linear(x, packed)
            assert torch.equal(got, F.linear(x, weight.float())), (k, n)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("shape", [(96, 576), (64, 1536)])
def test_random_values_match_the_twin_to_float32_rounding(kernels, dtype, rows, shape):
    gemv, pack = kernels
    gen = torch.Generator().manual_seed(100 + rows)
    weight = (torch.randn(*shape, generator=gen) * 0.05).to(dtype)
    x = torch.randn(rows, shape[1], generator=gen)
    out = gemv.gemv_half_f32_linear(x, pack(weight))
    # Only the summation order differs: 1e-5 relative to the row's largest
    # output is far inside K * eps * sum|x w| and far below what one wrong
    # weight (or a missed k step) would change.
    expected = F.linear(x, weight.float())
    scale = expected.abs().amax(dim=1, keepdim=True)
    assert ((out - expected).abs() / scale).max().item() < 1e-5


def test_rejects_bad_rows_shapes_and_dtypes(kernels):
    gemv, pack = kernels
    packed = pack(torch.zeros(32, 8, dtype=torch.bfloat16))
    for rows in (0, 9):
        with pytest.raises(RuntimeError, match="1 to 8 rows"):
            gemv.gemv_half_f32_linear(torch.zeros(rows, 8), packed)
    with pytest.raises(RuntimeError, match="float32"):
        gemv.gemv_half_f32_linear(torch.zeros(2, 8, dtype=torch.bfloat16), packed)
    with pytest.raises(RuntimeError, match="K = x's"):
        gemv.gemv_half_f32_linear(torch.zeros(2, 9), packed)
    with pytest.raises(RuntimeError, match="bias"):
        gemv.gemv_half_f32_linear(torch.zeros(2, 8), packed, torch.zeros(31))
