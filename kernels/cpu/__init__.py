"""CPU kernels in C++, compiled on first use and cached per machine.

Each kernel has a plain-PyTorch twin in `kernels/`; when no compiler is
available the callers fall back to it (with a warning), so a bare install
still runs, only slower.
"""

from __future__ import annotations

import hashlib
import os
import platform
from functools import cache
from pathlib import Path
from types import ModuleType

from shared import env
from shared.logging import get_logger

logger = get_logger(__name__)

_SOURCES = [
    Path(__file__).with_name(name)
    for name in (
        "module.cpp",
        "paged_attention_decode.cpp",
        "paged_attention_prefill.cpp",
        "cascade_prefix.cpp",
        "elementwise.cpp",
        "elementwise_f32.cpp",
        "cache_write.cpp",
        "gemm_bf16.cpp",
        "row_argmax.cpp",
    )
]
_HEADERS = [
    Path(__file__).with_name(name)
    for name in ("vec16.h", "amx.h", "decode_head_tile.h", "flash_tile.h", "flash_tile_f32.h")
]
# -fopenmp: at::parallel_for is header code that runs its loop on torch's OpenMP
# threads only when the extension itself is built with OpenMP (without it every
# kernel silently ran on one thread).
_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fno-finite-math-only", "-fopenmp"]


def _build_dir() -> Path:
    # -march=native code only runs where it was built: key the cache by machine too.
    # And by the sources' paths: ninja's build command names them, so two checkouts
    # sharing one folder would each rebuild the other's build on every load.
    digest = hashlib.sha256()
    for source in [*_SOURCES, *_HEADERS]:
        digest.update(str(source.resolve()).encode())
        digest.update(source.read_bytes())
    digest.update(" ".join(_FLAGS).encode())
    digest.update(platform.machine().encode())
    digest.update(_cpu_model().encode())
    root = Path(
        os.environ.get("PAGODA_KERNEL_CACHE", Path.home() / ".cache" / "pagoda" / "kernels")
    )
    path = root / digest.hexdigest()[:16]
    path.mkdir(parents=True, exist_ok=True)
    return path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor()


@cache
def load_cpu_kernels() -> ModuleType | None:
    """The compiled module, or None when it cannot be built here (or
    PAGODA_CPU_KERNELS=0 asks for the plain-PyTorch paths)."""
    if not env.cpu_kernels():
        return None
    try:
        from torch.utils.cpp_extension import load

        return load(
            name="pagoda_cpu_kernels",
            sources=[str(s) for s in _SOURCES],
            extra_cflags=_FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(_build_dir()),
            verbose=False,
        )
    except Exception as exc:  # no compiler, no ninja, headers missing: run the reference
        logger.warning("CPU kernels unavailable, using the plain-PyTorch reference: %s", exc)
        return None


def fused_elementwise_kernels(x) -> ModuleType | None:
    """The kernels when `x` is a bf16 or float32 CPU tensor they take, else None (use the twin)."""
    import torch

    if x.dtype not in (torch.bfloat16, torch.float32) or x.device.type != "cpu":
        return None
    return load_cpu_kernels()
