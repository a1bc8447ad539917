"""Float32 linears over half-stored weights at 1-256 rows (AVX2): two builds of
the half kernels and oneDNN's float32 copy, cold, in one process.

    bench/avx2_env.sh python -m bench.avx2_small_m_ab OLD_DIR NEW_DIR
        [--rows 1 4 8 9 16 36 64 128 256] [--reps 9] [--threads 2] [--clock wall|thread]

OLD_DIR and NEW_DIR each hold a copy of kernels/cpu (`git archive HEAD
kernels/cpu | tar -x -C /tmp/old`, and the working tree's kernels/cpu); only
gemm_half_f32.cpp and gemv_f32.cpp (with the folder's headers) are built from
each, for x86-64-v3. Each side routes rows as worker/layers/cpu_half_f32.py's
half_linear does: 1-8 rows to the GEMV, more to the half GEMM; each packs the
weights with its own pack_half_panels (the two builds' panel layouts may
differ). The third side, `onednn`, is what PAGODA_CPU_HALF_WEIGHTS=copy runs
above 128 rows: oneDNN's packed float32 linear over a float32 copy of the same
weights (twice the bytes).

The weights are SmolLM2-135M's (bench.small_m_ab's shapes: 30 layers of qkv,
o, gate/up, down, then the LM head), called in model order, so each call reads
its weight from DRAM as a decode step does. The sides alternate step by step
(old, new, onednn; the order rotates per rep). It prints per kind the best time
per call, GFLOP/s and % of the AVX2 FMA peak (a register-only loop on the same
threads, per thread CPU second, summed), and per step the best and median of
each side with per-pair ratios: new/old and new/onednn.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from bench.kernel_sources import load_staged
from bench.small_m_ab import KINDS, LAYERS, LM_HEAD, SHAPES, flops

_PEAK = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <time.h>
#include <atomic>
// 256-bit FMA FLOPs per second of thread CPU time, summed over the threads.
double peak_gflops(int64_t iters) {
  std::atomic<double> rate{0};
  std::atomic<int64_t> sink{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    // Named accumulators, not an array: GCC kept an array in memory (half the rate).
#define PEAK_ACC(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define PEAK_DECLARE(i) __m256 a##i = _mm256_set1_ps(i * 1e-3f);
#define PEAK_FMA(i) a##i = _mm256_fmadd_ps(a##i, b, c);
#define PEAK_SUM(i) s = _mm256_add_ps(s, a##i);
    PEAK_ACC(PEAK_DECLARE)
    __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-6f);
    for (int64_t it = 0; it < iters; ++it) {
      PEAK_ACC(PEAK_FMA)
      asm volatile("" : "+x"(b), "+x"(c));
    }
    __m256 s = _mm256_setzero_ps();
    PEAK_ACC(PEAK_SUM)
    sink += static_cast<int64_t>(s[0]);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    const double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    rate = rate + iters * 12 * 16.0 / secs / 1e9;
  });
  return rate + 0 * sink;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("peak_gflops", &peak_gflops, py::call_guard<py::gil_scoped_release>());
}
"""


def build(folder: Path | None, tag: str, source_name: str = "gemm_half_f32.cpp"):
    """folder's source_name (with the folder's headers) as its own module (folder
    None: the FMA peak loop), keyed by content (bench/kernel_sources.load_staged)."""
    from kernels.cpu import isa_flags

    if folder:
        files = {h.name: h.read_bytes() for h in folder.glob("*.h")}
        files[source_name] = (folder / source_name).read_bytes()
    else:
        files, source_name = {"peak.cpp": _PEAK.encode()}, "peak.cpp"
    return load_staged(f"pagoda_avx2_small_m_ab_{tag}", files, [source_name], isa_flags("avx2"))


def half_side(folder: Path, tag: str):
    """(pack, linear) of folder's build: linear(x, packed) routes as half_linear."""
    from worker.layers import cpu_half_f32

    gemm = build(folder, tag)
    gemv = build(folder, tag, "gemv_f32.cpp")

    def linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= cpu_half_f32._GEMV_MAX_ROWS:
            return gemv.gemv_half_f32_linear(x, packed, None)
        return gemm.half_panel_linear(x, packed, None)

    return gemm.pack_half_panels, linear


def step_weights(packs, gen: torch.Generator) -> list[tuple[str, list[torch.Tensor], torch.Tensor]]:
    """(kind, half panels by each of packs, oneDNN float32 copy) per linear, in model order."""
    shapes = [kind for _ in range(LAYERS) for kind in SHAPES] + ["lm_head"]
    out = []
    for kind in shapes:
        n, k = LM_HEAD if kind == "lm_head" else SHAPES[kind]
        w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16)
        out.append(
            (
                kind,
                [pack(w) for pack in packs],
                torch.ops.mkldnn._reorder_linear_weight(w.float(), 64),
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 9, 16, 36, 64, 128, 256])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    (old_pack, old), (new_pack, new) = half_side(args.old, "old"), half_side(args.new, "new")
    peak = max(build(None, "peak").peak_gflops(20_000_000) for _ in range(3))
    weights = step_weights([old_pack, new_pack], torch.Generator().manual_seed(0))
    sides = {
        "old": lambda x, half, f32: old(x, half[0]),
        "new": lambda x, half, f32: new(x, half[1]),
        "onednn": lambda x, half, f32: torch.ops.mkldnn._linear_pointwise(
            x, f32, None, "none", [], ""
        ),
    }
    print(
        f"load {os.getloadavg()[0]:.1f}, threads {args.threads}, clock {args.clock}, "
        f"cold weights, AVX2 FMA peak {peak:.0f} GFLOP/s"
    )
    gen = torch.Generator().manual_seed(1)
    for rows in args.rows:
        x = {k: torch.randn(rows, k, generator=gen) for k in (576, 1536)}
        for kind, half, f32 in weights[:4] + weights[-1:]:
            ref = sides["onednn"](x[f32.shape[1]], half, f32)
            for side in ("old", "new"):
                got = sides[side](x[f32.shape[1]], half, f32)
                torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5, msg=f"{side} {kind}")
        times = {s: {k: [] for k in KINDS} for s in sides}
        steps: dict[str, list[float]] = {s: [] for s in sides}
        order = list(sides)
        for rep in range(args.reps):
            for side in order[rep % 3 :] + order[: rep % 3]:
                call, t = sides[side], times[side]
                begin = clock()
                for kind, half, f32 in weights:
                    start = clock()
                    call(x[f32.shape[1]], half, f32)
                    t[kind].append(clock() - start)
                steps[side].append(clock() - begin)
        print(f"rows {rows}: best us per call, GFLOP/s, % of peak")
        for kind in KINDS:
            cells = []
            for side in sides:
                best = min(times[side][kind])
                gf = flops(kind, rows) / best / 1e9
                cells.append(f"{side} {best * 1e6:7.1f} {gf:5.0f} {100 * gf / peak:3.0f}%")
            print(f"  {kind:8s} " + " | ".join(cells))
        cells = [
            f"{s} best {min(v) * 1e3:.2f} median {statistics.median(v) * 1e3:.2f} ms"
            for s, v in steps.items()
        ]
        print("  step linears: " + " | ".join(cells))
        for other in ("old", "onednn"):
            pairs = sorted(n / o for n, o in zip(steps["new"], steps[other], strict=True))
            print(
                f"  step per-pair new/{other}: median {statistics.median(pairs):.3f}"
                f" (min {pairs[0]:.3f}, max {pairs[-1]:.3f}, {len(pairs)} pairs)"
            )


if __name__ == "__main__":
    main()
