"""Every environment variable Pagoda reads, typed, in one place.

Pagoda's own variables carry the `PAGODA_` prefix; `REDIS_URL` and the
Hugging Face variables keep their conventional names.
"""

from __future__ import annotations

import os


def log_level() -> str:
    return os.environ.get("PAGODA_LOG_LEVEL", "INFO")


def redis_url() -> str | None:
    return os.environ.get("REDIS_URL") or None


def api_key() -> str | None:
    """The key clients must send to the router (`--api-key` overrides it)."""
    return os.environ.get("PAGODA_API_KEY") or None


def cpu_threads() -> int | None:
    value = os.environ.get("PAGODA_CPU_THREADS")
    return int(value) if value else None


def cpu_packed_linear() -> bool:
    """Whether bf16 linear weights on CPU are prepacked for oneDNN (on unless set to 0)."""
    return os.environ.get("PAGODA_CPU_PACKED_LINEAR", "1") not in ("0", "false", "False")


def cpu_kernels() -> bool:
    """Whether the C++ CPU kernels are used (on unless set to 0: plain PyTorch)."""
    return os.environ.get("PAGODA_CPU_KERNELS", "1") not in ("0", "false", "False")


def cpu_isa() -> str:
    """The instruction set the C++ CPU kernels are built for: `native` (default,
    -march=native) or `avx2` (x86-64-v3: AVX2, FMA, F16C, no AVX-512), which also
    makes the engine choose as on a CPU without native bf16 (worker/runner/platform.py):
    the AVX2 paths, run and measured on an AVX-512 machine."""
    value = os.environ.get("PAGODA_CPU_ISA", "native").lower() or "native"
    if value not in ("native", "avx2"):
        raise ValueError(f"PAGODA_CPU_ISA={value!r}: expected native or avx2")
    return value


def cpu_half_weights() -> bool:
    """Whether, on a CPU without native bf16, float32 linear weights that are exact
    bf16/fp16 values (a half checkpoint) are stored in that half dtype and widened
    in registers (worker/layers/cpu_half_f32.py). PAGODA_CPU_HALF_WEIGHTS: `1`
    (the default: half panels alone, for every row count), `copy` (plus oneDNN's
    float32 copy for more than 128 rows: 1.5x the float32 linears' memory, for
    no prefill speed on a Zen 3), `0` (float32 only). Emulated AVX2, one thread:
    one-stream decode 0.35-0.54x the float32 engine's time, 4-8 streams 0.47-0.76x."""
    value = os.environ.get("PAGODA_CPU_HALF_WEIGHTS", "1")
    return value in ("1", "true", "True", "copy")


def cpu_half_weights_copy() -> bool:
    """Whether half-stored linears also keep a float32 copy for more than 128 rows
    (PAGODA_CPU_HALF_WEIGHTS=copy): prefill through oneDNN's float32 linear, for
    1.5x the float32 linear weights' memory. Not the default: on a real Zen 3 the
    half GEMM is level with it at prefill (offline `prefill`, 7 pairs: throughput
    half/copy median 1.02, 530 MiB less peak memory for SmolLM2-135M)."""
    return os.environ.get("PAGODA_CPU_HALF_WEIGHTS", "1") == "copy"


def cpu_prefill_kernel() -> bool:
    """Whether bf16 prefill attention uses the C++ kernel where the CPU has AMX or
    AVX512-BF16 (on unless set to 0: torch's SDPA, for comparing the two)."""
    return os.environ.get("PAGODA_CPU_PREFILL_KERNEL", "1") not in ("0", "false", "False")


def cpu_bf16_gemm() -> bool:
    """Whether packed bf16 linears use Pagoda's panel kernel (AMX or AVX512-BF16) where the
    CPU has it (on unless set to 0: oneDNN's prepacked linear, for comparing)."""
    return os.environ.get("PAGODA_CPU_BF16_GEMM", "1") not in ("0", "false", "False")


def cpu_quantized_kernels() -> bool:
    """Whether integer weight-only linears on CPU use torch's int8/int4 kernels where
    the shape fits (on unless set to 0: dequantize-then-matmul, for comparing)."""
    return os.environ.get("PAGODA_CPU_QUANTIZED_KERNELS", "1") not in ("0", "false", "False")


def cpu_malloc_tuning() -> bool:
    """Whether the worker sets glibc malloc to keep freed buffers mapped (on unless
    set to 0; worker/runner/cpu_allocator.py)."""
    return os.environ.get("PAGODA_CPU_MALLOC_TUNING", "1") not in ("0", "false", "False")


def hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")


def rendezvous_timeout() -> float:
    """Seconds a tensor-parallel rank waits for the others to join (default 120)."""
    return float(os.environ.get("PAGODA_RENDEZVOUS_TIMEOUT", "120"))


def cpu_shm_all_reduce() -> bool:
    """Whether CPU tensor-parallel ranks on one machine all-reduce through shared
    memory (on unless set to 0: gloo, the plain twin, for comparing)."""
    return os.environ.get("PAGODA_CPU_SHM_ALLREDUCE", "1") not in ("0", "false", "False")
