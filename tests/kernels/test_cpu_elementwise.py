"""The fused C++ kernels against their plain-PyTorch twins: bf16 bit for bit,
float32 to within its rounding."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import load_cpu_kernels
from worker.layers.activation import SiluAndMul
from worker.layers.layernorm import RMSNorm
from worker.layers.rotary import RopeSpec, RotaryEmbedding

kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="no C++ toolchain to build the CPU kernels")


def twin(monkeypatch, fn):
    """Run `fn` with the C++ kernels switched off: the plain-PyTorch path."""
    with monkeypatch.context() as m:
        m.setenv("PAGODA_CPU_KERNELS", "0")
        load_cpu_kernels.cache_clear()
        try:
            return fn()
        finally:
            m.undo()
            load_cpu_kernels.cache_clear()


def bf16(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).to(torch.bfloat16)


@pytest.fixture
def norm():
    torch.manual_seed(0)
    layer = RMSNorm(576, 1e-5, params_dtype=torch.bfloat16)
    layer.weight.data = bf16(576)
    return layer


def test_rms_norm_equals_twin(norm, monkeypatch):
    x = bf16(37, 576, scale=3.0)
    assert torch.equal(norm(x), twin(monkeypatch, lambda: norm(x)))


def test_add_rms_norm_equals_twin_and_updates_residual_in_place(norm, monkeypatch):
    x, residual = bf16(37, 576), bf16(37, 576)
    expected_out, expected_residual = twin(monkeypatch, lambda: norm(x, residual.clone()))
    given = residual.clone()
    out, new_residual = norm(x, given)
    assert new_residual is given
    assert torch.equal(out, expected_out)
    assert torch.equal(new_residual, expected_residual)


def test_denormal_sums_and_products_round_as_the_twin(norm, monkeypatch):
    """vcvtneps2bf16 (the AVX512-BF16 rounding) reads a denormal float as zero;
    lanes holding one must round as torch does. Sums of x and residual of about
    1e-39, and RoPE products of such values, are denormal; the rest are not."""
    torch.manual_seed(8)
    tiny = (torch.randn(37, 576) * 1e-39).to(torch.bfloat16)
    x, residual = tiny.clone(), bf16(37, 576)
    residual[::2] = (torch.randn(19, 576) * 1e-39).to(torch.bfloat16)
    expected_out, expected_residual = twin(monkeypatch, lambda: norm(x, residual.clone()))
    given = residual.clone()
    out, _ = norm(x, given)
    assert bool((given[::2].float().abs() < 2**-126).any()), "the case must hold denormal sums"
    assert torch.equal(out, expected_out) and torch.equal(given, expected_residual)
    rope = RotaryEmbedding(64, 4096, RopeSpec(theta=10000.0), torch.bfloat16)
    qkv = torch.cat([tiny, tiny[:, :384]], dim=1)  # [37, 960]
    positions = torch.randint(0, 4096, (37,))
    q, k, _ = qkv.clone().split([576, 192, 192], dim=-1)
    expected_q, expected_k = twin(monkeypatch, lambda: rope(positions, q, k))
    fq, fk, _ = qkv.clone().split([576, 192, 192], dim=-1)
    out_q, out_k = rope(positions, fq, fk)
    assert torch.equal(out_q, expected_q) and torch.equal(out_k, expected_k)


def test_per_head_norm_of_a_strided_view(monkeypatch):
    # Qwen3's q_norm sees q as a column slice of the fused qkv output.
    torch.manual_seed(1)
    layer = RMSNorm(16, 1e-6, params_dtype=torch.bfloat16)
    layer.weight.data = bf16(16)
    qkv = bf16(5, 128)
    q = qkv[:, :64].reshape(-1, 4, 16)
    assert torch.equal(layer(q), twin(monkeypatch, lambda: layer(q)))


def test_silu_and_mul_equals_twin(monkeypatch):
    torch.manual_seed(2)
    x = bf16(19, 2 * 1536, scale=4.0)
    act = SiluAndMul()
    out = act(x)
    assert out.shape == (19, 1536)
    assert torch.equal(out, twin(monkeypatch, lambda: act(x)))


def test_rotary_in_place_on_qkv_views_equals_twin(monkeypatch):
    torch.manual_seed(3)
    rope = RotaryEmbedding(64, 4096, RopeSpec(theta=100000.0), torch.bfloat16)
    qkv = bf16(37, 960)
    positions = torch.randint(0, 4096, (37,))
    q, k, _ = qkv.clone().split([576, 192, 192], dim=-1)
    expected_q, expected_k = twin(monkeypatch, lambda: rope(positions, q, k))
    fused = qkv.clone()
    fq, fk, fv = fused.split([576, 192, 192], dim=-1)
    out_q, out_k = rope(positions, fq, fk)
    assert torch.equal(out_q, expected_q) and torch.equal(out_k, expected_k)
    assert out_q.data_ptr() == fq.data_ptr()  # rotated in place
    assert torch.equal(fv, qkv[:, 768:])  # v untouched


def assert_f32_close(out, expected, ulps=4):
    """Equal up to a few float32 roundings of each value (sum order, exp, fused multiply-adds)."""
    assert out.dtype == torch.float32 and out.shape == expected.shape
    tolerance = expected.abs().clamp_min(1e-3) * (ulps * 2**-23)
    assert bool(((out - expected).abs() <= tolerance).all())


def test_float32_rms_norm_and_residual_add_match_twin(monkeypatch):
    torch.manual_seed(4)
    layer = RMSNorm(576, 1e-5)
    layer.weight.data = torch.randn(576)
    x, residual = torch.randn(37, 576) * 3, torch.randn(37, 576)
    assert_f32_close(layer(x), twin(monkeypatch, lambda: layer(x)))
    expected_out, expected_residual = twin(monkeypatch, lambda: layer(x, residual.clone()))
    given = residual.clone()
    out, new_residual = layer(x, given)
    assert new_residual is given
    assert torch.equal(new_residual, expected_residual)  # one add: exact
    assert_f32_close(out, expected_out)


def test_float32_silu_and_mul_matches_twin(monkeypatch):
    torch.manual_seed(5)
    x = torch.randn(19, 2 * 1536) * 4
    act = SiluAndMul()
    assert_f32_close(act(x), twin(monkeypatch, lambda: act(x)))


def test_float32_rotary_in_place_matches_twin(monkeypatch):
    torch.manual_seed(6)
    rope = RotaryEmbedding(64, 4096, RopeSpec(theta=100000.0), torch.float32)
    qkv = torch.randn(37, 960)
    positions = torch.randint(0, 4096, (37,))
    q, k, _ = qkv.clone().split([576, 192, 192], dim=-1)
    expected_q, expected_k = twin(monkeypatch, lambda: rope(positions, q, k))
    fq, fk, fv = qkv.clone().split([576, 192, 192], dim=-1)
    out_q, out_k = rope(positions, fq, fk)
    assert out_q.data_ptr() == fq.data_ptr()  # rotated in place
    # x1 * cos - x2 * sin can cancel: bound the error by the inputs (|cos|, |sin| <= 1).
    tolerance = qkv[:, :768].abs().max() * 2**-21
    assert (out_q - expected_q).abs().max() <= tolerance
    assert (out_k - expected_k).abs().max() <= tolerance
    assert torch.equal(fv, qkv[:, 768:])  # v untouched


@pytest.mark.parametrize(
    "dtype, cache_dtype",
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float32),
        (torch.float32, torch.bfloat16),  # a float32 model's half cache (kv_half.h)
        (torch.float32, torch.float16),
    ],
)
def test_rope_write_kv_equals_rotary_then_cache_write(monkeypatch, dtype, cache_dtype):
    """The decode plan's fused call on fused QKV rows: RoPE in place, then K and V
    into their slots, as the rotary then the cache write."""
    from kernels.paged_attention_reference import write_kv_reference

    torch.manual_seed(7)
    heads, kv_heads, head_dim, rows = 9, 3, 64, 4
    rope = RotaryEmbedding(head_dim, 4096, RopeSpec(theta=100000.0), dtype)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim).to(dtype)
    positions = torch.tensor([0, 17, 4095, 300])
    slots = torch.tensor([5, 0, 39, 22])
    caches = torch.randn(2, 10, 4, kv_heads, head_dim).to(cache_dtype)  # [K | V], 10 blocks of 4

    expected, expected_caches = qkv.clone(), caches.clone()
    q, k, v = expected.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    if dtype == torch.bfloat16:  # the plain-PyTorch rotary: bit for bit in bf16
        rotated = twin(monkeypatch, lambda: rope(positions, q.clone(), k.clone()))
        q.copy_(rotated[0]), k.copy_(rotated[1])
    else:  # float32: the C++ rotary (within rounding of its twin, tested above)
        rope(positions, q, k)
    shape = (rows, kv_heads, head_dim)
    write_kv_reference(k.view(shape), v.view(shape), *expected_caches, slots)

    fused, got_caches = qkv.clone(), caches.clone()
    key_cache, value_cache = got_caches
    kernels.rope_write_kv(
        fused, positions, rope.cos_cache, rope.sin_cache, key_cache, value_cache, slots,
        heads, kv_heads, head_dim,
    )  # fmt: skip
    assert torch.equal(fused, expected)
    assert torch.equal(got_caches, expected_caches)


def test_rope_write_kv_checks_its_slots():
    rope = RotaryEmbedding(64, 128, RopeSpec(), torch.bfloat16)
    qkv = bf16(1, 5 * 64)
    caches = bf16(2, 2, 4, 1, 64)
    with pytest.raises(RuntimeError, match="slot"):
        kernels.rope_write_kv(
            qkv, torch.tensor([3]), rope.cos_cache, rope.sin_cache, caches[0], caches[1],
            torch.tensor([8]), 3, 1, 64,
        )  # fmt: skip
