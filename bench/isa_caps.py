"""What each layer of the CPU stack runs at: checks that an ISA cap took effect.

    bench/avx2_env.sh python -m bench.isa_caps [--no-kernels]

One line per layer, each read from the layer itself rather than from the
environment variables that ask for it:

* Pagoda's kernels: PAGODA_CPU_ISA, the build's -march, and the number of
  instructions in the built module that touch a zmm (AVX-512) register
  (objdump); 0 for an honest AVX2 build. Loading may compile it (minutes).
* ATen: torch.backends.cpu.get_cpu_capability() (ATEN_CPU_CAPABILITY).
* oneDNN: the ISA and the implementation of a packed float32 linear, from
  ONEDNN_VERBOSE in a child process (ONEDNN_MAX_CPU_ISA).
* MKL: its float32 GEMM rate with and without MKL_ENABLE_INSTRUCTIONS=SSE4_2 in
  child processes. On AMD CPUs MKL ignores the variable (the two rates agree),
  and picks its own path, which is not AVX-512 there.
* vLLM: the kernel library vLLM CPU would load here (its import_kernels logic
  over torch.cpu; bench/avx2_site makes torch.cpu answer as an AVX2-only CPU).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

_ONEDNN_PROBE = """
import torch
w = torch.ops.mkldnn._reorder_linear_weight(torch.randn(256, 256), 64)
torch.ops.mkldnn._linear_pointwise(torch.randn(64, 256), w, None, "none", [], "")
"""

_MKL_PROBE = """
import time, torch
torch.set_num_threads(1)
a, b = torch.randn(512, 512), torch.randn(512, 512)
torch.mm(a, b)
start = time.thread_time()
for _ in range(20):
    torch.mm(a, b)
print(20 * 2 * 512**3 / (time.thread_time() - start) / 1e9)
"""


def _child(code: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result.stdout


def onednn_line() -> str:
    out = _child(_ONEDNN_PROBE, ONEDNN_VERBOSE="1")
    isa = re.search(r"info,cpu,isa:(.*)", out)
    impl = re.search(r"exec,cpu,inner_product,([^,]+),", out)
    return (
        f"oneDNN: isa {isa.group(1).strip() if isa else '?'}; float32 packed linear runs "
        f"{impl.group(1) if impl else '?'} (ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')})"
    )


def mkl_line() -> str:
    asked = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "unset")
    here = float(_child(_MKL_PROBE) or "nan")
    sse = float(_child(_MKL_PROBE, MKL_ENABLE_INSTRUCTIONS="SSE4_2") or "nan")
    honoured = "honoured" if sse < 0.8 * here else "ignored on this CPU"
    return (
        f"MKL: sgemm 512^3, one thread: {here:.1f} GFLOP/s at MKL_ENABLE_INSTRUCTIONS={asked}, "
        f"{sse:.1f} at SSE4_2: the variable is {honoured}"
    )


def vllm_line() -> str:
    import torch

    cpu = torch.cpu
    if cpu._is_avx512_supported():
        lib = "vllm._C (AVX512-BF16 build)" if cpu._is_avx512_bf16_supported() else "vllm._C_AVX512"
    else:
        lib = "vllm._C_AVX2"
    return (
        f"vLLM CPU: torch.cpu says avx512={cpu._is_avx512_supported()}, "
        f"avx512_bf16={cpu._is_avx512_bf16_supported()}: it loads {lib}"
    )


def kernels_line() -> str:
    from kernels.cpu import isa_flags, load_cpu_kernels
    from shared import env

    flags = " ".join(f for f in isa_flags() if f.startswith("-march"))
    module = load_cpu_kernels()
    if module is None:
        return f"Pagoda kernels: PAGODA_CPU_ISA={env.cpu_isa()} ({flags}); not built here"
    listing = subprocess.run(
        ["objdump", "-d", module.__file__], capture_output=True, text=True
    ).stdout
    zmm = sum(1 for line in listing.splitlines() if "%zmm" in line)
    return (
        f"Pagoda kernels: PAGODA_CPU_ISA={env.cpu_isa()} ({flags}), {os.path.basename(module.__file__)}: "
        f"{zmm} instructions on zmm registers"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-kernels", action="store_true", help="skip Pagoda's kernels (no build)"
    )
    args = parser.parse_args()
    import torch

    print(
        f"ATen: {torch.backends.cpu.get_cpu_capability()} "
        f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')})"
    )
    print(onednn_line())
    print(mkl_line())
    print(vllm_line())
    if not args.no_kernels:
        print(kernels_line())


if __name__ == "__main__":
    main()
