"""bf16 and float32 linear weights prepacked on CPU (Pagoda's bf16 panels, or
oneDNN's layout), against F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu import load_cpu_kernels
from worker.layers import cpu_packed
from worker.layers.activation import SiluAndMul
from worker.layers.embedding import ParallelLMHead
from worker.layers.linear import MergedColumnParallelLinear, ReplicatedLinear

needs_onednn = pytest.mark.skipif(
    not cpu_packed.can_pack(torch.zeros(2, 2)), reason="torch built without oneDNN linear"
)
needs_packing = pytest.mark.skipif(
    not cpu_packed.can_pack(torch.zeros(2, 2, dtype=torch.bfloat16)),
    reason="no oneDNN bf16 linear packing here (torch without oneDNN, or a CPU without AVX-512/AVX-NE-CONVERT)",
)
_kernels = load_cpu_kernels()
# The bf16 packers: the panel kernel where the build has AVX512-BF16, and oneDNN.
PACKERS = [
    pytest.param(
        "panels",
        marks=pytest.mark.skipif(
            _kernels is None or not _kernels.bf16_gemm_supported(),
            reason="the bf16 panel kernel needs AVX512-BF16",
        ),
    ),
    "onednn",
]
PACKED_SHAPE = {"panels": (5, 48, 64), "onednn": (160, 96)}


def bf16_layer(bias: bool) -> ReplicatedLinear:
    torch.manual_seed(0)
    layer = ReplicatedLinear(96, 160, bias=bias, params_dtype=torch.bfloat16)
    layer.weight.data = torch.randn(160, 96).to(torch.bfloat16)
    if bias:
        layer.bias.data = torch.randn(160).to(torch.bfloat16)
    return layer


@needs_packing
@pytest.mark.parametrize("packer", PACKERS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 5, 7, 64, 300])
def test_packed_linear_matches_f_linear(bias, rows, packer, monkeypatch):
    monkeypatch.setenv("PAGODA_CPU_BF16_GEMM", "1" if packer == "panels" else "0")
    layer = bf16_layer(bias)
    x = torch.randn(rows, 96).to(torch.bfloat16)
    expected = F.linear(x.float(), layer.weight.float(), None if not bias else layer.bias.float())
    layer.process_weights_after_loading()
    assert layer.weight_is_packed and layer.weight.shape == PACKED_SHAPE[packer]
    out = layer(x)
    assert out.shape == (rows, 160) and out.dtype == torch.bfloat16
    # Only bf16 rounding differs from the fp32 product: half an ulp, or a whole one
    # where oneDNN rounds the product before adding the bias (its AMX kernels do,
    # and so does F.linear on bf16 there; the panel kernel adds it in fp32).
    ulp = expected.abs().clamp_min(1e-3) * (2**-7 if bias else 2**-8)
    assert bool(((out.float() - expected).abs() <= ulp).all())


@needs_packing
@pytest.mark.parametrize("packer", PACKERS)
@pytest.mark.parametrize("inter", [64, 80])  # 80: gate and up do not split at a panel
def test_gate_up_fuses_silu_only_on_whole_panels(packer, inter, monkeypatch):
    monkeypatch.setenv("PAGODA_CPU_BF16_GEMM", "1" if packer == "panels" else "0")
    torch.manual_seed(0)
    layer = MergedColumnParallelLinear(96, [inter, inter], params_dtype=torch.bfloat16)
    layer.weight.data = torch.randn(2 * inter, 96).to(torch.bfloat16)
    x = torch.randn(9, 96).to(torch.bfloat16)
    assert layer.silu_and_mul(x) is None  # not packed yet: F.linear, then SiluAndMul
    layer.process_weights_after_loading()
    fused = layer.silu_and_mul(x)
    if packer == "onednn" or inter == 80:
        assert fused is None
    else:
        assert torch.equal(fused, SiluAndMul()(layer(x)))


def test_bf16_layer_runs_where_the_cpu_cannot_pack(monkeypatch):
    # Wherever oneDNN refuses bf16 (AVX2-only CPUs), loading must keep the plain
    # weight rather than fail; forcing the probe's answer tests that path anywhere.
    monkeypatch.setattr(cpu_packed, "_cpu_can_pack_bf16", lambda: False)
    layer = bf16_layer(True)
    x = torch.randn(7, 96).to(torch.bfloat16)
    expected = F.linear(x, layer.weight, layer.bias)
    layer.process_weights_after_loading()
    assert not getattr(layer, "weight_is_packed", False)
    assert torch.equal(layer(x), expected)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_float32_packed_linear_matches_f_linear(rows):
    torch.manual_seed(0)
    layer = ReplicatedLinear(96, 160, bias=True, params_dtype=torch.float32)
    layer.weight.data = torch.randn(160, 96)
    layer.bias.data = torch.randn(160)
    x = torch.randn(rows, 96)
    expected = F.linear(x.double(), layer.weight.double(), layer.bias.double())
    layer.process_weights_after_loading()
    assert layer.weight_is_packed and layer.weight.shape == (160, 96)
    out = layer(x)
    assert out.shape == (rows, 160) and out.dtype == torch.float32
    # Summation order differs from sgemm's: within float32 accumulation error of
    # 96 products of N(0,1) values (each below 2**-24 relative, summed).
    assert bool(((out.double() - expected).abs() <= 96 * 2**-24 * 16).all())


def test_half_weights_stay_unpacked():
    layer = ReplicatedLinear(8, 4, params_dtype=torch.float16)
    layer.process_weights_after_loading()
    assert not getattr(layer, "weight_is_packed", False)
    assert layer.weight.layout == torch.strided


@needs_packing
def test_packing_off_by_environment(monkeypatch):
    monkeypatch.setenv("PAGODA_CPU_PACKED_LINEAR", "0")
    layer = bf16_layer(False)
    layer.process_weights_after_loading()
    assert not getattr(layer, "weight_is_packed", False)


@needs_packing
@pytest.mark.parametrize("vocab", [300, 320])  # oneDNN's layout, then panels where they apply
def test_tied_lm_head_packs_a_copy_and_keeps_the_embedding(vocab):
    torch.manual_seed(0)
    head = ParallelLMHead(vocab, 32, params_dtype=torch.bfloat16)
    head.weight.data = torch.randn(vocab, 32).to(torch.bfloat16)
    hidden = torch.randn(5, 32).to(torch.bfloat16)
    expected = F.linear(hidden.float(), head.weight.float())
    head.process_weights_after_loading()
    assert head.packed_weight is not None and head.weight.layout == torch.strided
    logits = head.compute_logits(hidden)
    assert logits.shape == (5, vocab)
    assert bool(((logits.float() - expected).abs() <= expected.abs() * 2**-8 + 1e-3).all())
