"""Half-storage float32 linears (kernels/cpu/gemm_half_f32.cpp) against the
float32 paths a CPU without fast bf16 has: MKL sgemm (F.linear on the float32
weight) and oneDNN's prepacked float32 linear (worker/layers/cpu_packed.py).

    python -m bench.avx2_half_linear [--isa avx2|native] [--rows 1,4,16,32,64,256,1024] [--reps 15]

Calls alternate within each round (A, B, C, A, B, C, ...), so a loaded or
drifting host slows them alike; it prints each path's median time and the
ratios. On a shared machine use one thread (default) and `--clock cpu`
(process CPU time: a preempted call is not charged for the wait); on a quiet
one, `--threads N --clock wall`. The shapes are SmolLM2-135M's linears (hidden 576) and its LM head.
Set ONEDNN_MAX_CPU_ISA=AVX2 and MKL_ENABLE_INSTRUCTIONS=AVX2 to hold the
float32 libraries to AVX2 as well when this runs on an AVX-512 machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from kernels.cpu import load_half_f32_kernels

SHAPES = {  # name: (N, K)
    "qkv": (960, 576),
    "o": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--isa", default="avx2")
    parser.add_argument("--rows", default="1,4,16,32,64,256,1024")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", default="cpu", choices=["cpu", "wall"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    kernels = load_half_f32_kernels(args.isa)
    half = getattr(torch, args.dtype)
    print(
        f"isa {args.isa} threads {torch.get_num_threads()} clock {args.clock} load {os.getloadavg()}"
    )
    print("shape     rows  mkl_f32_ms onednn_f32_ms half_ms  half/mkl half/onednn")
    gen = torch.Generator().manual_seed(0)
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w_half = (torch.randn(n, k, generator=gen) * 0.05).to(half)
        w32 = w_half.float()
        packed_half = kernels.pack_half_panels(w_half)
        packed32 = torch.ops.mkldnn._reorder_linear_weight(w32, 64)
        for m in (int(r) for r in args.rows.split(",")):
            if name == "lm_head" and m > 64:
                continue
            x = torch.randn(m, k, generator=gen)
            paths = {
                "mkl": lambda x=x, w=w32: F.linear(x, w),
                "onednn": lambda x=x, w=packed32: torch.ops.mkldnn._linear_pointwise(
                    x, w, None, "none", [], ""
                ),
                "half": lambda x=x, w=packed_half: kernels.half_panel_linear(x, w, None),
            }
            ref = paths["mkl"]()
            err = (paths["half"]() - ref).abs().max().item()
            times: dict[str, list[float]] = {p: [] for p in paths}
            for _ in range(args.reps):
                for p, call in paths.items():
                    start = clock()
                    call()
                    times[p].append(clock() - start)
            med = {p: statistics.median(t) * 1e3 for p, t in times.items()}
            print(
                f"{name:8s} {m:5d} {med['mkl']:10.3f} {med['onednn']:13.3f} {med['half']:7.3f}"
                f"  {med['half'] / med['mkl']:7.2f} {med['half'] / med['onednn']:10.2f}"
                f"   (max |half-mkl| {err:.1e})"
            )


if __name__ == "__main__":
    main()
