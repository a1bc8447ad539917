"""Half-storage float32 linears (gemm_half_f32.cpp) against their twin
F.linear(x, weight.float(), bias), in this CPU's native build and in the AVX2
build (PAGODA_CPU_ISA=avx2's x86-64-v3 flags)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu import _cpu_flags, cpu_runs, load_cpu_kernels, load_half_f32_kernels


def _kernels(isa: str):
    if not cpu_runs(isa):
        pytest.skip(f"this CPU cannot run the {isa} build (it lacks AVX2, FMA or F16C)")
    kernels = load_half_f32_kernels(isa)
    if kernels is None:
        pytest.skip("no C++ toolchain to build the CPU kernels")
    if not kernels.half_f32_supported():
        pytest.skip(f"the {isa} build has no AVX2+FMA+F16C (not an x86-64-v3 CPU)")
    return kernels


@pytest.fixture(params=["avx2", "native"])
def kernels(request):
    return _kernels(request.param)


HALF = [torch.bfloat16, torch.float16]
# Every code path: 1-3 rows (two chains), 4-6, 7-8 (several blocks, still
# widened in registers), 9 up (rows packed in even blocks of 4-6: 9 = 4 + 5,
# 37 = 5 x 5 + 2 x 6; the first block widens the panel for the others), 97 and
# 193 (96-row passes of 16 blocks, then the rest, its first block widening again),
# 400 and 1000 (two passes a thread or more: each thread takes whole passes).
ROWS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 33, 37, 97, 193, 400, 1000]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", ROWS)
def test_integer_values_equal_the_twin_bit_for_bit(kernels, dtype, rows):
    # Small integers: every partial sum is exact in float32, so any summation
    # order gives the twin's result exactly.
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randint(-8, 9, (48, 77), generator=gen).to(dtype)
    x = torch.randint(-8, 9, (rows, 77), generator=gen).float()
    bias = torch.randint(-100, 100, (48,), generator=gen).float()
    packed = kernels.pack_half_panels(weight)
    assert packed.dtype == dtype and packed.shape == (3, 77, 16)
    expected = F.linear(x, weight.float(), bias)
    assert torch.equal(kernels.half_panel_linear(x, packed, bias), expected)
    assert torch.equal(kernels.half_panel_linear(x, packed), F.linear(x, weight.float()))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 3, 8, 12, 40, 200])  # 200: three row blocks
def test_random_values_match_the_twin_to_float32_rounding(kernels, dtype, rows):
    gen = torch.Generator().manual_seed(100 + rows)
    weight = (torch.randn(96, 576, generator=gen) * 0.05).to(dtype)
    x = torch.randn(rows, 576, generator=gen)
    out = kernels.half_panel_linear(x, kernels.pack_half_panels(weight))
    # Only the summation order differs: |error| <= K * eps * sum|x w| bounds it;
    # 1e-5 relative to the row's largest output is far inside that and far below
    # what one wrong weight (or a missed k step) would change.
    expected = F.linear(x, weight.float())
    scale = expected.abs().amax(dim=1, keepdim=True)
    assert ((out - expected).abs() / scale).max().item() < 1e-5


@pytest.mark.parametrize("op", ["half_panel_linear", "half_panel_linear_silu"])
@pytest.mark.parametrize("dtype", HALF)
def test_a_rows_result_does_not_depend_on_its_batch(kernels, dtype, op):
    # From 9 rows every row keeps its own accumulators over the same k order,
    # whatever block (4, 5 or 6 rows) it lands in and whichever way the threads
    # split the work (1000 rows: whole passes a thread; up to 193: each pass's
    # panels): bit for bit the same output, SiLU fused or not.
    gen = torch.Generator().manual_seed(7)
    weight = (torch.randn(64, 576, generator=gen) * 0.05).to(dtype)
    x = torch.randn(1000, 576, generator=gen)
    packed = kernels.pack_half_panels(weight)
    linear = getattr(kernels, op)
    full = linear(x, packed)
    for rows in (9, 10, 13, 37, 42, 97, 193, 400):
        assert torch.equal(linear(x[:rows], packed), full[:rows]), rows


@pytest.mark.parametrize(
    ("dtype", "order"),
    [
        # bf16: each 32-bit word holds columns i and i + 8 (half_panel.h's widen).
        (torch.bfloat16, [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15]),
        (torch.float16, list(range(16))),
    ],
)
def test_panels_hold_each_k_steps_columns_in_the_widens_order(kernels, dtype, order):
    # weight[n, k] = 3 n + k: integers below 256, exact in both dtypes.
    weight = (torch.arange(32).view(32, 1) * 3 + torch.arange(3)).to(dtype)
    packed = kernels.pack_half_panels(weight)
    assert packed.shape == (2, 3, 16)
    for panel in range(2):
        for k in range(3):
            assert packed[panel, k].tolist() == [3 * (16 * panel + c) + k for c in order]


def _silu_twin(gate_up: torch.Tensor) -> torch.Tensor:
    d = gate_up.shape[1] // 2
    return F.silu(gate_up[:, :d]) * gate_up[:, d:]


@pytest.mark.parametrize("isa", ["avx2", "native"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", ROWS)
def test_fused_silu_equals_the_linear_then_silu_and_mul(isa, dtype, rows):
    kernels = _kernels(isa)
    # Gate and up of 3 panels each (N 96): unit u pairs panels u and u + 3.
    gen = torch.Generator().manual_seed(200 + rows)
    weight = (torch.randn(96, 200, generator=gen) * 0.1).to(dtype)
    x = torch.randn(rows, 200, generator=gen)
    bias = torch.randn(96, generator=gen)
    packed = kernels.pack_half_panels(weight)
    for b in (bias, None):
        fused = kernels.half_panel_linear_silu(x, packed, b)
        gate_up = kernels.half_panel_linear(x, packed, b)
        assert fused.shape == (rows, 48)
        # The plain twin, up to exp's rounding (exp_native: ~2e-7 relative).
        torch.testing.assert_close(fused, _silu_twin(gate_up), rtol=1e-5, atol=1e-6)
        # silu_and_mul_f32 shares the fused SiLU's arithmetic: bit for bit where
        # both builds have the same vector width (an AVX2 build beside an
        # AVX-512 main module splits exp's lanes differently).
        if isa == "native" or "avx512f" not in _cpu_flags():
            assert torch.equal(fused, load_cpu_kernels().silu_and_mul(gate_up))


def test_rejects_bad_shapes_and_dtypes(kernels):
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernels.pack_half_panels(torch.zeros(40, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bf16 or fp16"):
        kernels.pack_half_panels(torch.zeros(32, 8))
    packed = kernels.pack_half_panels(torch.zeros(32, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="float32"):
        kernels.half_panel_linear(torch.zeros(2, 8, dtype=torch.bfloat16), packed)
    with pytest.raises(RuntimeError, match="K = x's"):
        kernels.half_panel_linear(torch.zeros(2, 9), packed)
    with pytest.raises(RuntimeError, match="bias"):
        kernels.half_panel_linear(torch.zeros(2, 8), packed, torch.zeros(31))
    odd = kernels.pack_half_panels(torch.zeros(48, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="whole panels"):
        kernels.half_panel_linear_silu(torch.zeros(2, 8), odd)


def test_no_rows_gives_an_empty_output(kernels):
    packed = kernels.pack_half_panels(torch.ones(32, 8, dtype=torch.float16))
    assert kernels.half_panel_linear(torch.zeros(0, 8), packed).shape == (0, 32)
    assert kernels.half_panel_linear_silu(torch.zeros(0, 8), packed).shape == (0, 16)
