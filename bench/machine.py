"""What a result was measured on: every result line carries this, since figures from
two machines (or one machine under other load) do not compare."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

# CPU features that decide which dtype is fast (see worker/runner/platform.py).
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _cpuinfo() -> tuple[str, list[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), []
    model, flags = platform.machine(), []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == platform.machine():
            model = value.strip()
        elif key == "flags" and not flags:
            flags = value.split()
    return model, flags


def describe_machine(with_torch: bool = True) -> dict[str, Any]:
    """CPU model and features, cores, load; torch's version and thread count unless
    `with_torch` is False (a load-generating client need not import it)."""
    model, flags = _cpuinfo()
    machine: dict[str, Any] = {
        "cpu": model,
        "cpu_flags": [f for f in _FLAGS if f in flags],
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }
    if with_torch:
        import torch

        machine["torch"] = torch.__version__
        machine["threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            machine["gpu"] = torch.cuda.get_device_name()
    return machine
