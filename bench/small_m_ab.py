"""bf16 linears at 1-128 rows, two builds of the bf16 kernels in one process,
against this machine's vdpbf16ps peak measured in the same process.

    python -m bench.small_m_ab OLD_DIR NEW_DIR [--rows 1 4 8 16 36 64 128]
        [--reps 9] [--threads 2] [--clock wall|thread] [--hot]

OLD_DIR and NEW_DIR each hold a copy of kernels/cpu (e.g. `git archive HEAD
kernels/cpu | tar -x -C /tmp/old`, and the working tree's kernels/cpu). Only
gemm_bf16.cpp (with a small binding of its own) and gemv_bf16.cpp are built
from each, so an A/B costs minutes, not a whole main-module build. Each side
routes rows as its worker/layers/cpu_packed.py would: the GEMV up to its
`max_rows`, the panel kernel above.

The weights are SmolLM2-135M's as the engine packs them (30 layers of qkv, o,
gate/up with its SiLU, down, then the 49152-row LM head, 269 MB in huge pages),
called in model order, so each call reads its weight from DRAM as a decode
step does; `--hot` instead repeats one layer (weights in cache). Old and new
alternate step by step. Per kind and rows it prints the best time per call,
GFLOP/s and % of the peak (and GB/s of the weight where the rows are few enough
that the read bounds it), then the step's linear time (all 121 calls) each side.
The peak is a register-only vdpbf16ps loop on the same threads (24 independent
accumulators per thread), per thread CPU second, summed over threads, best of 5.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import time
from pathlib import Path

import torch

from worker.huge_pages import place_weight

LAYERS = 30
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LM_HEAD = (49152, 576)
KINDS = [*SHAPES, "lm_head"]

_BINDING = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <time.h>
#include <atomic>
#include <optional>
bool bf16_gemm_supported();
torch::Tensor pack_bf16_panels(const torch::Tensor& weight);
torch::Tensor bf16_panel_linear(const torch::Tensor&, const torch::Tensor&, const std::optional<torch::Tensor>&);
torch::Tensor bf16_panel_linear_silu(const torch::Tensor&, const torch::Tensor&, const std::optional<torch::Tensor>&);
// vdpbf16ps FLOPs per second of thread CPU time, summed over the threads: `iters`
// rounds of 24 independent chains each (a loaded host's other work drops out).
double peak_gflops(int64_t iters) {
  std::atomic<int64_t> sink{0};
  std::atomic<double> rate{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    __m512 a[24];
    for (int i = 0; i < 24; ++i) a[i] = _mm512_set1_ps(i * 1e-3f);
    __m512bh w = (__m512bh)_mm512_set1_epi32(0x3f803f80), x = (__m512bh)_mm512_set1_epi32(0x3c003c00);
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
      for (int i = 0; i < 24; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, w);
      asm volatile("" : "+v"(w), "+v"(x));
    }
    __m512 s = a[0];
    for (int i = 1; i < 24; ++i) s = _mm512_add_ps(s, a[i]);
    sink += static_cast<int64_t>(_mm512_reduce_add_ps(s));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    const double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    rate = rate + iters * 24 * 64.0 / secs / 1e9;
  });
  return rate + 0 * sink;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("bf16_gemm_supported", &bf16_gemm_supported);
  m.def("pack_bf16_panels", &pack_bf16_panels, nogil);
  m.def("bf16_panel_linear", &bf16_panel_linear, py::arg("x"), py::arg("packed"), py::arg("bias") = py::none(), nogil);
  m.def("bf16_panel_linear_silu", &bf16_panel_linear_silu, py::arg("x"), py::arg("packed"),
        py::arg("bias") = py::none(), nogil);
  m.def("peak_gflops", &peak_gflops, nogil);
}
"""


def build(folder: Path, tag: str):
    """(panel module, gemv module) built from folder's gemm_bf16.cpp and gemv_bf16.cpp."""
    from torch.utils.cpp_extension import load

    from kernels.cpu import isa_flags

    # Keyed by the folder too: helpers sharing a host each A/B their own copies.
    key = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:8]
    tag = f"{tag}_{key}"
    out = Path("/tmp") / f"pagoda_small_m_ab_{tag}"
    src = out / "src"
    src.mkdir(parents=True, exist_ok=True)
    # Every header: the two files include more of them as kernels move into their own.
    for path in [folder / "gemm_bf16.cpp", folder / "gemv_bf16.cpp", *folder.glob("*.h")]:
        shutil.copyfile(path, src / path.name)
    (src / "binding.cpp").write_text(_BINDING)
    mods = []
    for name, sources in (
        ("panel", ["gemm_bf16.cpp", "binding.cpp"]),
        ("gemv", ["gemv_bf16.cpp"]),
    ):
        build_dir = out / name
        build_dir.mkdir(exist_ok=True)
        mods.append(
            load(
                name=f"pagoda_small_m_ab_{tag}_{name}",
                sources=[str(src / s) for s in sources],
                extra_cflags=isa_flags("native"),
                extra_ldflags=["-fopenmp"],
                build_directory=str(build_dir),
                verbose=False,
            )
        )
    return tuple(mods)


