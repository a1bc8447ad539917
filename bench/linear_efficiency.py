"""GFLOP/s and GB/s of the bf16 linears as a step runs them over a whole model's weights, per linear.

    python -m bench.linear_efficiency [--rows 1,8,16,37,64,4096] [--threads 2] [--reps 6]

A decode step streams every layer's weights from DRAM, so a linear timed alone
on one layer's weight (in cache) overstates it. Here bench/gemv_ab.py's
SmolLM2-135M weights (30 layers of qkv, o, gate/up with its SiLU and down, then
the LM head, packed by the engine's cpu_packed.pack into its huge-page arena)
run through the engine's own dispatch (cpu_packed.packed_linear and
packed_linear_silu: the GEMV at 1-6 rows, the panel kernel above), every linear
of every layer in model order at the given rows. With 4 KiB pages the same pass
ran at 16 rows at 300 against 370-400 GFLOP/s on a Zen 4, the TLB misses of the
weight stream. The table is the median rep's time per kind of linear, summed
over the layers, as GFLOP/s and as the weight bytes read per second. Compare
GFLOP/s with the CPU's bf16 peak (`bench roofline`) and GB/s with its read
bandwidth.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.gemv_ab import LAYERS, LM_HEAD, SHAPES, weights
from worker.layers import cpu_packed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1,8,16,37,64,4096", help="Comma-separated row counts.")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    step_weights = weights(gen)
    if any(w.dim() != 3 for _, w in step_weights):
        raise SystemExit("the packed bf16 linear needs AVX512-BF16 or AMX and a C++ compiler")
    # kind -> (linears of that kind per step, out, in)
    kinds = {kind: (LAYERS, *shape) for kind, shape in SHAPES.items()} | {"lm_head": (1, *LM_HEAD)}
    print(f"| rows | {' | '.join(kinds)} |  (GFLOP/s, GB/s of weights; {args.threads} threads)")
    print("|---:|" + "---:|" * len(kinds))
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, 576, generator=gen).bfloat16()
        h = torch.randn(rows, 1536, generator=gen).bfloat16()
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(args.reps + 1):  # the first rep warms up
            spent = dict.fromkeys(kinds, 0.0)
            for kind, w in step_weights:
                linear = (
                    cpu_packed.packed_linear_silu if kind == "gate_up" else cpu_packed.packed_linear
                )
                start = time.perf_counter()
                linear(h if kind == "down" else x, w, None)
                spent[kind] += time.perf_counter() - start
            for kind in kinds:
                times[kind].append(spent[kind])
        cells = []
        for kind, (count, n, k) in kinds.items():
            median = sorted(times[kind][1:])[args.reps // 2]
            cells.append(
                f"{2 * rows * n * k * count / median / 1e9:.0f}, {2 * n * k * count / median / 1e9:.1f}"
            )
        print(f"| {rows} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
