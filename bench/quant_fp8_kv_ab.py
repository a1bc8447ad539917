"""Decode and prefill attention over an fp8 (e4m3) KV cache against a bf16 one, CPU kernels:

    python -m bench.quant_fp8_kv_ab [--rounds 7] [--seqs 32] [--context 512]

Qwen2.5-1.5B's heads (12 query, 2 KV, head_dim 128), blocks of 16 scattered
over a pool, one thread, each call timed by thread CPU time (a loaded host's
descheduling does not count) and the two caches alternated round by round;
medians. Decode: one row per sequence (paged_attention_fp8 vs
paged_attention_decode); prefill: one 512-token prompt (vs
paged_attention_prefill). Prints the times and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kernels.cpu import load_cpu_kernels, load_fp8_kv_kernels

HEADS, KV_HEADS, DIM, BLOCK = 12, 2, 128, 16


def _setup(num_seqs: int, context: int, num_new: int, gen: torch.Generator):
    blocks_per = -(-context // BLOCK)
    num_blocks = num_seqs * blocks_per + 1
    perm = torch.randperm(num_blocks, generator=gen)[: num_seqs * blocks_per]
    tables = perm.view(num_seqs, blocks_per).to(torch.int32).contiguous()
    shape = (num_blocks, BLOCK, KV_HEADS, DIM)
    k = (torch.randn(shape, generator=gen)).to(torch.bfloat16)
    v = (torch.randn(shape, generator=gen)).to(torch.bfloat16)
    k8, v8 = k.clamp(-448, 448).to(torch.float8_e4m3fn), v.clamp(-448, 448).to(torch.float8_e4m3fn)
    query = torch.randn(num_seqs * num_new, HEADS, DIM, generator=gen).to(torch.bfloat16)
    lens = torch.full((num_seqs,), context, dtype=torch.int32)
    starts = torch.arange(num_seqs + 1, dtype=torch.int64) * num_new
    return query, (k, v), (k8, v8), tables, lens, starts


def _time(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--context", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dense, fp8 = load_cpu_kernels(), load_fp8_kv_kernels()
    gen = torch.Generator().manual_seed(0)
    scale = DIM**-0.5
    q, (k, v), (k8, v8), tables, lens, starts = _setup(args.seqs, args.context, 1, gen)
    out = torch.empty_like(q)
    rows = starts[:-1].contiguous()
    cases = {
        "decode bf16": lambda: dense.paged_attention_decode(
            q, k, v, tables, lens, rows, out, scale, 0, 0, None, None
        ),
        "decode fp8": lambda: fp8.paged_attention_fp8(q, k8, v8, tables, lens, starts, out, scale),
    }
    pq, (pk, pv), (pk8, pv8), ptables, plens, pstarts = _setup(1, 512, 512, gen)
    pout = torch.empty_like(pq)
    ranges = torch.tensor([[0, 512]], dtype=torch.int64)
    if dense.prefill_supported(DIM, True):
        cases["prefill bf16"] = lambda: dense.paged_attention_prefill(
            pq, pk, pv, ptables, plens, ranges, pout, scale, 0
        )
    cases["prefill fp8"] = lambda: fp8.paged_attention_fp8(
        pq, pk8, pv8, ptables, plens, pstarts, pout, scale
    )
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # alternate: a drifting host drifts for both
        for name, fn in cases.items():
            results[name].append(_time(fn, 1))
    med = {name: statistics.median(t) for name, t in results.items()}
    for name, t in med.items():
        print(f"{name}: {t * 1e6:.0f} us (CPU time, 1 thread, median of {args.rounds})")
    print(f"decode fp8 / bf16: {med['decode fp8'] / med['decode bf16']:.2f}")
    if "prefill bf16" in med:
        print(f"prefill fp8 / bf16: {med['prefill fp8'] / med['prefill bf16']:.2f}")


if __name__ == "__main__":
    main()
