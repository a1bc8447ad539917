"""rope_write_kv against the calls it replaces, one decode row of SmolLM2's shape.

    PYTHONPATH=$PWD python -m bench.rope_write_ab

The decode plan's fused call (RoPE on the QKV row in place, K and V into their
cache slot, the query view) against the module path's split, rotary_embedding,
three views and write_kv_cache: thread CPU us per layer on one thread, best and
median of 30 interleaved rounds of 3000 calls. The decode kernel after either is
the same and not timed.
"""

from __future__ import annotations

import os
import time

import torch

from kernels.cpu import load_cpu_kernels
from worker.layers.rotary import RopeSpec, RotaryEmbedding

H, KV, D = 9, 3, 64  # SmolLM2-135M's heads


def main() -> int:
    torch.set_num_threads(1)
    k = load_cpu_kernels()
    rope = RotaryEmbedding(D, 8192, RopeSpec(theta=100000.0), torch.bfloat16)
    qkv = torch.randn(1, (H + 2 * KV) * D).to(torch.bfloat16)
    pos, slots = torch.tensor([300]), torch.tensor([1234])
    cache = torch.randn(2, 2000, 8, KV, D).to(torch.bfloat16)
    kc, vc = cache[0], cache[1]
    sizes = [H * D, KV * D, KV * D]

    def separate():
        q, key, v = qkv.split_with_sizes(sizes, dim=-1)
        k.rotary_embedding(q, key, pos, rope.cos_cache, rope.sin_cache, D)
        q.view(1, H, D)
        k.write_kv_cache(key.view(1, KV, D), v.view(1, KV, D), kc, vc, slots)

    def fused():
        k.rope_write_kv(qkv, pos, rope.cos_cache, rope.sin_cache, kc, vc, slots, H, KV, D)
        qkv.as_strided((1, H, D), (qkv.stride(0), D, 1))

    variants = {"separate": separate, "fused": fused}
    results: dict[str, list[float]] = {n: [] for n in variants}
    for rep in range(30):
        for name in list(variants) if rep % 2 else list(variants)[::-1]:
            start = time.thread_time()
            for _ in range(3000):
                variants[name]()
            results[name].append((time.thread_time() - start) / 3000 * 1e6)
    print(f"load average {os.getloadavg()[0]:.2f}; thread CPU us per layer (best, median):")
    for name, times in results.items():
        print(f"  {name:>8}: {min(times):.2f}  {sorted(times)[len(times) // 2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
