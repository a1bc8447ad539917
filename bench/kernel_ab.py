"""A/B two versions of the CPU kernels in one process, calls interleaved.

    python -m bench.kernel_ab OLD_DIR NEW_DIR {linear,linear-prefill,decode,decode-cold,prefill,prefill-f32,cascade,cascade-f32} [--reps N]

`linear-prefill` is one layer's four linears at 4096 rows (a prefill step's).
OLD_DIR and NEW_DIR each hold a copy of kernels/cpu (e.g. `git show HEAD:...` into
one, the working tree's files into the other). Both are built as separately named
extensions and called alternately on the same inputs, so a host whose speed drifts
by 15% between processes (both machines of issue 5 did) drifts for both alike. It
prints the largest difference of their outputs, then best and median times of
each and NEW/OLD. The shapes are SmolLM2-135M's (hidden 576, 9/3 heads of 64,
blocks of 8): one layer's linears or decode attention at 32 sequences (96 tokens
each), a 4 x 1024-token prefill (bf16 caches; `prefill-f32`: float32 ones, as on
an AVX2 CPU), or 32 decode rows over a 512-token shared prefix (`cascade-f32`:
float32 caches).
One layer's data stays in cache between calls, so a change whose gain is in
streaming weights or KV from DRAM needs a cold-cache benchmark instead:
`decode-cold` is decode attention over 30 layers' caches in one step (32
sequences of 32-160 tokens, 71 MB of KV in 2 MiB pages, as the engine keeps it),
which is what a decode step does to the caches; the times are for all 30 layers.
Both builds take PAGODA_CPU_ISA's flags: under bench/avx2_env.sh they are the AVX2
builds (e.g. `prefill-f32` as an AVX2-only CPU runs it).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from bench.kernel_sources import load_staged
from kernels.cpu import _SOURCES, isa_flags


def build(folder: Path, name: str):
    # PAGODA_CPU_ISA's flags: under bench/avx2_env.sh, the AVX2 build.
    files = {path.name: path.read_bytes() for path in sorted(folder.glob("*.[ch]*"))}
    return load_staged(name, files, [s.name for s in _SOURCES], isa_flags())


def case(kind: str):
    """(call(module) -> output tensor) for one kernel on fixed random inputs."""
    gen = torch.Generator().manual_seed(0)
    bf16 = torch.bfloat16
    heads, kv_heads, dim, block = 9, 3, 64, 8
    if kind == "linear-prefill":  # one layer's four linears at 4096 rows
        return linear_prefill(gen)
    if kind == "linear":  # gate/up + SiLU, then down, at 32 rows
        x = torch.randn(32, 576, generator=gen).to(bf16)
        gate_up = torch.randn(3072, 576, generator=gen).to(bf16)
        down = torch.randn(576, 1536, generator=gen).to(bf16)
        packed: dict[int, tuple] = {}

        def linear(k):
            if id(k) not in packed:
                packed[id(k)] = (k.pack_bf16_panels(gate_up), k.pack_bf16_panels(down))
            up, dn = packed[id(k)]
            return k.bf16_panel_linear(k.bf16_panel_linear_silu(x, up, None), dn, None)

        return linear
    if kind == "decode-cold":
        return decode_cold(gen)
    dtype = torch.float32 if kind.endswith("-f32") else bf16
    kind = kind.removesuffix("-f32")
    seqs, length, new = {"decode": (32, 96, 1), "prefill": (4, 1024, 1024)}.get(kind, (32, 512, 1))
    num_blocks = seqs * (-(-length // block)) + 4
    k_cache = torch.randn(num_blocks, block, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block, kv_heads, dim, generator=gen).to(dtype)
    tables = torch.randperm(num_blocks, generator=gen)[: num_blocks - 4].int().view(seqs, -1)
    query = torch.randn(seqs * new, heads, dim, generator=gen).to(dtype)
    lens = torch.full((seqs,), length, dtype=torch.int32)
    rows = torch.arange(seqs, dtype=torch.int64)
    out = torch.empty_like(query)
    if kind == "decode":
        return lambda k: (
            k.paged_attention_decode(
                query, k_cache, v_cache, tables, lens, rows, out, 0.125, 0, 0, None, None
            ),
            out,
        )[1]
    if kind == "prefill":
        ranges = torch.tensor([[i * new, (i + 1) * new] for i in range(seqs)], dtype=torch.int64)
        return lambda k: (
            k.paged_attention_prefill(query, k_cache, v_cache, tables, lens, ranges, out, 0.125, 0),
            out,
        )[1]
    prefix_out = torch.empty(kv_heads, seqs * heads // kv_heads, dim)
    prefix_lse = torch.empty(kv_heads, seqs * heads // kv_heads)
    return lambda k: (
        k.attention_over_prefix(
            query, k_cache, v_cache, tables[0], length, rows, prefix_out, prefix_lse, 0.125
        ),
        prefix_out,
    )[1]


def linear_prefill(gen: torch.Generator, rows: int = 4096):
    """qkv, o, gate/up + SiLU and down of one SmolLM2 layer at a prefill step's rows."""
    bf16 = torch.bfloat16
    weights = {  # [out, in]
        "qkv": torch.randn(960, 576, generator=gen).to(bf16),
        "o": torch.randn(576, 576, generator=gen).to(bf16),
        "gate_up": torch.randn(3072, 576, generator=gen).to(bf16),
        "down": torch.randn(576, 1536, generator=gen).to(bf16),
    }
    x = torch.randn(rows, 576, generator=gen).to(bf16)
    h = torch.randn(rows, 1536, generator=gen).to(bf16)
    packed: dict[int, dict] = {}

    def layer(k):
        if id(k) not in packed:
            packed[id(k)] = {n: k.pack_bf16_panels(w) for n, w in weights.items()}
        p = packed[id(k)]
        outs = [
            k.bf16_panel_linear(x, p["qkv"], None),
            k.bf16_panel_linear(x, p["o"], None),
            k.bf16_panel_linear_silu(x, p["gate_up"], None),
            k.bf16_panel_linear(h, p["down"], None),
        ]
        return torch.cat([o.flatten() for o in outs])

    return layer


