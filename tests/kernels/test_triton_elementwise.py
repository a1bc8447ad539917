"""Triton RMSNorm (+ residual), rotary embedding and SiLU-and-mul against the
layers' plain-PyTorch twins, through the same calls the layers make."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worker.layers.rotary import RopeSpec, RotaryEmbedding


def _dtypes(device):
    return (
        [torch.float32, torch.bfloat16] if device.type == "cpu" else [torch.bfloat16, torch.float16]
    )


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def assert_rounds_as_twin(got, want, device):
    """Bit for bit on a GPU (round to nearest even, as torch rounds). The
    interpreter truncates float32 -> bf16 casts (Triton 3.9: create_fp_trunc
    ignores the rounding mode), so there the last bit may differ."""
    if device.type == "cuda" or got.dtype == torch.float32:
        assert torch.equal(got.cpu(), want)
    else:
        torch.testing.assert_close(got.cpu(), want, atol=1e-2, rtol=1e-2)


def test_rms_norm_and_residual_add(triton_device):
    device = triton_device
    from kernels.triton.elementwise import add_rms_norm, rms_norm
    from worker.layers.layernorm import RMSNorm

    gen = torch.Generator().manual_seed(0)
    for dtype in _dtypes(device):
        norm = RMSNorm(96, eps=1e-5, params_dtype=dtype)
        norm.weight.data = torch.randn(96, generator=gen).to(dtype)
        x = torch.randn(5, 96, generator=gen).to(dtype)
        residual = torch.randn(5, 96, generator=gen).to(dtype)
        want = norm._norm(x)
        want_sum = x + residual
        want_res = norm._norm(want_sum)
        w = norm.weight.data.to(device)
        torch.testing.assert_close(rms_norm(x.to(device), w, 1e-5).cpu(), want, **_tol(dtype))
        res = residual.to(device)
        out = add_rms_norm(x.to(device), res, w, 1e-5)
        assert_rounds_as_twin(res, want_sum, device)  # updated in place, rounded as the twin adds
        torch.testing.assert_close(out.cpu(), want_res, **_tol(dtype))


def test_silu_and_mul(triton_device):
    device = triton_device
    from kernels.triton.elementwise import silu_and_mul

    gen = torch.Generator().manual_seed(1)
    for dtype in _dtypes(device):
        x = torch.randn(3, 2 * 80, generator=gen).to(dtype)
        want = F.silu(x[:, :80]) * x[:, 80:]
        torch.testing.assert_close(silu_and_mul(x.to(device)).cpu(), want, **_tol(dtype))


@pytest.mark.parametrize(
    "rope",
    [
        RopeSpec(),
        RopeSpec(
            theta=500000.0, rope_type="llama3", factor=8.0, original_max_position_embeddings=32
        ),
        RopeSpec(rope_type="linear", factor=2.0),
    ],
    ids=["default", "llama3", "linear"],
)
def test_rotary_in_place_on_qkv_views(triton_device, rope):
    """q and k as views of one fused QKV row block, positions out of order."""
    device = triton_device
    from kernels.triton.elementwise import rotary_embedding

    gen = torch.Generator().manual_seed(2)
    head_dim, num_heads, num_kv_heads = 64, 3, 1
    for dtype in _dtypes(device)[:1] if rope.rope_type != "default" else _dtypes(device):
        emb = RotaryEmbedding(head_dim, 256, rope, dtype)
        qkv = torch.randn(4, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
        positions = torch.tensor([200, 0, 17, 63])
        q, k = (
            qkv[:, : num_heads * head_dim],
            qkv[:, num_heads * head_dim : -num_kv_heads * head_dim],
        )
        cos, sin = emb._lookup(positions)
        want_q, want_k = emb._rotate(q, cos, sin), emb._rotate(k, cos, sin)
        dev_qkv = qkv.to(device)
        dq = dev_qkv[:, : num_heads * head_dim]
        dk = dev_qkv[:, num_heads * head_dim : -num_kv_heads * head_dim]
        rotary_embedding(
            dq,
            dk,
            positions.to(device),
            emb.cos_cache.to(device),
            emb.sin_cache.to(device),
            head_dim,
        )
        torch.testing.assert_close(dq.cpu(), want_q, **_tol(dtype))
        if dtype != torch.float32:
            assert_rounds_as_twin(dq, want_q, device)
        torch.testing.assert_close(dk.cpu(), want_k, **_tol(dtype))
        v = slice(-num_kv_heads * head_dim, None)
        assert torch.equal(dev_qkv[:, v].cpu(), qkv[:, v])  # V untouched
