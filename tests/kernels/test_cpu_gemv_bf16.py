"""The 1-6 row bf16 GEMV over packed panels (kernels/cpu/gemv_bf16.cpp): its products
against its plain twin F.linear in float32, bit for bit against the panel kernel's
vdpbf16ps path, and its fused SiLU against the linear then silu_and_mul."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu import load_cpu_kernels, load_gemv_kernels

gemv = load_gemv_kernels()
kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(
    gemv is None or kernels is None or not gemv.gemv_bf16_supported(),
    reason="the bf16 GEMV needs the C++ build on a CPU with AVX512-BF16",
)


def _case(rows: int, n: int, k: int, bias: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None
    return x, weight, b


def _within_float32_linear(out: torch.Tensor, x, weight, b) -> bool:
    """out is F.linear in float32 rounded once to bf16, up to fp32 accumulation order."""
    expected = F.linear(x.float(), weight.float(), None if b is None else b.float()).double()
    bound = expected.abs() * 2**-8 + x.shape[1] * 2**-24 * 8
    return bool(((out.double() - expected).abs() <= bound).all())


# N: 1, 2, 3, 5, 7 and 30 panels (whole groups of 1, 2 or 4 panels and every
# short last group); K: SmolLM2's 576 and 1536, Ks not a multiple of 32, the smallest.
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("n,k", [(32, 2), (64, 576), (96, 584), (160, 1536), (224, 40), (960, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_is_f_linear_in_float32(rows, n, k, bias):
    x, weight, b = _case(rows, n, k, bias, seed=rows * 1000 + n + k)
    out = gemv.gemv_bf16_linear(x, kernels.pack_bf16_panels(weight), b)
    assert out.shape == (rows, n) and out.dtype == torch.bfloat16
    assert _within_float32_linear(out, x, weight, b)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("n,k", [(32, 2), (96, 584), (160, 1538), (224, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_is_the_panel_kernel_bit_for_bit(rows, n, k, bias):
    """Same k-ordered sum per column as gemm_bf16.cpp's vdpbf16ps blocks (K not a
    multiple of 32 never takes AMX tiles there)."""
    x, weight, b = _case(rows, n, k, bias, seed=7 + rows + n)
    packed = kernels.pack_bf16_panels(weight)
    assert torch.equal(gemv.gemv_bf16_linear(x, packed, b), kernels.bf16_panel_linear(x, packed, b))


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("n,k", [(64, 2), (128, 584), (192, 40), (3072, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_silu_is_the_linear_then_silu_and_mul_bit_for_bit(rows, n, k, bias):
    x, weight, b = _case(rows, n, k, bias, seed=300 + rows + n)
    packed = kernels.pack_bf16_panels(weight)
    fused = gemv.gemv_bf16_linear_silu(x, packed, b)
    assert fused.shape == (rows, n // 2)
    assert torch.equal(fused, kernels.silu_and_mul(gemv.gemv_bf16_linear(x, packed, b)))
    gate_up = F.linear(x.float(), weight.float(), None if b is None else b.float()).to(
        torch.bfloat16
    )
    gate, up = gate_up.float().chunk(2, dim=-1)
    twin = (F.silu(gate).to(torch.bfloat16).float() * up).to(torch.bfloat16)
    # The twin's gate/up may sit one bf16 rounding off the kernel's: a few ulps after SiLU.
    assert torch.allclose(
        fused.float(), twin.float(), rtol=2**-6, atol=2**-6 * twin.abs().max().item()
    )


def test_lm_head_shape_one_row():
    """SmolLM2's tied LM head at one sequence: 49152 x 576, 1536 panels across threads."""
    x, weight, _ = _case(1, 49152, 576, False, seed=5)
    out = gemv.gemv_bf16_linear(x, kernels.pack_bf16_panels(weight))
    assert _within_float32_linear(out, x, weight, None)


def test_shapes_it_cannot_take_are_refused():
    packed = kernels.pack_bf16_panels(torch.zeros(32, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="1 to 6 rows"):
        gemv.gemv_bf16_linear(torch.zeros(7, 8, dtype=torch.bfloat16), packed)
    with pytest.raises(RuntimeError, match="x has 6 columns, the weight 8"):
        gemv.gemv_bf16_linear(torch.zeros(1, 6, dtype=torch.bfloat16), packed)
    with pytest.raises(RuntimeError, match="whole panels"):
        gemv.gemv_bf16_linear_silu(torch.zeros(1, 8, dtype=torch.bfloat16), packed)
    with pytest.raises(RuntimeError, match="bias must be contiguous bf16 with 32"):
        gemv.gemv_bf16_linear(torch.zeros(1, 8, dtype=torch.bfloat16), packed, torch.zeros(32))
