"""Two builds of the AVX2 module's float32 prefill attention, alternately in one process.

    PYTHONPATH=. python bench/results/avx2-emulated/attn_ab.py OLD.so NEW.so

Both .so files are pagoda_cpu_kernels_avx2 builds (~/.cache/pagoda/kernels/*/);
one thread, its CPU time, best of 4 rounds; SmolLM2 heads (9, 3 KV, head_dim 64),
8-token blocks, two prompts per call (n and n / 2 + 1 tokens).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import time

import torch

from tests.kernels.test_cpu_paged_attention_prefill import _paged_batch

NAME = "pagoda_cpu_kernels_avx2"


def load(path: str):
    loader = importlib.machinery.ExtensionFileLoader(NAME, path)
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules.pop(NAME, None)  # so the second build loads as its own module
    return module


def seconds(kernels, args, reps: int) -> float:
    kernels.paged_attention_prefill(*args)
    start = time.thread_time()
    for _ in range(reps):
        kernels.paged_attention_prefill(*args)
    return (time.thread_time() - start) / reps


def main() -> None:
    torch.set_num_threads(1)
    builds = {"old": load(sys.argv[1]), "new": load(sys.argv[2])}
    for n, window in ((1024, 0), (128, 0), (40, 0), (300, 37)):
        lens = [n, n // 2 + 1]
        q, kc, vc, bt, ranges = _paged_batch(lens, lens, 9, 3, 64, 8, dtype=torch.float32)
        outs = {name: torch.zeros(q.shape) for name in builds}
        common = (torch.tensor(lens, dtype=torch.int32), torch.tensor(ranges, dtype=torch.int64))
        reps = max(1, 2_000_000 // (n * n))
        best = dict.fromkeys(builds, float("inf"))
        for _ in range(4):
            for name, kernels in builds.items():
                args = (q, kc, vc, bt, *common, outs[name], 0.125, window)
                best[name] = min(best[name], seconds(kernels, args, reps))
        print(
            f"n={n} window={window}: old {best['old'] * 1e3:.2f} ms, new {best['new'] * 1e3:.2f} ms, "
            f"new/old {best['new'] / best['old']:.2f}, "
            f"bit-identical: {torch.equal(outs['old'], outs['new'])}",
            flush=True,
        )


if __name__ == "__main__":
    main()
