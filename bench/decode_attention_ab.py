"""Decode attention kernel alone, old build vs new, against a plain read of its KV.

    python -m bench.decode_attention_ab [--old REF] [--seqs 1 16 36 64] [--dtype bf16|f32]
        [--cache same|bf16|f16] [--isa native|avx2] [--reps 15] [--threads 2]
        [--clock wall|thread|process] [--hot]

Both builds hold only paged_attention_decode.cpp (REF's copy, default main, vs the
working tree's), compiled with the flags of `--isa`, so a change builds in a minute
instead of the whole kernel module's many. Each step calls the kernel once per
layer of SmolLM2-135M (30 layers, 9/3 heads of 64, blocks of 8) over its own
cache, scattered through a pool twice the size in 2 MiB pages, so K/V come from
DRAM as in an engine step. Sequence lengths are the `mixed` workload's at the
decode step that runs that many sequences (prompt + tokens so far). Per count it
prints best and median ms per step (30 layers) of old and new, called in
alternate order, and the KV GB/s and % of `read`: a loop that only reads the same
blocks on the same threads, each prefetching its blocks 8 ahead into L2 (what the
kernel could reach: on a Zen 4 25-30 GB/s at 16-64 sequences, where the kernel
reads ~20; stops before 45 prefetched into L1 and read ~20 too).
On a loaded host use `--threads 1 --clock thread` (the caller's CPU time), and
`--hot` (every layer on layer 0's cache) to see the compute alone. `--dtype f32
--cache bf16` is a float32 model's half cache (kernels/cpu/kv_half.h; both builds
must have it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from bench.kernel_sources import kernel_file, load_staged
from bench.workloads import make_workload
from kernels.cpu import isa_flags
from worker.huge_pages import huge_page_mapping

LAYERS, HEADS, KV_HEADS, DIM, BLOCK = 30, 9, 3, 64, 8
FILES = ("paged_attention_decode.cpp", "decode_head_tile.h", "vec16.h", "kv_half.h")

_BIND = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <vector>
#include "kernel_api.h"  // the working tree's declaration of paged_attention_decode
typedef int32_t iv8 __attribute__((vector_size(32)));  // native on AVX2 too
// Every K and V block each sequence attends, whole blocks, summed as int32
// lanes: sequences longest first dealt out in turn to the threads (as the
// kernel's counter roughly does), each thread prefetching the blocks 8 on in its
// own list into L2 (prefetcht2), a line of K and of V per line read. On a Zen 4,
// 36 sequences of the `mixed` step (blocks of 8 scattered in 2 MiB pages), in a
// throwaway copy of this loop: 30-36.5 GB/s, against 19.5 prefetching into L1
// (prefetcht0, the loop's until stop 45) at any distance and 17.3 without
// prefetch; 4 blocks on 32.0, 16 on 34.8, 32 on 31.7 (one moment of the host).
int64_t read_kv(const torch::Tensor& kc, const torch::Tensor& vc, const torch::Tensor& tables,
                const torch::Tensor& lens) {
  const char* k = static_cast<const char*>(kc.data_ptr());
  const char* v = static_cast<const char*>(vc.data_ptr());
  const int64_t block_bytes = kc.stride(0) * kc.element_size(), row_bytes = block_bytes / kc.size(1);
  const int32_t* bt = tables.data_ptr<int32_t>();
  const int32_t* ln = lens.data_ptr<int32_t>();
  const int64_t n = lens.size(0), width = tables.size(1);
  std::vector<int64_t> order(n);
  for (int64_t s = 0; s < n; ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ln[a] > ln[b]; });
  const int64_t threads = std::min<int64_t>(n, at::get_num_threads());
  std::atomic<int64_t> total{0};
  at::parallel_for(0, threads, 1, [&](int64_t lo, int64_t) {
    std::vector<std::pair<int64_t, int64_t>> blocks;  // (offset, bytes)
    for (int64_t i = lo; i < n; i += threads) {
      const int64_t s = order[i], bytes = ln[s] * row_bytes;
      for (int64_t b = 0; b * block_bytes < bytes; ++b)
        blocks.push_back({static_cast<int64_t>(bt[s * width + b]) * block_bytes,
                          std::min(block_bytes, bytes - b * block_bytes)});
    }
    iv8 a0{}, a1{};
    // The prefetch cursor: a line of K and one of V per line of K read, 8 blocks on.
    size_t pb = 0;
    int64_t po = 0;
    auto prefetch = [&](int64_t lines) {
      for (; lines > 0 && pb < blocks.size(); --lines) {
        __builtin_prefetch(k + blocks[pb].first + po, 0, 1);
        __builtin_prefetch(v + blocks[pb].first + po, 0, 1);
        if ((po += 64) >= blocks[pb].second) po = 0, ++pb;
      }
    };
    for (size_t i = 0; i < std::min<size_t>(8, blocks.size()); ++i) prefetch((blocks[i].second + 63) / 64);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto [at, end] = blocks[i];
      for (const char* base : {k, v})
        for (int64_t o = 0; o < end; o += 64) {
          if (base == k) prefetch(1);
          iv8 x, y;
          __builtin_memcpy(&x, base + at + o, 32);
          __builtin_memcpy(&y, base + at + o + 32, 32);
          a0 += x;
          a1 += y;
        }
    }
    int64_t t = 0;
    for (int i = 0; i < 8; ++i) t += a0[i] + a1[i];
    total += t;
  });
  return total;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention_decode", &paged_attention_decode, py::call_guard<py::gil_scoped_release>());
  m.def("read_kv", &read_kv, py::call_guard<py::gil_scoped_release>());
}
"""