def router(panel, gemv):
    """kind -> call(x, w), routed by rows as cpu_packed does."""

    def call(kind: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        small = x.shape[0] <= gemv.max_rows
        module, name = (gemv, "gemv_bf16") if small else (panel, "bf16_panel")
        suffix = "_linear_silu" if kind == "gate_up" else "_linear"
        return getattr(module, name + suffix)(x, w, None)

    return call


def step_weights(pack, gen: torch.Generator, hot: bool) -> list[tuple[str, torch.Tensor]]:
    out = []
    for layer in range(LAYERS):
        for kind, shape in SHAPES.items():
            if hot and layer:
                out.append(out[list(SHAPES).index(kind)])  # layer 0's
                continue
            w = (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)
            out.append((kind, place_weight(pack(w))))
    w = (torch.randn(*LM_HEAD, generator=gen) * 0.05).to(torch.bfloat16)
    out.append(("lm_head", place_weight(pack(w))))
    return out


def flops(kind: str, rows: int) -> float:
    n, k = LM_HEAD if kind == "lm_head" else SHAPES[kind]
    return 2.0 * rows * n * k


def pair_ratios(times: dict, kind: str, reps: int) -> list[float]:
    """new/old of one kind's summed time per rep (old and new ran back to back)."""
    per = len(times["old"][kind]) // reps
    sums = {
        s: [sum(t[kind][i * per : (i + 1) * per]) for i in range(reps)] for s, t in times.items()
    }
    return [n / o for n, o in zip(sums["new"], sums["old"], strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 36, 64, 128])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall")
    parser.add_argument("--hot", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    old_panel, old_gemv = build(args.old, "old")
    new_panel, new_gemv = build(args.new, "new")
    sides = {"old": router(old_panel, old_gemv), "new": router(new_panel, new_gemv)}
    peak = max(new_panel.peak_gflops(200_000) for _ in range(5))
    weights = step_weights(old_panel.pack_bf16_panels, torch.Generator().manual_seed(0), args.hot)
    nbytes = {kind: w.numel() * 2 for kind, w in weights}
    print(
        f"load {os.getloadavg()[0]:.1f}, threads {args.threads}, clock {args.clock}, "
        f"{'hot' if args.hot else 'cold'} weights, vdpbf16ps peak {peak:.0f} GFLOP/s, "
        f"gemv rows old <= {old_gemv.max_rows}, new <= {new_gemv.max_rows}"
    )
    gen = torch.Generator().manual_seed(1)
    for rows in args.rows:
        x = {k: torch.randn(rows, k, generator=gen).to(torch.bfloat16) for k in (576, 1536)}
        for kind, w in weights[:4] + weights[-1:]:
            a, b = (sides[s](kind, x[w.shape[1] * 2], w) for s in ("old", "new"))
            assert torch.equal(a, b), (kind, rows)
        times = {s: {k: [] for k in KINDS} for s in sides}
        steps: dict[str, list[float]] = {s: [] for s in sides}
        for rep in range(args.reps):
            for side in ("old", "new") if rep % 2 else ("new", "old"):
                call, t = sides[side], times[side]
                begin = clock()
                for kind, w in weights:
                    start = clock()
                    call(kind, x[w.shape[1] * 2], w)
                    t[kind].append(clock() - start)
                steps[side].append(clock() - begin)
        print(f"rows {rows}: best us per call, GFLOP/s, % of peak (GB/s of the weight)")
        for kind in KINDS:
            cells = []
            for side in sides:
                best = min(times[side][kind])
                gf = flops(kind, rows) / best / 1e9
                cells.append(
                    f"{side} {best * 1e6:7.1f} {gf:6.0f} {100 * gf / peak:3.0f}%"
                    f" ({nbytes[kind] / best / 1e9:5.1f})"
                )
            ratio = min(times["new"][kind]) / min(times["old"][kind])
            pairs = pair_ratios(times, kind, args.reps)
            print(
                f"  {kind:8s} " + " | ".join(cells) + f" | new/old best {ratio:.3f}"
                f" pairs median {statistics.median(pairs):.3f}"
            )
        best = {s: min(v) for s, v in steps.items()}
        med = {s: statistics.median(v) for s, v in steps.items()}
        print(
            f"  step linears: old best {best['old'] * 1e3:.2f} median {med['old'] * 1e3:.2f} ms"
            f" | new best {best['new'] * 1e3:.2f} median {med['new'] * 1e3:.2f} ms"
            f" | new/old best {best['new'] / best['old']:.3f} median {med['new'] / med['old']:.3f}"
        )
        pairs = sorted(n / o for n, o in zip(steps["new"], steps["old"], strict=True))
        print(
            f"  step per-pair new/old: median {statistics.median(pairs):.3f}"
            f" (min {pairs[0]:.3f}, max {pairs[-1]:.3f}, {len(pairs)} pairs)"
        )


if __name__ == "__main__":
    main()
