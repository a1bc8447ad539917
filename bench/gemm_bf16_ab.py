"""The bf16 panel linear (kernels/cpu/gemm_bf16.cpp) at a git ref against the
working tree's, per SmolLM2-135M linear, in one process.

    python -m bench.gemm_bf16_ab [--old HEAD] [--rows 36 4096] [--reps 20] [--threads 2]

Only gemm_bf16.cpp and its headers are built for each side (about 30 s each,
where bench/kernel_ab.py builds the whole module per tree), under names keyed by
their contents. Per row count and linear (qkv, o, gate/up with its SiLU, down;
the 49152-row LM head up to 64 rows) it checks that both give the same bits, then
calls them alternately on the same input and prints each one's median time,
GFLOP/s and new/old. The weights stay in cache between calls where they fit
(a decode step streams them from DRAM: bench/gemv_ab.py measures that case).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.kernel_sources import kernel_file, load_staged
from kernels.cpu import isa_flags
from worker.runner.cpu_allocator import keep_freed_memory

_FILES = (
    "gemm_bf16.cpp",
    "kernel_api.h",
    "amx.h",
    "vec16.h",
    "panel_block_dp.h",
    "panel_block_amx.h",
)
_BINDING = b"""
#include <torch/extension.h>
#include "kernel_api.h"
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_bf16_panels", &pack_bf16_panels);
  m.def("bf16_panel_linear", &bf16_panel_linear);
  m.def("bf16_panel_linear_silu", &bf16_panel_linear_silu);
}
"""
# name: (out features, in features, fused SiLU)
SHAPES = {
    "qkv": (960, 576, False),
    "o": (576, 576, False),
    "gate_up": (3072, 576, True),
    "down": (576, 1536, False),
    "lm_head": (49152, 576, False),
}


def build(ref: str | None, prefix: str):
    files = {name: data for name in _FILES if (data := kernel_file(ref, name)) is not None}
    files["binding.cpp"] = _BINDING
    return load_staged(prefix, files, ["binding.cpp", "gemm_bf16.cpp"], isa_flags())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", default="HEAD", help="git ref of the old side (default HEAD)")
    parser.add_argument("--rows", type=int, nargs="+", default=[36, 4096])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--cold",
        action="store_true",
        help="read 64 MB before each call, so x and the weight come from DRAM",
    )
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    old, new = build(args.old, "pagoda_gemm_old"), build(None, "pagoda_gemm_new")
    gen = torch.Generator().manual_seed(0)
    flush = torch.ones(16 * 1024 * 1024)  # 64 MB: twice the L3 of the machines we meet
    # Half a second of both sides' threads at work before anything is timed: the
    # first ~100 calls after start-up ran at one thread's speed on a Zen 4 (qkv and
    # o at 36 rows, hot: 212 GFLOP/s, then 400 once warm).
    warm_x = torch.randn(36, 576, generator=gen).to(torch.bfloat16)
    warm_w = torch.randn(960, 576, generator=gen).to(torch.bfloat16)
    warm = [(m.bf16_panel_linear, m.pack_bf16_panels(warm_w)) for m in (old, new)]
    until = time.perf_counter() + 0.5
    while time.perf_counter() < until:
        for fn, packed in warm:
            fn(warm_x, packed, None)
    for rows in args.rows:
        for name, (n, k, silu) in SHAPES.items():
            if name == "lm_head" and rows > 64:
                continue
            x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
            weight = torch.randn(n, k, generator=gen).to(torch.bfloat16)
            calls = []
            for module in (old, new):
                fn = module.bf16_panel_linear_silu if silu else module.bf16_panel_linear
                calls.append((fn, module.pack_bf16_panels(weight)))
            outs = [fn(x, packed, None) for fn, packed in calls]
            assert torch.equal(outs[0], outs[1]), f"{name} at {rows} rows: old and new differ"
            times: list[list[float]] = [[], []]
            for _ in range(args.reps):
                for side, (fn, packed) in enumerate(calls):
                    if args.cold:
                        flush.sum()
                    start = time.perf_counter()
                    fn(x, packed, None)
                    times[side].append(time.perf_counter() - start)
            t_old, t_new = (statistics.median(t) for t in times)
            flops = 2 * rows * n * k
            print(
                f"{rows:5d} rows {name:8s} old {t_old * 1e3:8.3f} ms ({flops / t_old / 1e9:4.0f} GFLOP/s)"
                f"  new {t_new * 1e3:8.3f} ms ({flops / t_new / 1e9:4.0f})  new/old {t_new / t_old:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
