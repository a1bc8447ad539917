"""CPU kernels in C++, compiled on first use and cached per machine.

Each kernel has a plain-PyTorch twin in `kernels/`; when no compiler is
available the callers fall back to it (with a warning), so a bare install
still runs, only slower.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
from functools import cache
from pathlib import Path
from types import ModuleType

from kernels.cpu.build_progress import MODULE_NAME, build_reported
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
    # Keyed by content alone, so every checkout of the same sources shares one build
    # (the sources are compiled from a copy inside the folder, see _staged_sources).
    digest = hashlib.sha256()
    for source in [*_SOURCES, *_HEADERS]:
        digest.update(source.name.encode())
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


def _staged_sources(build_dir: Path) -> list[Path]:
    """The sources copied into `build_dir/src`: ninja's build command names the
    source paths, so compiling a checkout's own files would make two checkouts
    sharing the folder rebuild each other's build on every load."""
    src = build_dir / "src"
    src.mkdir(exist_ok=True)
    for source in [*_SOURCES, *_HEADERS]:
        target = src / source.name
        if not target.exists() or target.read_bytes() != source.read_bytes():
            shutil.copyfile(source, target)
    return [src / s.name for s in _SOURCES]


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

        build_dir = _build_dir()
        with open(build_dir / "pagoda.lock", "w") as guard:
            # torch's own lock is a file that a build killed midway leaves behind, and
            # every later load then waits on it forever. Whoever holds this flock (the
            # kernel drops it when a process dies) is the only builder, so a `lock`
            # file found while holding it is stale.
            try:
                fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                logger.info(
                    "another process is compiling the CPU kernels in %s: waiting", build_dir
                )
                fcntl.flock(guard, fcntl.LOCK_EX)
            (build_dir / "lock").unlink(missing_ok=True)
            with build_reported(build_dir):
                return load(
                    name=MODULE_NAME,
                    sources=[str(s) for s in _staged_sources(build_dir)],
                    extra_cflags=_FLAGS,
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(build_dir),
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
