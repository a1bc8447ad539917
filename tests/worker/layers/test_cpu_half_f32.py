"""Routing of the half-storage float32 linears by rows (worker/layers/cpu_half_f32.py):
1-8 rows to the GEMV (gemv_f32.cpp), the rest to the panel GEMM (gemm_half_f32.cpp)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from worker.layers import cpu_half_f32


@pytest.fixture
def calls(monkeypatch):
    """Fake kernels that record which one ran and on what rows."""
    seen: list[tuple[str, int]] = []

    def kernel(name):
        def run(x, packed, bias):
            assert x.dim() == 2 and x.is_contiguous()
            seen.append((name, x.shape[0]))
            return torch.zeros(x.shape[0], packed.shape[0] * 16)

        return run

    gemv = SimpleNamespace(gemv_half_f32_linear=kernel("gemv"))

    def silu(x, packed, bias):
        seen.append(("gemm+silu", x.shape[0]))
        return torch.zeros(x.shape[0], packed.shape[0] * 8)

    gemm = SimpleNamespace(half_panel_linear=kernel("gemm"), half_panel_linear_silu=silu)
    monkeypatch.setattr(cpu_half_f32, "_gemv_kernels", lambda: gemv)
    monkeypatch.setattr(cpu_half_f32, "load_half_f32_kernels", lambda: gemm)
    return seen


PACKED = torch.zeros(3, 8, 16, dtype=torch.bfloat16)  # N 48, K 8


@pytest.mark.parametrize(
    ("rows", "kernel"), [(1, "gemv"), (4, "gemv"), (8, "gemv"), (9, "gemm"), (64, "gemm")]
)
def test_rows_pick_the_kernel(calls, rows, kernel):
    out = cpu_half_f32.half_linear(torch.zeros(rows, 8), PACKED, None)
    assert out.shape == (rows, 48) and calls == [(kernel, rows)]


def test_rows_are_counted_over_leading_dims(calls):
    out = cpu_half_f32.half_linear(torch.zeros(2, 3, 8), PACKED, None)
    assert out.shape == (2, 3, 48) and calls == [("gemv", 6)]
    cpu_half_f32.half_linear(torch.zeros(3, 3, 8), PACKED, None)
    assert calls[-1] == ("gemm", 9)


def test_no_rows_go_to_the_gemm(calls):
    assert cpu_half_f32.half_linear(torch.zeros(0, 8), PACKED, None).shape == (0, 48)
    assert calls == [("gemm", 0)]


def test_without_the_gemv_every_row_count_takes_the_gemm(calls, monkeypatch):
    monkeypatch.setattr(cpu_half_f32, "_gemv_kernels", lambda: None)
    cpu_half_f32.half_linear(torch.zeros(1, 8), PACKED, None)
    assert calls == [("gemm", 1)]


def test_a_float32_copy_takes_more_than_128_rows(calls, monkeypatch):
    f32 = torch.zeros(48, 8)
    seen = []

    def packed_linear(x, weight, bias):
        seen.append(x.shape[0])
        assert weight is f32
        return torch.zeros(x.shape[0], 48)

    monkeypatch.setattr(cpu_half_f32.cpu_packed, "packed_linear", packed_linear)
    for rows in (8, 9, 128, 129):
        cpu_half_f32.half_linear(torch.zeros(rows, 8), PACKED, None, f32)
    assert calls == [("gemv", 8), ("gemm", 9), ("gemm", 128)] and seen == [129]


def test_silu_fuses_only_where_the_panel_gemm_runs(calls, monkeypatch):
    gate_up = torch.zeros(4, 8, 16, dtype=torch.bfloat16)  # gate 32 | up 32
    for rows in (1, 8):  # the GEMV's rows: the caller runs them unfused
        assert cpu_half_f32.half_linear_silu(torch.zeros(rows, 8), gate_up, None) is None
    out = cpu_half_f32.half_linear_silu(torch.zeros(3, 3, 8), gate_up, None)
    assert out.shape == (3, 3, 32) and calls == [("gemm+silu", 9)]
    assert cpu_half_f32.half_linear_silu(torch.zeros(0, 8), gate_up, None).shape == (0, 32)
    f32 = torch.zeros(64, 8)
    assert cpu_half_f32.half_linear_silu(torch.zeros(129, 8), gate_up, None, f32) is None
    assert cpu_half_f32.half_linear_silu(torch.zeros(128, 8), gate_up, None, f32).shape == (128, 32)
    assert cpu_half_f32.half_linear_silu(torch.zeros(64, 8), PACKED, None) is None  # 3 panels
    monkeypatch.setattr(cpu_half_f32, "_gemv_kernels", lambda: None)
    cpu_half_f32.half_linear_silu(torch.zeros(1, 8), gate_up, None)
    assert calls[-1] == ("gemm+silu", 1)


@pytest.mark.parametrize(
    ("setting", "copies"), [(None, False), ("copy", True), ("1", False), ("0", False)]
)
def test_the_float32_copy_only_where_asked(monkeypatch, setting, copies):
    if setting is None:  # the default
        monkeypatch.delenv("PAGODA_CPU_HALF_WEIGHTS", raising=False)
    else:
        monkeypatch.setenv("PAGODA_CPU_HALF_WEIGHTS", setting)
    monkeypatch.setattr(cpu_half_f32.cpu_packed, "can_pack", lambda w: True)
    monkeypatch.setattr(cpu_half_f32.cpu_packed, "pack", lambda w: w + 1)
    monkeypatch.setattr(cpu_half_f32, "_meminfo", lambda: (4096, 4096))
    copy = cpu_half_f32.float32_copy(torch.zeros(16, 8))
    assert (copy is not None) == copies


def test_no_float32_copy_where_it_would_leave_under_a_quarter_of_memory(monkeypatch):
    monkeypatch.setenv("PAGODA_CPU_HALF_WEIGHTS", "copy")
    monkeypatch.setattr(cpu_half_f32.cpu_packed, "can_pack", lambda w: True)
    monkeypatch.setattr(cpu_half_f32.cpu_packed, "pack", lambda w: w + 1)
    weight = torch.zeros(16, 8)  # 512 bytes
    total = 4096
    monkeypatch.setattr(cpu_half_f32, "_meminfo", lambda: (total, 1024 + 512))
    assert cpu_half_f32.float32_copy(weight) is not None  # leaves exactly 1024 = total / 4
    monkeypatch.setattr(cpu_half_f32, "_meminfo", lambda: (total, 1024 + 511))
    assert cpu_half_f32.float32_copy(weight) is None
