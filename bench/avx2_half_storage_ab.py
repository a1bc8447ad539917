"""Half weight storage on/off (PAGODA_CPU_HALF_WEIGHTS) in one process, whole
engine, as on a CPU without fast bf16 (float32 compute):

    PAGODA_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python -m bench.avx2_half_storage_ab /work/models/smollm2-135m-random [--rounds 5]

On an AVX2-only machine drop the three variables. Two engines on the same bf16
checkpoint, one keeping its linear weights in bf16 (gemm_half_f32.cpp), one
widening them to float32 at load (oneDNN's float32 linear), run the same three
workloads in alternating rounds: one stream decoding (concurrency 1), 32
streams decoding, and a prefill of 4 x 256 tokens. It prints per workload the
median time of each engine (CPU time of the process with --clock cpu, the
default: a loaded machine's preemption is not charged; wall on a quiet one),
and checks both engines gave the same tokens. The engines run --threads
compute threads (the engine's own default is every core); with --threads 1,
`--clock thread` (the calling thread's CPU time, where the offline engine
steps) leaves out other threads' spinning. `half-gemm` (with --gemv-ab) is
the half engine with the 1-8 row GEMV (gemv_f32.cpp) off: every row count
through gemm_half_f32.cpp, as before it. `half-copy` (with --copy-ab):
PAGODA_CPU_HALF_WEIGHTS=copy, more than 8 rows through oneDNN's float32 copy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from shared.logging import get_logger
from worker import LLM, SamplingParams

logger = get_logger(__name__)


def engine(path: str, half: str, threads: int) -> LLM:
    from worker.layers import cpu_half_f32

    os.environ["PAGODA_CPU_HALF_WEIGHTS"] = half
    cpu_half_f32._kernels.cache_clear()
    return LLM(
        path,
        dtype="auto",
        max_model_len=512,
        num_kv_blocks=2048,
        block_size=16,
        cpu_threads=threads,
    )


def gemv_switch(on: bool) -> None:
    """The half engines' GEMV on or off (read at every call, so per round)."""
    from worker.layers import cpu_half_f32

    cpu_half_f32._gemv_kernels = _GEMV if on else (lambda: None)


_GEMV = None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", default="cpu", choices=["cpu", "wall", "thread"])
    parser.add_argument(
        "--gemv-ab", action="store_true", help="also the half engine without the GEMV"
    )
    parser.add_argument(
        "--copy-ab", action="store_true", help="also half storage with float32 copies (copy)"
    )
    parser.add_argument("--workloads", default="decode c=1,decode c=32,prefill 4x256")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = {"cpu": time.process_time, "wall": time.perf_counter, "thread": time.thread_time}[
        args.clock
    ]
    global _GEMV
    from worker.layers import cpu_half_f32

    _GEMV = cpu_half_f32._gemv_kernels
    half = engine(args.model, "1", args.threads)
    engines = {"half": half, "float32": engine(args.model, "0", args.threads)}
    gemv_on = {"half": True, "float32": True}
    if args.gemv_ab:
        engines["half-gemm"], gemv_on["half-gemm"] = half, False
    if args.copy_ab:
        engines["half-copy"], gemv_on["half-copy"] = engine(args.model, "copy", args.threads), True
    for name, llm in engines.items():
        runner = llm.engine.core.runner
        print(f"{name}: weights {runner.weights_bytes / 2**20:.1f} MiB as stored")
    gen = torch.Generator().manual_seed(0)

    def prompts(n, length):
        return [torch.randint(100, 40000, (length,), generator=gen).tolist() for _ in range(n)]

    workloads = {  # name: (prompts, sampling, tokens counted)
        "decode c=1": (
            prompts(1, 16),
            SamplingParams(temperature=0, max_tokens=64, ignore_eos=True),
            64,
        ),
        "decode c=4": (
            prompts(4, 16),
            SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
            128,
        ),
        "decode c=8": (
            prompts(8, 16),
            SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
            256,
        ),
        "decode c=32": (
            prompts(32, 16),
            SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
            512,
        ),
        "prefill 4x256": (
            prompts(4, 256),
            SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
            1024,
        ),
    }
    print(f"threads {args.threads} clock {args.clock} load {os.getloadavg()}")
    for wname in args.workloads.split(","):
        ps, sampling, count = workloads[wname]
        times: dict[str, list[float]] = {e: [] for e in engines}
        tokens: dict[str, list] = {}
        for _ in range(args.rounds):
            for ename, llm in engines.items():
                gemv_switch(gemv_on[ename])
                start = clock()
                out = llm.generate(ps, sampling, detokenize=False)
                times[ename].append(clock() - start)
                tokens[ename] = [o.outputs[0].token_ids for o in out]
        med = {e: statistics.median(t) for e, t in times.items()}
        same = all(t == tokens["float32"] for t in tokens.values())
        cells = "  ".join(
            f"{e} {m * 1e3:8.1f} ms ({m / med['float32']:.2f}, {count / m:.1f} tok/s)"
            for e, m in med.items()
        )
        print(f"{wname:14s} {cells}  same tokens: {same}")
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
