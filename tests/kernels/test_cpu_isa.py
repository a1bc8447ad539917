"""PAGODA_CPU_ISA: the AVX2 build of the CPU kernels beside the native one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import kernels.cpu as cpu
from shared import env


def test_avx2_build_targets_x86_64_v3_in_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_KERNEL_CACHE", str(tmp_path))
    assert "-march=native" in cpu.isa_flags("native")
    avx2 = cpu.isa_flags("avx2")
    assert "-march=x86-64-v3" in avx2 and "-march=native" not in avx2
    assert cpu._build_dir(isa="avx2") != cpu._build_dir(isa="native")
    # The native folder's key is unchanged by the override's existence.
    assert cpu._build_dir() == cpu._build_dir(isa="native")
    assert cpu._module_name("pagoda_cpu_kernels", "avx2") == "pagoda_cpu_kernels_avx2"


def test_env_reads_the_isa(monkeypatch):
    monkeypatch.delenv("PAGODA_CPU_ISA", raising=False)
    assert env.cpu_isa() == "native"
    monkeypatch.setenv("PAGODA_CPU_ISA", "AVX2")
    assert env.cpu_isa() == "avx2"
    assert cpu.isa_flags() == cpu.isa_flags("avx2")
    monkeypatch.setenv("PAGODA_CPU_ISA", "avx512")
    with pytest.raises(ValueError, match="native or avx2"):
        env.cpu_isa()


def test_avx2_override_means_no_fast_bf16(monkeypatch):
    from worker.runner.platform import cpu_has_fast_bf16

    monkeypatch.setenv("PAGODA_CPU_ISA", "avx2")
    assert cpu_has_fast_bf16() is False


def test_a_cpu_without_avx2_does_not_load_the_avx2_build(monkeypatch):
    monkeypatch.setattr(cpu, "_cpu_flags", lambda: {"sse2", "avx"})
    assert not cpu.cpu_runs("avx2")
    assert cpu._load("pagoda_x", [], [], "avx2") is None


# The float32 kernel tests (flash prefill tiles, cascade prefix, fused
# elementwise, decode attention, half-storage linears) rerun against the AVX2
# build: every 8-lane PAGODA_AVX2_HALVES branch of vec16.h and the flash tile's
# rows in two 8-lane vectors. Slow: the AVX2 build of the main module takes
# minutes on a first run.
F32_TESTS = [
    "tests/kernels/test_cpu_elementwise.py",
    "tests/kernels/test_cpu_paged_attention_prefill.py",
    "tests/kernels/test_cpu_cascade_prefix.py",
    "tests/kernels/test_cpu_paged_attention.py",
    "tests/kernels/test_cpu_row_argmax.py",
]


@pytest.mark.slow
def test_float32_kernel_tests_pass_on_the_avx2_build():
    if not cpu.cpu_runs("avx2"):
        pytest.skip("this CPU cannot run the AVX2 build (it lacks AVX2, FMA or F16C)")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *F32_TESTS],
        cwd=root,
        env={**os.environ, "PAGODA_CPU_ISA": "avx2", "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
