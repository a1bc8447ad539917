"""The huge-page weight arena (worker/huge_pages.py) and the packers that place
their panels there (worker/layers/cpu_packed.py, worker/layers/cpu_half_f32.py)."""

from __future__ import annotations

import mmap

import pytest
import torch

from kernels.cpu import load_cpu_kernels, load_half_f32_kernels
from worker import huge_pages
from worker.layers import cpu_half_f32, cpu_packed

pytestmark = pytest.mark.skipif(
    not hasattr(mmap, "MADV_HUGEPAGE"),
    reason="no MADV_HUGEPAGE here: the arena hands tensors back as they are",
)


@pytest.fixture
def arena(monkeypatch):
    """A fresh process arena, so offsets start at 0."""
    fresh = huge_pages.HugePageArena()
    monkeypatch.setattr(huge_pages, "_weights", fresh)
    return fresh


def test_tensors_sit_side_by_side_at_64_byte_steps(arena):
    first = huge_pages.place_weight(torch.arange(25, dtype=torch.float32))  # 100 bytes
    second = huge_pages.place_weight(torch.full((3, 4), 7, dtype=torch.int16))  # 24 bytes
    assert second.data_ptr() - first.data_ptr() == 128
    assert arena.used == 128 + 64
    assert first.tolist() == list(range(25))
    assert second.shape == (3, 4) and second.dtype == torch.int16 and bool((second == 7).all())
    assert first.data_ptr() % 64 == 0


def test_a_tensor_past_the_chunk_gets_a_region_of_its_own(arena, monkeypatch):
    monkeypatch.setattr(huge_pages.HugePageArena, "_CHUNK", huge_pages.HUGE_PAGE)
    small = huge_pages.place_weight(torch.zeros(16, dtype=torch.uint8))
    first_region = arena.region
    big = huge_pages.place_weight(torch.ones(huge_pages.HUGE_PAGE + 1, dtype=torch.uint8))
    assert arena.region is not first_region
    assert len(arena.region) == 2 * huge_pages.HUGE_PAGE  # whole huge pages
    assert arena.used == huge_pages.HUGE_PAGE + 64
    assert bool((big == 1).all()) and bool((small == 0).all())  # the old region lives on in `small`


_panel = load_cpu_kernels()
_half = load_half_f32_kernels()


@pytest.mark.skipif(
    _panel is None or not _panel.bf16_gemm_supported(),
    reason="the bf16 panel kernel needs AVX512-BF16 or AMX",
)
def test_bf16_panels_go_to_the_arena(arena):
    placed = cpu_packed.pack(torch.ones(32, 6, dtype=torch.bfloat16))
    second = cpu_packed.pack(torch.full((64, 8), 2.0, dtype=torch.bfloat16))
    # 32 x 6 bf16 = 384 bytes, already a multiple of the 64-byte alignment
    assert second.data_ptr() - placed.data_ptr() == 384
    assert placed.shape == (1, 3, 64) and bool((placed == 1).all())
    assert second.shape == (2, 4, 64) and bool((second == 2).all())


@pytest.mark.skipif(
    _half is None or not _half.half_f32_supported(), reason="the half panels need AVX2+FMA+F16C"
)
def test_half_panels_of_a_lossless_float32_weight_go_to_the_arena(arena, monkeypatch):
    # On a CPU with fast bf16 the engine keeps bf16 and never packs half panels; the
    # packer itself is the same everywhere.
    monkeypatch.setattr(cpu_half_f32, "_kernels", lambda: _half)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 24, generator=gen).to(torch.bfloat16).float()  # exactly bf16
    packed = cpu_half_f32.pack_if_lossless(weight)
    again = cpu_half_f32.pack_if_lossless(weight)
    assert packed.dtype == torch.bfloat16 and packed.shape == (3, 24, 16)
    assert torch.equal(packed, _half.pack_half_panels(weight.to(torch.bfloat16)))
    assert again.data_ptr() - packed.data_ptr() == 48 * 24 * 2  # 2304: a multiple of 64
    assert arena.used == 2 * 48 * 24 * 2
