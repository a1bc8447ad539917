"""bench/avx2_env.sh: the emulated AVX2-only CPU takes effect in every layer it caps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "avx2_env.sh"


def _under_avx2_env(*command: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(SCRIPT), *command], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return result.stdout


def test_the_script_sets_every_cap_and_the_site_folder():
    out = _under_avx2_env("env")
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert values["PAGODA_CPU_ISA"] == "avx2"
    assert values["ATEN_CPU_CAPABILITY"] == "avx2"
    assert values["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert values["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert values["PYTHONPATH"].split(":")[0] == str(ROOT / "bench" / "avx2_site")


def test_torch_cpu_answers_as_an_avx2_only_cpu():
    # What vLLM's import_kernels asks before choosing _C, _C_AVX512 or _C_AVX2.
    code = (
        "import torch; c = torch.cpu; "
        "print(c._is_avx512_supported(), c._is_avx512_bf16_supported(), "
        "c._is_amx_tile_supported(), c._is_vnni_supported(), "
        "torch.backends.cpu.get_cpu_capability())"
    )
    out = _under_avx2_env(sys.executable, "-c", code).split()
    assert out[:4] == ["False"] * 4
    if "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU lacks AVX2: ATen cannot run its AVX2 kernels here")
    assert out[4] == "AVX2"


def test_onednn_runs_its_avx2_kernels():
    import torch

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    if "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU lacks AVX2")
    from bench.isa_caps import _ONEDNN_PROBE

    out = _under_avx2_env("env", "ONEDNN_VERBOSE=1", sys.executable, "-c", _ONEDNN_PROBE)
    assert "isa:Intel AVX2" in out
    assert "brg_matmul:avx2" in out or ":avx2," in out
