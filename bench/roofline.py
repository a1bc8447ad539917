"""`pagoda bench roofline`: this machine's measured peak, and the workload's bound.

Measured with every thread torch may use, best of `--repeats` timings each:

* matmul peak, GFLOP/s, for float32 and bfloat16: the faster of `torch.mm` and
  oneDNN's prepacked linear (the product Pagoda's and vLLM's CPU linears run)
  of two square n x n matrices (2 n^3 FLOPs). On AMD CPUs MKL's `torch.mm`
  alone reads 2-5x low: 96 vs 480 GFLOP/s fp32, 420 vs 930 bf16 on a Zen 5.
* memory bandwidth, GB/s: copying a 256 MiB tensor (bytes read + written) and
  summing it (bytes read).

The compute bound of a workload, in total (prompt + output) tokens/s, is what an
engine would reach if every FLOP of bench/model_flops.py ran at the matmul peak:

    bound = (prompt_tokens + output_tokens) / (workload FLOPs / peak FLOP/s)

Given offline results (`--result FILE`), each line for the same workload is rated
as a fraction of the float32 and bfloat16 bounds. A prefix cache skips work the
count includes, so shared-prefix results can exceed their bound. `--memory-only`
measures the bandwidth alone, as a `read_probe` line (no model, no workload).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from bench.jsonl import emit, read_records
from bench.machine import describe_machine
from bench.model_flops import ModelFlops
from bench.workloads import Workload, resolve_workloads

_MEMORY_BYTES = 256 * 2**20


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # first call: allocation, thread-pool start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


# A dtype without a fast kernel here (bf16 on AVX2-only CPUs: 0.3 GFLOP/s) would
# take minutes per 2048-wide product; such a dtype is timed at the probe's size.
_PROBE_SIZE = 256
_MAX_SECONDS_PER_PRODUCT = 2.0


def matmul_gflops(dtype, size: int = 2048, repeats: int = 5) -> float:
    import torch

    probe = _mm_seconds(torch, dtype, _PROBE_SIZE, 1)
    if probe * (size / _PROBE_SIZE) ** 3 > _MAX_SECONDS_PER_PRODUCT:
        size = _PROBE_SIZE
    return 2 * size**3 / _mm_seconds(torch, dtype, size, repeats) / 1e9


def _mm_seconds(torch, dtype, size: int, repeats: int) -> float:
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    seconds = _best_seconds(lambda: torch.mm(a, b, out=out), repeats)
    packed = _packed_weight(torch, b, size)
    if packed is not None:
        linear = torch.ops.mkldnn._linear_pointwise
        seconds = min(
            seconds, _best_seconds(lambda: linear(a, packed, None, "none", [], ""), repeats)
        )
    return seconds


def _packed_weight(torch, weight, rows: int):
    """`weight` reordered for oneDNN's linear, or None where this build or CPU
    cannot (no mkldnn; bf16 without AVX-512)."""
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    except (AttributeError, RuntimeError):
        return None


def memory_gb_s(repeats: int = 5, num_bytes: int = _MEMORY_BYTES) -> dict[str, float]:
    """Copy and read bandwidth of a `num_bytes` tensor (the default is far larger than
    any cache, so it measures DRAM)."""
    import torch

    src = torch.ones(num_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy = _best_seconds(lambda: dst.copy_(src), repeats)
    read = _best_seconds(src.sum, repeats)
    return {"copy": 2 * num_bytes / copy / 1e9, "read": num_bytes / read / 1e9}


def measure_peaks(size: int, repeats: int) -> dict[str, dict[str, float]]:
    import torch

    return {
        "matmul_gflops": {
            "float32": matmul_gflops(torch.float32, size, repeats),
            "bfloat16": matmul_gflops(torch.bfloat16, size, repeats),
        },
        "memory_gb_s": memory_gb_s(repeats),
    }


def bound_record(flops: ModelFlops, workload: Workload, peaks: dict, results: list[dict]) -> dict:
    """The workload's bound at each measured peak, and each result's fraction of it."""
    workload_flops = flops.workload_flops(workload)
    num_tokens = workload.num_prompt_tokens + workload.num_output_tokens
    bounds = {
        dtype: num_tokens / (workload_flops / (gflops * 1e9))
        for dtype, gflops in peaks["matmul_gflops"].items()
    }
    rated = [
        {
            "engine": r["engine"],
            "dtype": r.get("dtype"),
            "total_tokens_per_s": r["total_tokens_per_s"],
            **{f"fraction_of_{d}_bound": r["total_tokens_per_s"] / b for d, b in bounds.items()},
        }
        for r in results
        if r.get("workload") == workload.name and "total_tokens_per_s" in r
    ]
    return {
        "kind": "roofline",
        "workload": workload.name,
        "requests": len(workload.requests),
        "prompt_tokens": workload.num_prompt_tokens,
        "output_tokens": workload.num_output_tokens,
        "gflop": workload_flops / 1e9,
        # Weights a decoded token reads (bench/weight_bytes.py): linears + LM head.
        "decode_weight_params": (flops.linear_flops_per_token + flops.lm_head_flops_per_token) // 2,
        **peaks,
        "bound_total_tokens_per_s": bounds,
        "results": rated,
    }


def main(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))  # every measurement uses them all
    if args.memory_only:
        record = {"kind": "read_probe", "memory_gb_s": memory_gb_s(args.repeats)}
        emit({**record, "machine": describe_machine()}, args.output)
        return 0
    if args.model is None or args.workload is None:
        raise SystemExit(
            "pagoda bench roofline: --model and --workload are required (or --memory-only)"
        )
    from worker.models.loader import resolve_model_path
    from worker.models.spec import ModelSpec

    spec = ModelSpec.from_folder(resolve_model_path(args.model))
    flops = ModelFlops.from_spec(spec)
    results = read_records([args.result]) if args.result else []
    peaks = measure_peaks(args.matmul_size, args.repeats)
    specs = [args.workload] if isinstance(args.workload, str) else args.workload
    workloads = [
        w
        for one in specs
        for w in resolve_workloads(one, args.seed, spec.vocab_size, args.num_requests)
    ]
    for workload in workloads:
        record = bound_record(flops, workload, peaks, results)
        emit({**record, "model": args.model, "machine": describe_machine()}, args.output)
    return 0
