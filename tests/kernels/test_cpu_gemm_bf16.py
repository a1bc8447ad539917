"""The bf16 panel linear (AMX tiles or AVX512-BF16): its weight layout, and its products against a
float64 product of the same bf16 values."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import load_cpu_kernels

kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(
    kernels is None or not kernels.bf16_gemm_supported(),
    reason="the bf16 panel kernel needs the C++ build on a CPU with AVX512-BF16",
)


def test_panels_hold_column_pairs():
    weight = torch.arange(64 * 6, dtype=torch.float32).view(64, 6).to(torch.bfloat16)
    packed = kernels.pack_bf16_panels(weight)
    assert packed.shape == (2, 3, 64)
    # panel p, k pair kp: (W[32 p + c, 2 kp], W[32 p + c, 2 kp + 1]) for c = 0..31
    assert packed[1, 2, :4].tolist() == [weight[32, 4], weight[32, 5], weight[33, 4], weight[33, 5]]
    assert torch.equal(packed[0, 0, 0::2], weight[:32, 0])
    assert torch.equal(packed[1, 1, 1::2], weight[32:, 3])


# K = 576 takes AMX tiles where the CPU has them (16-row blocks, paired, a padded
# tail; 1000 rows span three L2 chunks); K = 584 (not a multiple of 32) always
# takes the vdpbf16ps loop (blocks of at most 6 rows against two panels at a
# time; 96 columns leave the third panel alone).
@pytest.mark.parametrize("k", [576, 584])
@pytest.mark.parametrize("rows", [1, 3, 4, 12, 13, 16, 17, 31, 32, 33, 48, 64, 150, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_a_float64_product(rows, bias, k):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(96, generator=gen).to(torch.bfloat16) if bias else None
    out = kernels.bf16_panel_linear(x, kernels.pack_bf16_panels(weight), b)
    assert out.shape == (rows, 96) and out.dtype == torch.bfloat16
    _assert_near_float64_product(out, x, weight, b)


def _assert_near_float64_product(out, x, weight, b=None):
    expected = x.double() @ weight.double().T + (b.double() if b is not None else 0)
    # fp32 accumulation of k products, then one bf16 rounding (half an ulp).
    bound = expected.abs() * 2**-8 + x.shape[1] * 2**-24 * 8
    assert bool(((out.double() - expected).abs() <= bound).all())


@pytest.mark.parametrize("silu", [False, True])
def test_many_rows_in_chunks_equal_the_rows_in_slices_bit_for_bit(silu):
    """Past 1 MB of x (here 1500 rows of 584) rows go out in L2-sized chunks,
    each against every panel; slices of 300 rows take the panel-major order. Each
    output is the same k-ordered sum either way."""
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(128, 584, generator=gen).to(torch.bfloat16)
    x = torch.randn(1500, 584, generator=gen).to(torch.bfloat16)
    packed = kernels.pack_bf16_panels(weight)
    linear = kernels.bf16_panel_linear_silu if silu else kernels.bf16_panel_linear
    sliced = torch.cat(
        [linear(x[i : i + 300].contiguous(), packed, None) for i in range(0, 1500, 300)]
    )
    assert torch.equal(linear(x, packed, None), sliced)


@pytest.mark.parametrize("rows", [7, 36, 64])
def test_panels_paired_or_alone_give_the_same_bits(rows):
    """Without AMX (K = 584 keeps to the vdpbf16ps loop) a plain linear with 16+
    panels per thread runs blocks of up to 6 rows against two panels, here 16 x
    threads + 1 panels (pairs, then the last alone); 64 columns at a time have
    too few panels to share out and run blocks of up to 12 rows against one. The
    same k-ordered sums, from the bias up."""
    gen = torch.Generator().manual_seed(rows)
    n = 32 * (16 * torch.get_num_threads() + 1)
    weight = torch.randn(n, 584, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, 584, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16)
    out = kernels.bf16_panel_linear(x, kernels.pack_bf16_panels(weight), b)
    narrow = torch.cat(
        [
            kernels.bf16_panel_linear(
                x, kernels.pack_bf16_panels(weight[i : i + 64].contiguous()), b[i : i + 64]
            )
            for i in range(0, n, 64)
        ],
        dim=1,
    )
    assert torch.equal(out, narrow)
    _assert_near_float64_product(out, x, weight, b)


@pytest.mark.parametrize("silu", [False, True])
def test_row_pairs_over_groups_of_panels_equal_one_block_at_a_time_bit_for_bit(silu):
    """With AMX a row pair runs against a group of panels (about 1 MB: 8 at
    K = 2048, 4 units with SiLU) before the next pair; 40 panels give each of two
    threads groups of 8, 8 and 4 (SiLU: 4, 4 and 2), and 80 rows two pairs and a
    lone block. 16 rows at a time is one block per call. Each output is the same
    k-ordered sum either way."""
    gen = torch.Generator().manual_seed(11)
    weight = torch.randn(40 * 32, 2048, generator=gen).to(torch.bfloat16)
    x = torch.randn(80, 2048, generator=gen).to(torch.bfloat16)
    packed = kernels.pack_bf16_panels(weight)
    linear = kernels.bf16_panel_linear_silu if silu else kernels.bf16_panel_linear
    out = linear(x, packed, None)
    sliced = torch.cat([linear(x[i : i + 16].contiguous(), packed, None) for i in range(0, 80, 16)])
    assert torch.equal(out, sliced)
    if not silu:
        _assert_near_float64_product(out, x, weight)


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("rows", [512, 1000])
def test_small_weights_split_by_rows_equal_one_block_at_a_time_bit_for_bit(silu, rows):
    """With AMX a weight within 1.25 MB (here 192 x 576) goes to the threads by
    rows (8+ blocks per thread), a larger one by units; 1000 rows end in a short
    block. 16 rows at a time is one block per call. The same k-ordered sums."""
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(192, 576, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, 576, generator=gen).to(torch.bfloat16)
    packed = kernels.pack_bf16_panels(weight)
    linear = kernels.bf16_panel_linear_silu if silu else kernels.bf16_panel_linear
    sliced = torch.cat(
        [linear(x[i : i + 16].contiguous(), packed, None) for i in range(0, rows, 16)]
    )
    assert torch.equal(linear(x, packed, None), sliced)


@pytest.mark.parametrize("rows", [13, 36, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_outputs_past_l2_streamed_equal_small_outputs_bit_for_bit(rows, bias):
    """Past 1 MB of output (rows x 24608 columns, an LM head's shape: 36 and 64
    rows, not 13) the blocks write it with streaming stores; 4 rows at a time
    (394 KB) take plain stores. K = 40 keeps to the vdpbf16ps loop; 769 panels
    leave a short last unit."""
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(24608, 40, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, 40, generator=gen).to(torch.bfloat16)
    b = torch.randn(24608, generator=gen).to(torch.bfloat16) if bias else None
    packed = kernels.pack_bf16_panels(weight)
    out = kernels.bf16_panel_linear(x, packed, b)
    sliced = torch.cat(
        [kernels.bf16_panel_linear(x[i : i + 4].contiguous(), packed, b) for i in range(0, rows, 4)]
    )
    assert torch.equal(out, sliced)
    expected = x.double() @ weight.double().T + (b.double() if bias else 0)
    assert bool(((out.double() - expected).abs() <= expected.abs() * 2**-8 + 40 * 2**-21).all())


def test_shapes_it_cannot_take_are_refused():
    with pytest.raises(RuntimeError, match="N % 32 == 0"):
        kernels.pack_bf16_panels(torch.zeros(48, 8, dtype=torch.bfloat16))
    packed = kernels.pack_bf16_panels(torch.zeros(32, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="x has 6 columns, the weight 8"):
        kernels.bf16_panel_linear(torch.zeros(2, 6, dtype=torch.bfloat16), packed)


# With AMX (K = 32, 576) each unit's SiLU runs during the next unit's products
# (a pending unit per thread, ended before the next is posted and at the end):
# K = 32 leaves one k step per panel, so most of it runs at the post.
@pytest.mark.parametrize("k", [32, 576, 584])
@pytest.mark.parametrize("rows", [1, 12, 17, 33, 150, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_silu_is_the_linear_then_silu_and_mul_bit_for_bit(rows, bias, k):
    gen = torch.Generator().manual_seed(100 + rows)
    weight = torch.randn(128, k, generator=gen).to(torch.bfloat16)  # [gate 64; up 64]
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(128, generator=gen).to(torch.bfloat16) if bias else None
    packed = kernels.pack_bf16_panels(weight)
    fused = kernels.bf16_panel_linear_silu(x, packed, b)
    assert fused.shape == (rows, 64)
    assert torch.equal(fused, kernels.silu_and_mul(kernels.bf16_panel_linear(x, packed, b)))


def test_fused_silu_needs_whole_panels_of_gate_and_up():
    packed = kernels.pack_bf16_panels(torch.zeros(96, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="N % 64 == 0"):
        kernels.bf16_panel_linear_silu(torch.zeros(2, 8, dtype=torch.bfloat16), packed)