def build(ref: str | None, isa: str):
    """The decode kernel's files of git `ref` (None: the working tree) with the
    binding, built with the flags of `isa` (bench/kernel_sources.load_staged)."""
    files = {}
    for name in FILES:
        data = kernel_file(ref, name)
        if data is None and name == "kv_half.h":  # before half caches: unused
            continue
        if data is None:
            raise FileNotFoundError(f"kernels/cpu/{name} is not in {ref}")
        files[name] = data
    files["bind.cpp"] = _BIND.encode()
    # The binding's (the working tree's) declarations, whatever `ref` the kernel is from.
    files["kernel_api.h"] = kernel_file(None, "kernel_api.h")
    return load_staged(f"pagoda_dattn_{isa}", files, ["bind.cpp", FILES[0]], isa_flags(isa))


def mixed_lens(num_seqs: int) -> list[int]:
    """Context lengths of the `mixed` decode step that runs `num_seqs` sequences (or
    the last step that runs at least that many, cut to `num_seqs`)."""
    reqs = make_workload("mixed").requests
    for step in range(max(r.max_tokens for r in reqs), 0, -1):
        running = [len(r.prompt_token_ids) + step for r in reqs if r.max_tokens > step]
        if len(running) >= num_seqs:
            return running[:num_seqs]
    raise ValueError(f"mixed never runs {num_seqs} sequences")


