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
        "decode_stack.cpp",
    )
]
_HEADERS = [
    Path(__file__).with_name(name)
    for name in (
        "vec16.h",
        "amx.h",
        "decode_head_tile.h",
        "flash_tile.h",
        "flash_tile_pair.h",
        "flash_block_amx.h",
        "flash_tile_f32.h",
        "kv_half.h",
        "panel_block_dp.h",
        "panel_block_amx.h",
        "kernel_api.h",
        "linear_fn.h",
    )
]
# -fopenmp: at::parallel_for is header code that runs its loop on torch's OpenMP
# threads only when the extension itself is built with OpenMP (without it every
# kernel silently ran on one thread).
_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fno-finite-math-only", "-fopenmp"]

# PAGODA_CPU_ISA (shared/env.py) builds for another instruction set than this
# CPU's: `avx2` is x86-64-v3 (AVX2, FMA, F16C; no AVX-512), so the AVX2 code
# paths compile and run on an AVX-512 machine, for tests and measurements. The
# flags are part of the cache key and the module name carries the ISA, so both
# builds coexist on disk and in one process.
_ISA_MARCH = {"native": "-march=native", "avx2": "-march=x86-64-v3"}


def isa_flags(isa: str | None = None) -> list[str]:
    """The compiler flags of a build for `isa` (default: PAGODA_CPU_ISA)."""
    isa = isa or env.cpu_isa()
    return [_ISA_MARCH[isa] if f == "-march=native" else f for f in _FLAGS]


def _module_name(name: str, isa: str) -> str:
    return name if isa == "native" else f"{name}_{isa}"


# The weight-only linears build as their own module: a change to them does not
# rebuild the attention kernels (and the reverse).
_WEIGHT_ONLY_SOURCES = [Path(__file__).with_name("gemm_weight_only.cpp")]
# The small-batch linears' prefetch hint for weights read once a step.
_STREAM_PREFETCH_HEADERS = [Path(__file__).with_name("stream_prefetch.h")]

# FP8 KV cache (--kv-cache-dtype fp8): cache write and attention over e4m3
# caches, their own module too, so a change to either attention path does not
# rebuild the other.
_FP8_KV_SOURCES = [Path(__file__).with_name("paged_attention_fp8.cpp")]
_FP8_KV_HEADERS = [Path(__file__).with_name(name) for name in ("fp8_e4m3.h", "vec16.h")]

# Half-storage float32 linears for CPUs without fast bf16: their own module too.
_HALF_F32_SOURCES = [Path(__file__).with_name("gemm_half_f32.cpp")]
# The panels' column order and their widen, shared with the GEMV below.
# Each linear module also exports its kernels' C++ entry points (linear_fn.h).
_HALF_PANEL_HEADERS = [Path(__file__).with_name(name) for name in ("half_panel.h", "linear_fn.h")]
# vec16.h: the fused gate/up linear's SiLU is silu_and_mul_f32's (bit for bit).
_HALF_F32_HEADERS = [*_HALF_PANEL_HEADERS, Path(__file__).with_name("vec16.h")]


def _or_attention(sources, headers) -> tuple[list[Path], list[Path]]:
    """The given module's files, or by default the main module's (read at call time)."""
    return (_SOURCES if sources is None else sources), (_HEADERS if headers is None else headers)


def _read_sources(
    sources: list[Path] | None = None, headers: list[Path] | None = None
) -> dict[str, bytes]:
    """Each file's name -> its bytes, read once: the folder's key and the copy compiled
    in it must be the same bytes, or a file edited while a load waits on another's
    build would be compiled into the folder keyed by its old content."""
    sources, headers = _or_attention(sources, headers)
    return {source.name: source.read_bytes() for source in [*sources, *headers]}


def _build_dir(
    sources: list[Path] | None = None,
    headers: list[Path] | None = None,
    isa: str | None = None,
    contents: dict[str, bytes] | None = None,
) -> Path:
    # -march=native code only runs where it was built: key the cache by machine too.
    # Keyed by content and toolchain, so every checkout of the same sources shares one build
    # (the sources are compiled from a copy inside the folder, see _staged_sources).
    contents = _read_sources(sources, headers) if contents is None else contents
    digest = hashlib.sha256()
    for name, data in contents.items():
        digest.update(name.encode())
        digest.update(data)
    digest.update(" ".join(isa_flags(isa)).encode())
    digest.update(platform.machine().encode())
    digest.update(_cpu_model().encode())
    digest.update(_toolchain().encode())
    root = Path(
        os.environ.get("PAGODA_KERNEL_CACHE", Path.home() / ".cache" / "pagoda" / "kernels")
    )
    path = root / digest.hexdigest()[:16]
    path.mkdir(parents=True, exist_ok=True)
    return path


def _toolchain() -> str:
    """The Python and torch a build compiles against. Their include paths are in the
    folder's build.ninja, so two environments sharing one folder (a venv and the
    system Python, say) made ninja rebuild the whole module at every switch: a
    worker restarted under the other one spent minutes compiling."""
    import sys

    import torch

    return f"{sys.prefix}|{sys.version}|{Path(torch.__file__).parent}|{torch.__version__}"


