"""Float32 linears at the bench model's shapes: which GEMM is fastest at which rows.

    bench/avx2_env.sh python -m bench.f32_linear_shapes [--rows 1,8,64,512,4096]

For each linear of a SmolLM2-135M-shaped layer (and the LM head) and each row
count, one thread's CPU time (time.thread_time, so a loaded machine barely moves
it) of:

* `onednn`: oneDNN's packed linear (torch.ops.mkldnn._linear_pointwise over a
  weight reordered at load), what Pagoda's float32 linears run (cpu_packed.py);
* `mkl`: `F.linear` on the plain [out, in] weight, MKL's sgemm, what vLLM CPU's
  float32 linears run.

Each figure is GFLOP/s (2 * rows * in * out / seconds) and its fraction of the
`--peak` (default: the best figure measured here, at the largest row count).
Under bench/avx2_env.sh both run their AVX2 kernels (python -m bench.isa_caps).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

# (name, in, out) of one SmolLM2-135M layer's linears and the LM head.
SHAPES = [
    ("qkv_proj", 576, 960),
    ("o_proj", 576, 576),
    ("gate_up_proj", 576, 3072),
    ("down_proj", 1536, 576),
    ("lm_head", 576, 49152),
]


def thread_seconds(fn, min_seconds: float = 0.05, repeats: int = 3) -> float:
    """One call's CPU time on this thread: calls batched until a batch takes
    `min_seconds`, best of `repeats` batches."""
    fn()
    calls = 1
    while True:
        start = time.thread_time()
        for _ in range(calls):
            fn()
        if time.thread_time() - start >= min_seconds:
            break
        calls *= 2
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return best


def measure(rows: int, k: int, n: int) -> dict[str, float]:
    x = torch.randn(rows, k)
    w = torch.randn(n, k) / k**0.5
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 64)
    flops = 2 * rows * k * n
    onednn = thread_seconds(
        lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    )
    mkl = thread_seconds(lambda: F.linear(x, w))
    return {"onednn": flops / onednn / 1e9, "mkl": flops / mkl / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,32,64,256,1024,4096")
    parser.add_argument("--peak", type=float, default=None, help="GFLOP/s of 100%%")
    parser.add_argument("--skip-lm-head", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [int(r) for r in args.rows.split(",")]
    shapes = [s for s in SHAPES if not (args.skip_lm_head and s[0] == "lm_head")]
    peak = args.peak
    print(
        f"torch {torch.__version__}, ATen {torch.backends.cpu.get_cpu_capability()}, "
        f"one thread, CPU time; GFLOP/s" + (f" (% of {peak:.0f})" if peak else "")
    )
    print("| linear | rows | oneDNN packed | MKL F.linear |")
    print("|---|---:|---:|---:|")
    for name, k, n in shapes:
        for r in rows:
            if name == "lm_head" and r > 64:
                continue  # only the sampled rows reach the LM head
            v = measure(r, k, n)
            cells = [f"{g:.1f}" + (f" ({g / peak:.0%})" if peak else "") for g in v.values()]
            print(f"| {name} | {r} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