def step_inputs(lens: list[int], dtype: torch.dtype, gen: torch.Generator, cache_dtype=None):
    """One decode step's tensors over 30 layers' caches (KV in huge pages), the
    caches in `cache_dtype` (default: the query's)."""
    query_dtype, dtype = dtype, cache_dtype or dtype
    seqs = len(lens)
    width = max(-(-n // BLOCK) for n in lens)
    pool = 2 * seqs * width  # blocks per layer: twice what the sequences hold, scattered
    per = pool * BLOCK * KV_HEADS * DIM
    elem = torch.finfo(dtype).bits // 8
    region = huge_page_mapping(per * 2 * LAYERS * elem)
    if region is None:
        flat = torch.empty(per * 2 * LAYERS, dtype=dtype)
    else:
        flat = torch.frombuffer(region, dtype=dtype)[: per * 2 * LAYERS]
    caches = flat.normal_(generator=gen).view(LAYERS, 2, pool, BLOCK, KV_HEADS, DIM)
    tables = torch.randperm(pool, generator=gen)[: seqs * width].int().view(seqs, width)
    # The engine's query is a view of the fused QKV rows.
    qkv = torch.randn(seqs, (HEADS + 2 * KV_HEADS) * DIM, generator=gen).to(query_dtype)
    query = qkv[:, : HEADS * DIM].view(seqs, HEADS, DIM)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    rows = torch.arange(seqs, dtype=torch.int64)
    kv_bytes = sum(lens) * KV_HEADS * DIM * elem * 2 * LAYERS
    return region, caches, tables, query, lens_t, rows, kv_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="main", help="git ref of the old kernel")
    parser.add_argument("--seqs", type=int, nargs="+", default=[1, 16, 36, 64])
    parser.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    parser.add_argument(
        "--cache", choices=["same", "bf16", "f16"], default="same", help="the caches' dtype"
    )
    parser.add_argument("--isa", choices=["native", "avx2"], default="native")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--clock",
        choices=["wall", "thread", "process"],
        default="wall",
        help="thread: the caller's CPU time (with --threads 1 on a loaded host); process: "
        "all threads' CPU time (with OMP_WAIT_POLICY=passive, so waiting is not counted)",
    )
    parser.add_argument("--hot", action="store_true", help="every layer reads layer 0's cache")
    args = parser.parse_args()
    clock = {"wall": time.perf_counter, "thread": time.thread_time, "process": time.process_time}[
        args.clock
    ]
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    old = build(args.old, args.isa)
    new = build(None, args.isa)
    gen = torch.Generator().manual_seed(0)
    print(
        f"load {os.getloadavg()[0]:.2f}, threads {args.threads}, {args.dtype} over a "
        f"{args.cache} cache, isa {args.isa}, "
        f"clock {args.clock}{', KV hot' if args.hot else ''}, "
        f"old {args.old} vs working tree; per step = {LAYERS} layers"
    )
    for seqs in args.seqs:
        print(measure(seqs, args, clock, dtype, {"old": old, "new": new}, gen))


def measure(seqs: int, args, clock, dtype: torch.dtype, builds: dict, gen) -> str:
    """One line: old and new at `seqs` sequences, and the plain read of their KV."""
    lens = mixed_lens(seqs)
    cache_dtype = {"same": None, "bf16": torch.bfloat16, "f16": torch.float16}[args.cache]
    region, caches, tables, query, lens_t, rows, kv_bytes = step_inputs(
        lens, dtype, gen, cache_dtype
    )
    if args.hot:
        caches = caches[:1].expand(LAYERS, *caches.shape[1:])
    outs = {m: torch.empty(seqs, HEADS, DIM, dtype=dtype) for m in builds}

    def step(module, out):
        for layer in caches:
            module.paged_attention_decode(
                query, layer[0], layer[1], tables, lens_t, rows, out, 0.125, 0, 0, None, None
            )

    for which, module in builds.items():
        step(module, outs[which])
    diff = (outs["old"].float() - outs["new"].float()).abs().max().item()
    times: dict[str, list[float]] = {"old": [], "new": [], "read": []}
    for rep in range(args.reps):
        order = list(builds.items())
        for which, module in order if rep % 2 else order[::-1]:
            start = clock()
            step(module, outs[which])
            times[which].append(clock() - start)
        start = clock()
        for layer in caches:
            builds["old"].read_kv(layer[0], layer[1], tables, lens_t)
        times["read"].append(clock() - start)
    del region  # the caches view it until they go
    best = {k: min(v) for k, v in times.items()}
    cells = [
        f"{k} {best[k] * 1e3:6.3f} / {statistics.median(times[k]) * 1e3:6.3f} ms "
        f"({kv_bytes / best[k] / 1e9:5.1f} GB/s, {100 * best['read'] / best[k]:3.0f}%)"
        for k in ("old", "new")
    ]
    return (
        f"{seqs:3d} seqs, {min(lens)}-{max(lens)} tokens, {kv_bytes / 1e6:6.1f} MB KV: "
        + " | ".join(cells)
        + f" | new/old {best['new'] / best['old']:.3f} | read {best['read'] * 1e3:6.3f} ms "
        f"({kv_bytes / best['read'] / 1e9:5.1f} GB/s) | max|old-new| {diff:.3g}"
    )


if __name__ == "__main__":
    main()
