"""Float32 linears at 1-16 rows on a CPU without fast bf16, against the
bandwidth bound of the weights as stored, in one process.

    bench/avx2_env.sh python -m bench.avx2_gemv_f32 [--rows 1 2 4 8 16] [--reps 9] \
        [--threads 1] [--clock thread|wall]

Paths, called in alternate order within each rep:
* onednn: oneDNN's prepacked float32 linear over float32 weights (the engine's
  path when weights are upcast at load; worker/layers/cpu_packed.py),
* half: gemm_half_f32.cpp over the bf16 panels (PAGODA_CPU_HALF_WEIGHTS=1),
* gemv: gemv_f32.cpp over the same bf16 panels (1-8 rows).
The weights are SmolLM2-135M's (30 layers of qkv, o, gate_up, down, then the
49152-row LM head; 538 MB in float32, 269 MB in bf16) and each step calls every
layer's linears in model order, so each call reads its weight from DRAM as a
decode step does. Per kind and row count it prints the best time per call and
the GB/s of the weight bytes as stored, and that as a % of a plain AVX2 read of
the same bytes (same threads, same order: what a linear could reach).
`--clock thread` times the calling thread's CPU time (use with --threads 1 on
a loaded host); `--clock wall` with --threads 2 on a quiet one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from kernels.cpu import load_gemv_f32_kernels, load_half_f32_kernels

LAYERS = 30
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LM_HEAD = (49152, 576)
KINDS = [*SHAPES, "lm_head"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["wall", "thread"], default="thread")
    parser.add_argument("--isa", default="avx2")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    half_k, gemv_k = load_half_f32_kernels(args.isa), load_gemv_f32_kernels(args.isa)
    gen = torch.Generator().manual_seed(0)
    layers = []  # (kind, half panels, oneDNN float32)
    for kind, shape in [(k, s) for _ in range(LAYERS) for k, s in SHAPES.items()] + [
        ("lm_head", LM_HEAD)
    ]:
        w = (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)
        f32 = torch.ops.mkldnn._reorder_linear_weight(w.float(), 64)
        layers.append((kind, half_k.pack_half_panels(w), f32))
    numel = {kind: h.numel() for kind, h, _ in layers}
    print(
        f"load {os.getloadavg()[0]:.1f}, threads {args.threads}, clock {args.clock}, "
        f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA')}, "
        f"{sum(h.numel() for _, h, _ in layers) * 2 / 1e6:.0f} MB bf16 per step"
    )
    reader = stream_reader()
    # oneDNN's float32 weights have no storage to read: the read of the bf16
    # panels (in DRAM alike, the step's bytes are 8x L3) stands for both.
    read: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(args.reps):
        for kind, h, _ in layers:
            start = clock()
            reader.stream_read(h)
            read[kind].append(clock() - start)
    bw = {k: numel[k] * 2 / min(t) / 1e9 for k, t in read.items()}
    print("plain AVX2 read, GB/s: " + ", ".join(f"{k} {bw[k]:.1f}" for k in KINDS))

    def paths(rows: int):
        out = {
            "onednn": lambda x, h, f: torch.ops.mkldnn._linear_pointwise(
                x, f, None, "none", [], ""
            ),
            "half": lambda x, h, f: half_k.half_panel_linear(x, h, None),
        }
        if rows <= gemv_k.gemv_f32_max_rows():
            out["gemv"] = lambda x, h, f: gemv_k.gemv_half_f32_linear(x, h, None)
        return out

    for rows in args.rows:
        x = {k: torch.randn(rows, k, generator=gen) for k in (576, 1536)}
        calls = paths(rows)
        for kind, h, f in layers[:4] + layers[-1:]:
            ref = calls["onednn"](x[h.shape[1]], h, f)
            for name, call in calls.items():
                err = (call(x[h.shape[1]], h, f) - ref).abs().max().item()
                assert err < 1e-3 * ref.abs().max().item(), (name, kind, err)
        times = {p: {k: [] for k in KINDS} for p in calls}
        step_ms = {p: [] for p in calls}
        order = list(calls)
        for rep in range(args.reps):
            for name in order[rep % len(order) :] + order[: rep % len(order)]:
                call, total = calls[name], 0.0
                for kind, h, f in layers:
                    start = clock()
                    call(x[h.shape[1]], h, f)
                    took = clock() - start
                    times[name][kind].append(took)
                    total += took
                step_ms[name].append(total * 1e3)
        print(f"rows {rows}: best us per call, GB/s as stored, % of the AVX2 read of those bytes")
        for kind in KINDS:
            cells = []
            for name in calls:
                best = min(times[name][kind])
                gbs = numel[kind] * (4 if name == "onednn" else 2) / best / 1e9
                cells.append(f"{name} {best * 1e6:7.1f} {gbs:5.1f} ({gbs / bw[kind]:4.0%})")
            print(f"  {kind:8s} " + " | ".join(cells))
        print(
            "  step (all linears) ms, best / median: "
            + " | ".join(
                f"{n} {min(s):.2f} / {statistics.median(s):.2f}" for n, s in step_ms.items()
            )
        )


_READ_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <atomic>
// The bytes of t summed as int32 lanes (AVX2), split across the threads, lines
// prefetched 1 KB ahead: what a kernel that only reads could reach.
int64_t stream_read(const torch::Tensor& t) {
  const char* p = static_cast<const char*>(t.data_ptr());
  const int64_t n = t.numel() * t.element_size() / 128 * 128;
  std::atomic<int64_t> total{0};
  const int64_t threads = at::get_num_threads();
  at::parallel_for(0, threads, 1, [&](int64_t b, int64_t) {
    const int64_t lo = n / threads * b / 128 * 128, hi = b == threads - 1 ? n : n / threads * (b + 1) / 128 * 128;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = lo; i < hi; i += 128) {
      _mm_prefetch(p + i + 1024, _MM_HINT_T0);
      _mm_prefetch(p + i + 1088, _MM_HINT_T0);
      a0 = _mm256_add_epi32(a0, _mm256_loadu_si256((const __m256i*)(p + i)));
      a1 = _mm256_add_epi32(a1, _mm256_loadu_si256((const __m256i*)(p + i + 32)));
      a2 = _mm256_add_epi32(a2, _mm256_loadu_si256((const __m256i*)(p + i + 64)));
      a3 = _mm256_add_epi32(a3, _mm256_loadu_si256((const __m256i*)(p + i + 96)));
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
    alignas(32) int lanes[8];
    _mm256_store_si256((__m256i*)lanes, s);
    int64_t sum = 0;
    for (int l = 0; l < 8; ++l) sum += lanes[l];
    total += sum;
  });
  return total;
}
"""


def stream_reader():
    from pathlib import Path

    from torch.utils.cpp_extension import load_inline

    build = Path("/tmp/pagoda_avx2_read")
    build.mkdir(exist_ok=True)
    return load_inline(
        name="pagoda_avx2_read",
        cpp_sources=_READ_SOURCE,
        functions=["stream_read"],
        extra_cflags=["-O3", "-march=x86-64-v3", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(build),
    )


if __name__ == "__main__":
    main()
