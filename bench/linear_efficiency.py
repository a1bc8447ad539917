"""GFLOP/s and GB/s of the packed bf16 linears over a whole model's weights, per linear.

    python -m bench.linear_efficiency [--rows 1,8,16,37,64,4096] [--threads 2] [--reps 6]

A decode step streams every layer's weights from DRAM, so a linear timed alone
on one layer's weight (in cache) overstates it. Here 30 SmolLM2-135M-shaped
layers (qkv 960x576, o 576x576, gate/up 3072x576 with SiLU, down 576x1536) and
the LM head (49152x576) are packed as the engine packs them and placed in its
huge-page weight arena (worker/huge_pages.py): with 4 KiB pages the same pass
ran at 16 rows at 300 against 370-400 GFLOP/s on a Zen 4, the TLB misses of the
weight stream. Each rep runs every linear of every layer in model order at the
given rows; the table is the median rep's time per kind of linear, summed over
the layers, as GFLOP/s and as the weight bytes read per second. Compare GFLOP/s
with the CPU's bf16 peak (`bench roofline`) and GB/s with its read bandwidth.
"""

from __future__ import annotations

import argparse
import time

import torch

from kernels.cpu import load_cpu_kernels
from worker.huge_pages import place_weight

SHAPES = {
    "qkv": (960, 576),
    "o": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
}  # [out, in]
LM_HEAD = (49152, 576)
LAYERS = 30


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1,8,16,37,64,4096", help="Comma-separated row counts.")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reps", type=int, default=6)
    args = parser.parse_args()
    kernels = load_cpu_kernels()
    if kernels is None or not kernels.bf16_gemm_supported():
        raise SystemExit("the packed bf16 linear needs AVX512-BF16 or AMX and a C++ compiler")
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)

    def packed(n: int, k: int) -> torch.Tensor:
        return place_weight(kernels.pack_bf16_panels(torch.randn(n, k, generator=gen).bfloat16()))

    layers = [{name: packed(*shape) for name, shape in SHAPES.items()} for _ in range(LAYERS)]
    weights = {name: (LAYERS, *shape) for name, shape in SHAPES.items()} | {
        "lm_head": (1, *LM_HEAD)
    }
    lm_head = packed(*LM_HEAD)
    print(f"| rows | {' | '.join(weights)} |  (GFLOP/s, GB/s of weights; {args.threads} threads)")
    print("|---:|" + "---:|" * len(weights))
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, 576, generator=gen).bfloat16()
        h = torch.randn(rows, 1536, generator=gen).bfloat16()
        times: dict[str, list[float]] = {name: [] for name in weights}
        for _ in range(args.reps + 1):  # the first rep warms up
            spent = dict.fromkeys(weights, 0.0)
            for layer in layers:
                for name, w in layer.items():
                    linear = (
                        kernels.bf16_panel_linear_silu
                        if name == "gate_up"
                        else kernels.bf16_panel_linear
                    )
                    start = time.perf_counter()
                    linear(h if name == "down" else x, w, None)
                    spent[name] += time.perf_counter() - start
            start = time.perf_counter()
            kernels.bf16_panel_linear(x, lm_head, None)
            spent["lm_head"] += time.perf_counter() - start
            for name in weights:
                times[name].append(spent[name])
        cells = []
        for name, (count, n, k) in weights.items():
            median = sorted(times[name][1:])[args.reps // 2]
            cells.append(
                f"{2 * rows * n * k * count / median / 1e9:.0f}, {2 * n * k * count / median / 1e9:.1f}"
            )
        print(f"| {rows} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