def decode_cold(gen: torch.Generator, layers: int = 30, seqs: int = 32):
    """Decode attention of one step through every layer, KV read from DRAM."""
    from worker.huge_pages import huge_page_mapping

    bf16, heads, kv_heads, dim, block = torch.bfloat16, 9, 3, 64, 8
    lens = torch.linspace(32, 160, seqs).round().int()[torch.randperm(seqs, generator=gen)]
    pool = seqs * 20 * 2  # blocks per layer: twice what the sequences hold, scattered
    per = pool * block * kv_heads * dim
    region = huge_page_mapping(per * 2 * 2 * layers)  # K and V of every layer, bf16
    if region is None:
        flat = torch.empty(per * 2 * layers, dtype=bf16)
    else:
        flat = torch.frombuffer(region, dtype=bf16)[: per * 2 * layers]
    caches = flat.normal_(generator=gen).view(layers, 2, pool, block, kv_heads, dim)
    tables = torch.randperm(pool, generator=gen)[: seqs * 20].int().view(seqs, 20)
    query = torch.randn(seqs, heads, dim, generator=gen).to(bf16)
    rows = torch.arange(seqs, dtype=torch.int64)
    out = torch.empty_like(query)

    def step(k):
        for layer in caches:
            k.paged_attention_decode(
                query, layer[0], layer[1], tables, lens, rows, out, 0.125, 0, 0, None, None
            )
        return out

    step.keep_alive = region  # the tensors view the mapping
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument(
        "kind",
        choices=[
            "linear",
            "linear-prefill",
            "decode",
            "decode-cold",
            "prefill",
            "prefill-f32",
            "cascade-f32",
            "cascade",
        ],
    )
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    old, new = build(args.old, "pagoda_ab_old"), build(args.new, "pagoda_ab_new")
    call = case(args.kind)
    # A copy: both builds write the case's one output tensor, and .float() of a
    # float32 one is that tensor itself, so the -f32 cases compared it with itself.
    first = call(old).float().clone()
    diff = (first - call(new).float()).abs().max().item()
    print(f"max |old - new| = {diff}")
    times: dict[str, list[float]] = {"old": [], "new": []}
    for rep in range(args.reps):
        order = [("old", old), ("new", new)] if rep % 2 == 0 else [("new", new), ("old", old)]
        for name, module in order:
            start = time.perf_counter()
            call(module)
            times[name].append(time.perf_counter() - start)
    best = {n: min(t) for n, t in times.items()}
    median = {n: statistics.median(t) for n, t in times.items()}
    print(
        f"old best {best['old'] * 1e3:.3f} median {median['old'] * 1e3:.3f} ms | "
        f"new best {best['new'] * 1e3:.3f} median {median['new'] * 1e3:.3f} ms | "
        f"new/old best {best['new'] / best['old']:.3f} median {median['new'] / median['old']:.3f}"
    )


if __name__ == "__main__":
    main()