def _staged_sources(
    build_dir: Path,
    sources: list[Path] | None = None,
    headers: list[Path] | None = None,
    contents: dict[str, bytes] | None = None,
) -> list[Path]:
    """The sources copied into `build_dir/src`: ninja's build command names the
    source paths, so compiling a checkout's own files would make two checkouts
    sharing the folder rebuild each other's build on every load."""
    contents = _read_sources(sources, headers) if contents is None else contents
    sources, _ = _or_attention(sources, headers)
    src = build_dir / "src"
    src.mkdir(exist_ok=True)
    for name, data in contents.items():
        target = src / name
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
    return [src / s.name for s in sources]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor()


@cache
def load_cpu_kernels(isa: str | None = None) -> ModuleType | None:
    """The compiled module, or None when it cannot be built here (or
    PAGODA_CPU_KERNELS=0 asks for the plain-PyTorch paths). isa: build for
    that instruction set instead of PAGODA_CPU_ISA's (tests of the AVX2 paths)."""
    return _load(MODULE_NAME, _SOURCES, _HEADERS, isa or env.cpu_isa())


@cache
def load_weight_only_kernels(isa: str | None = None) -> ModuleType | None:
    """The weight-only linears (gemm_weight_only.cpp), or None as load_cpu_kernels."""
    return _load(
        "pagoda_weight_only", _WEIGHT_ONLY_SOURCES, _STREAM_PREFETCH_HEADERS, isa or env.cpu_isa()
    )


@cache
def load_fp8_kv_kernels(isa: str | None = None) -> ModuleType | None:
    """The FP8 KV cache kernels (paged_attention_fp8.cpp), or None as load_cpu_kernels."""
    return _load("pagoda_fp8_kv", _FP8_KV_SOURCES, _FP8_KV_HEADERS, isa or env.cpu_isa())


def load_half_f32_kernels(isa: str | None = None) -> ModuleType | None:
    """The half-storage float32 linears (gemm_half_f32.cpp), or None as load_cpu_kernels."""
    return _load_half_f32(isa or env.cpu_isa())


@cache
def _load_half_f32(isa: str) -> ModuleType | None:
    return _load("pagoda_half_f32", _HALF_F32_SOURCES, _HALF_F32_HEADERS, isa)


def cpu_runs(isa: str) -> bool:
    """Whether this CPU executes a build for `isa` (native: always)."""
    if isa == "native":
        return True
    flags = _cpu_flags()
    return all(f in flags for f in ("avx2", "fma", "f16c"))


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _load(name: str, sources: list[Path], headers: list[Path], isa: str) -> ModuleType | None:
    if not env.cpu_kernels():
        return None
    if not cpu_runs(isa):
        logger.warning("PAGODA_CPU_ISA=%s: this CPU cannot run that build; plain PyTorch", isa)
        return None
    name = _module_name(name, isa)
    try:
        from torch.utils.cpp_extension import load

        contents = _read_sources(sources, headers)
        build_dir = _build_dir(sources, headers, isa, contents)
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
            with build_reported(build_dir, name):
                return load(
                    name=name,
                    sources=[
                        str(s) for s in _staged_sources(build_dir, sources, headers, contents)
                    ],
                    extra_cflags=isa_flags(isa),
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(build_dir),
                    verbose=False,
                )
    except Exception as exc:  # no compiler, no ninja, headers missing: run the reference
        logger.warning("CPU kernels unavailable, using the plain-PyTorch reference: %s", exc)
        return None


def fused_elementwise_kernels(x) -> ModuleType | None:
    """The kernels when `x` is a bf16 or float32 CPU tensor they take, else None (use the twin)."""
    # Asked by every norm, RoPE and activation call: is_cpu, not device.type (a
    # device object per call), and no import statement per call.
    if not x.is_cpu or x.dtype not in _fused_dtypes():
        return None
    return load_cpu_kernels()


@cache
def _fused_dtypes() -> tuple:
    import torch  # lazily, as everywhere in this module

    return (torch.bfloat16, torch.float32)


# The small-batch bf16 GEMV (gemv_bf16.cpp): its own module, so a change to it
# does not rebuild the attention kernels (and the reverse).
_GEMV_SOURCES = [Path(__file__).with_name("gemv_bf16.cpp")]


@cache
def load_gemv_kernels(isa: str | None = None) -> ModuleType | None:
    """The 1-4 row bf16 linears over packed panels, or None as load_cpu_kernels."""
    headers = [
        Path(__file__).with_name(n) for n in ("vec16.h", "linear_fn.h")
    ] + _STREAM_PREFETCH_HEADERS
    return _load("pagoda_gemv", _GEMV_SOURCES, headers, isa or env.cpu_isa())


# The 1-8 row float32 GEMV over half panels (gemv_f32.cpp), for CPUs without
# fast bf16: its own module, so a change to it rebuilds nothing else.
_GEMV_F32_SOURCES = [Path(__file__).with_name("gemv_f32.cpp")]


@cache
def load_gemv_f32_kernels(isa: str | None = None) -> ModuleType | None:
    """The half-storage float32 GEMV (gemv_f32.cpp), or None as load_cpu_kernels."""
    headers = [*_HALF_PANEL_HEADERS, *_STREAM_PREFETCH_HEADERS]
    return _load("pagoda_gemv_f32", _GEMV_F32_SOURCES, headers, isa or env.cpu_isa())
