"""Small-batch linears, old panel kernel vs the GEMV, against what a plain read
of the same bytes takes, in one process.

    python -m bench.gemv_ab [--rows 1 2 3 4] [--reps 15] [--threads 2] [--clock wall|thread]
        [--old REF]

The weights are SmolLM2-135M's as the engine packs them (30 layers of qkv, o,
gate/up with its SiLU and down, then the 49152-row LM head; 269 MB in huge
pages), and each step calls every layer's linears in model order, so each call
reads its weight from DRAM as a decode step does (32 MB of L3 holds an eighth of
it). Per linear kind and row count it prints the best and median time per call
of the panel kernel (gemm_bf16.cpp) and of the GEMV (gemv_bf16.cpp), called in
alternate steps, and the GB/s of its weight bytes; then the read bandwidth of
the same weights (a C++ loop that only reads, on the same threads, in the same
step order: what the GEMV could reach).
`--clock thread` times the calling thread's CPU time (use with --threads 1 on a
loaded host: other processes on the cores barely change it). `--old REF`: "old"
is the GEMV of git REF instead of the panel kernel (gemv_bf16.cpp and its headers
built apart, under their own name), "new" the working tree's, built the same way.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from kernels.cpu import isa_flags, load_cpu_kernels, load_gemv_kernels
from worker.layers import cpu_packed

LAYERS = 30
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LM_HEAD = (49152, 576)


def weights(gen: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    """(kind, packed weight) in a decode step's order."""
    out = []
    for _ in range(LAYERS):
        for kind, shape in SHAPES.items():
            w = (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)
            out.append((kind, cpu_packed.pack(w)))
    w = (torch.randn(*LM_HEAD, generator=gen) * 0.05).to(torch.bfloat16)
    out.append(("lm_head", cpu_packed.pack(w)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall")
    parser.add_argument("--old", help="git ref whose GEMV is `old` (default: the panel kernel)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    panel, gemv = load_cpu_kernels(), load_gemv_kernels()
    old_name = "bf16_panel"
    if args.old:
        panel, gemv, old_name = gemv_build(args.old), gemv_build(None), "gemv_bf16"
    gen = torch.Generator().manual_seed(0)
    step_weights = weights(gen)
    kinds = [*SHAPES, "lm_head"]
    nbytes = {kind: w.numel() * 2 for kind, w in step_weights}
    print(
        f"load {os.getloadavg()[0]:.1f}, threads {args.threads}, clock {args.clock}, "
        f"{sum(w.numel() * 2 for _, w in step_weights) / 1e6:.1f} MB per step"
    )

    def step(module, name: str, x: dict[int, torch.Tensor], times: dict[str, list[float]]) -> None:
        linear = getattr(module, name + "_linear")
        silu = getattr(module, name + "_linear_silu")
        for kind, w in step_weights:
            xin = x[w.shape[1] * 2]
            start = clock()
            (silu if kind == "gate_up" else linear)(xin, w, None)
            times[kind].append(clock() - start)

    for rows in args.rows:
        x = {k: torch.randn(rows, k, generator=gen).to(torch.bfloat16) for k in (576, 1536)}
        for kind, w in step_weights[:4] + step_weights[-1:]:
            xin = x[w.shape[1] * 2]
            ref = cpu_packed.packed_linear_silu if kind == "gate_up" else cpu_packed.packed_linear
            if args.old:
                ref = getattr(panel, "gemv_bf16_linear" + ("_silu" if kind == "gate_up" else ""))
            old = ref(xin, w, None)
            new = (gemv.gemv_bf16_linear_silu if kind == "gate_up" else gemv.gemv_bf16_linear)(
                xin, w
            )
            assert torch.equal(old, new), kind
        times = {m: {k: [] for k in kinds} for m in ("old", "new")}
        steps_of: dict[str, list[float]] = {"old": [], "new": []}
        for rep in range(args.reps):
            order = [("old", panel, old_name), ("new", gemv, "gemv_bf16")]
            for which, module, name in order if rep % 2 else order[::-1]:
                start = clock()
                step(module, name, x, times[which])
                steps_of[which].append(clock() - start)
        print(f"rows {rows}: per call, best / median us (GB/s of the weight at best)")
        for kind in kinds:
            cells = []
            for which in ("old", "new"):
                t = times[which][kind]
                best, med = min(t), statistics.median(t)
                cells.append(
                    f"{which} {best * 1e6:7.1f} / {med * 1e6:7.1f} ({nbytes[kind] / best / 1e9:5.1f})"
                )
            print(f"  {kind:8s} " + " | ".join(cells))
        for which in ("old", "new"):
            steps = steps_of[which]
            print(
                f"  {which} step (all linears) best {min(steps) * 1e3:.2f} median "
                f"{statistics.median(steps) * 1e3:.2f} ms"
            )
    reader = stream_reader()
    read_times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.reps):
        for kind, w in step_weights:
            start = clock()
            reader.stream_read(w)
            read_times[kind].append(clock() - start)
    print("plain read of the same bytes (stream_read, same threads and order), best:")
    for kind in kinds:
        best = min(read_times[kind])
        print(f"  {kind:8s} {best * 1e6:7.1f} us ({nbytes[kind] / best / 1e9:5.1f} GB/s)")


_GEMV_FILES = ("gemv_bf16.cpp", "vec16.h", "stream_prefetch.h", "linear_fn.h")


def gemv_build(ref: str | None):
    """gemv_bf16.cpp and its headers at git `ref` (None: the working tree), built as
    a module of their own, named by their content."""
    from bench.kernel_sources import kernel_file, load_staged

    # A header the ref's GEMV did not have yet is skipped.
    files = {n: d for n in _GEMV_FILES if (d := kernel_file(ref, n)) is not None}
    return load_staged("pagoda_gemv_ab", files, ["gemv_bf16.cpp"], isa_flags())


_READ_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <atomic>
// The bytes of t summed as int32 lanes, split in halves across the threads,
// lines prefetched 4 KB ahead: what a kernel that only reads could reach.
int64_t stream_read(const torch::Tensor& t) {
  const char* p = static_cast<const char*>(t.data_ptr());
  const int64_t n = t.numel() * t.element_size() / 256 * 256;
  std::atomic<int64_t> total{0};
  const int64_t threads = at::get_num_threads();
  at::parallel_for(0, threads, 1, [&](int64_t b, int64_t) {
    const int64_t lo = n / threads * b / 256 * 256, hi = b == threads - 1 ? n : n / threads * (b + 1) / 256 * 256;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = lo; i < hi; i += 256) {
      for (int l = 0; l < 4; ++l) _mm_prefetch(p + i + 4096 + 64 * l, _MM_HINT_T0);
      a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(p + i));
      a1 = _mm512_add_epi32(a1, _mm512_loadu_si512(p + i + 64));
      a2 = _mm512_add_epi32(a2, _mm512_loadu_si512(p + i + 128));
      a3 = _mm512_add_epi32(a3, _mm512_loadu_si512(p + i + 192));
    }
    total += _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
  });
  return total;
}
"""


def stream_reader():
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name="pagoda_gemv_ab_read",
        cpp_sources=_READ_SOURCE,
        functions=["stream_read"],
        extra_cflags=["-O3", "-march=native", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        build_directory=_build_dir(),
    )


def _build_dir() -> str:
    from pathlib import Path

    path = Path("/tmp/pagoda_gemv_ab_read")
    path.mkdir(exist_ok=True)
    return str(path)


if __name__ == "__main__":
    main()
