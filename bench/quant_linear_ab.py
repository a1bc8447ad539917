"""Quantized linears against the dense one, calls interleaved in one process.

    python -m bench.quant_linear_ab [--shape smollm2|qwen2.5-1.5b] [--rows 1 8 32] [--reps N]
        [--methods dense int8 int8-torch int4 int4-torch int4-dequant fp8 bitsandbytes]
        [--layers L] [--cpu-time]

Each method gets its own copy of L layers' linears (q/k/v fused, o, gate/up
fused, down) of the shape, built through the engine's layers and quantization
methods from the same random bf16 weights, so every call streams its weights
from DRAM as a decode step does. Per rows count, the methods run one after the
other, rep after rep, and each method's median over the reps is printed with
its weight bytes and its ratio to `dense` (bf16, the dtype `--dtype auto`
takes on a CPU with native bf16).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from worker.layers.linear import ReplicatedLinear
from worker.layers.quantization import int_weight, resolve_quantization

panels_fit = int_weight.byte_panels_fit

SHAPES = {  # (hidden, intermediate, q size, kv size)
    "smollm2": (576, 1536, 576, 192),
    "qwen2.5-1.5b": (1536, 8960, 1536, 256),
}


def _linears(shape: str) -> list[tuple[int, int]]:
    hidden, inter, q, kv = SHAPES[shape]
    return [(hidden, q + 2 * kv), (q, hidden), (hidden, 2 * inter), (inter, hidden)]


def build(method: str, shape: str, num_layers: int, seed: int = 0) -> list[ReplicatedLinear]:
    """`int8-torch` / `int4-torch`: torch's kernels where Pagoda's would run."""
    name = {"int4-dequant": "int4", "dense": None}.get(method, method.removesuffix("-torch"))
    int_weight.byte_panels_fit = (lambda *_: False) if method.endswith("-torch") else panels_fit
    quant = resolve_quantization(None, name)
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(num_layers):
        for in_features, out_features in _linears(shape):
            layer = ReplicatedLinear(
                in_features, out_features, quant_config=quant, params_dtype=torch.bfloat16
            )
            weight = torch.randn(out_features, in_features, generator=gen) * 0.05
            layer.weight.data.copy_(weight.to(torch.bfloat16))
            # int4-dequant: the twin, as PAGODA_CPU_QUANTIZED_KERNELS=0 serves it.
            os.environ["PAGODA_CPU_QUANTIZED_KERNELS"] = "0" if method == "int4-dequant" else "1"
            layer.process_weights_after_loading()
            layers.append(layer)
    return layers


def weight_bytes(layers) -> int:
    return sum(p.numel() * p.element_size() for layer in layers for p in layer.parameters())


@torch.inference_mode()
def run(layers, xs: dict[int, torch.Tensor]) -> None:
    for layer in layers:
        layer(xs[layer.input_size])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="One thread, timed by its CPU time (time.thread_time): on a host other "
        "processes load, time spent descheduled does not count.",
    )
    parser.add_argument(
        "--methods", nargs="+", default=["dense", "int8", "int4", "int4-dequant", "fp8"]
    )
    args = parser.parse_args()
    clock = time.perf_counter
    if args.cpu_time:
        torch.set_num_threads(1)
        clock = time.thread_time
    built = {m: build(m, args.shape, args.layers) for m in args.methods}
    hidden, inter, q, _ = SHAPES[args.shape]
    timing = "thread CPU time" if args.cpu_time else "wall clock"
    print(f"shape {args.shape}, {args.layers} layers, {torch.get_num_threads()} threads, {timing}")
    for m, layers in built.items():
        kernels = sorted({getattr(layer, "int_kernel", "-") for layer in layers})
        print(f"  {m:14s} weights {weight_bytes(layers) / 2**20:8.1f} MiB  kernels {kernels}")
    for rows in args.rows:
        gen = torch.Generator().manual_seed(rows)
        xs = {n: torch.randn(rows, n, generator=gen).to(torch.bfloat16) for n in {hidden, inter, q}}
        times: dict[str, list[float]] = {m: [] for m in built}
        for m in built:  # warm-up
            run(built[m], xs)
        for _ in range(args.reps):
            for m, layers in built.items():
                start = clock()
                run(layers, xs)
                times[m].append(clock() - start)
        base = statistics.median(times[args.methods[0]])
        best_base = min(times[args.methods[0]])
        for m in built:
            med, best = statistics.median(times[m]), min(times[m])
            print(
                f"rows {rows:4d}  {m:14s} median {med * 1e3:8.2f} ms {med / base:5.2f}x   "
                f"best {best * 1e3:8.2f} ms {best / best_base:5.2f}x"
            )


if __name__ == "__main__":
    main()
