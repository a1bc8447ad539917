"""A CPU kernel build says that it runs, while it runs, and when it is done; and
`pagoda build-kernels` builds (or finds) them before any worker starts."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from kernels.cpu.build_progress import MODULE_NAME, build_reported
from tests.cluster import REPO_ROOT
from tests.conftest import wait_for


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kernels.cpu"]


def test_a_build_logs_its_start_progress_and_end(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="kernels.cpu")
    with build_reported(tmp_path, interval_s=0.01):
        wait_for(
            lambda: any(m.startswith("still compiling CPU kernels") for m in messages(caplog)),
            timeout=10,
            what="a progress line",
        )
    lines = messages(caplog)
    assert lines[0].startswith(f"compiling CPU kernels into {tmp_path}")
    assert "pagoda build-kernels" in lines[0]
    assert lines[-1].startswith("CPU kernels compiled in ")


def test_a_module_built_already_logs_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="kernels.cpu")
    (tmp_path / f"{MODULE_NAME}.so").write_bytes(b"")
    with build_reported(tmp_path, interval_s=0.01):
        pass
    assert messages(caplog) == []


def build_kernels(**env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "shared.cli", "build-kernels"],
        capture_output=True, text=True, env=environment, timeout=1800, cwd=REPO_ROOT,
    )  # fmt: skip


def test_build_kernels_leaves_the_module_in_the_cache():
    result = build_kernels()
    assert result.returncode == 0, result.stderr
    folder = result.stderr.rsplit("CPU kernels ready in ", 1)[1].strip()
    assert os.path.exists(os.path.join(folder, f"{MODULE_NAME}.so"))
    # Every module a worker may load is built, not only the attention kernels.
    for name in ("pagoda_weight_only", "pagoda_fp8_kv", "pagoda_half_f32"):
        built = [line for line in result.stderr.splitlines() if f"{name}: " in line]
        assert built, result.stderr
        assert os.path.exists(built[-1].rsplit(": ", 1)[1].strip())


def test_build_kernels_says_when_the_kernels_are_turned_off():
    result = build_kernels(PAGODA_CPU_KERNELS="0")
    assert result.returncode == 1
    assert "PAGODA_CPU_KERNELS=0" in result.stderr
